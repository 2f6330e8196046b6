package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// newApp opens an app on the SQLite file at path, keys and ledger in one file.
func newApp(t *testing.T, path string) *payments.App {
	t.Helper()
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	payco, err := payments.NewPayCo(ctx, store.DB())
	if err != nil {
		t.Fatal(err)
	}
	return &payments.App{PayCo: payco, Idempotency: &testserver.Middleware{Store: store}}
}

func tempApp(t *testing.T) *payments.App {
	return newApp(t, filepath.Join(t.TempDir(), "server.db"))
}

func post(h http.Handler, key, contentType, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func get(t *testing.T, h http.Handler, path string, v any) int {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, w.Code, w.Body, err)
	}
	return w.Code
}

func decode(t *testing.T, w *httptest.ResponseRecorder) payments.Charge {
	t.Helper()
	if w.Code != 201 {
		t.Fatalf("charge answered %d %q; want 201", w.Code, w.Body)
	}
	var c payments.Charge
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func stats(t *testing.T, h http.Handler) payments.Stats {
	t.Helper()
	var s payments.Stats
	if code := get(t, h, "/v1/stats", &s); code != 200 {
		t.Fatalf("stats: %d", code)
	}
	return s
}

const invalidCharge = "https://github.com/idemkit/idem/blob/main/testserver/README.md#invalid-charge"

const jsonBody = `{"amount": 1000, "currency": "USD", "order_id": "o-1"}`

func TestChargeForms(t *testing.T) {
	h := tempApp(t).Handler()
	for i, c := range []struct{ ct, body string }{
		{"application/json", `{"amount": 1000, "currency": "usd", "order_id": "o-0"}`},
		{"application/json; charset=utf-8", `{"amount": 1000, "currency": "USD", "metadata": {"order_id": "o-1"}}`},
		{"application/x-www-form-urlencoded", "amount=1000&currency=usd&order_id=o-2"},
		{"application/x-www-form-urlencoded", "amount=1000&currency=usd&metadata%5Border_id%5D=o-3"},
		{"application/json", "{\"amount\": 1000, \"currency\": \"usd\", \"order_id\": \"o-4\"}\r\n \t"}, // white space after the object
	} {
		w := post(h, fmt.Sprint("k", i), c.ct, c.body)
		ch := decode(t, w)
		want := payments.Charge{ID: ch.ID, Amount: 1000, Currency: "usd", OrderID: fmt.Sprint("o-", i)}
		if ch != want || !strings.HasPrefix(ch.ID, "ch_") || w.Header().Get("Location") != "/v1/charges/"+ch.ID {
			t.Fatalf("%s %s: %+v, Location %q; want %+v", c.ct, c.body, ch, w.Header().Get("Location"), want)
		}
		var got payments.Charge
		if code := get(t, h, "/v1/charges/"+ch.ID, &got); code != 200 || got != ch {
			t.Fatalf("GET charge: %d %+v; want %+v", code, got, ch)
		}
		var order struct {
			OrderID string            `json:"order_id"`
			Charges []payments.Charge `json:"charges"`
		}
		if code := get(t, h, "/v1/orders/"+ch.OrderID, &order); code != 200 || order.OrderID != ch.OrderID || len(order.Charges) != 1 || order.Charges[0] != ch {
			t.Fatalf("GET order: %d %+v; want the one charge", code, order)
		}
	}
	var p testserver.Problem
	if code := get(t, h, "/v1/charges/ch_missing", &p); code != 404 || p.Status != 404 || p.Detail == "" {
		t.Fatalf("unknown charge: %d %+v; want a 404 problem", code, p)
	}
	var order struct{ Charges []payments.Charge }
	if code := get(t, h, "/v1/orders/never", &order); code != 200 || order.Charges == nil || len(order.Charges) != 0 {
		t.Fatalf("order never charged: %d %+v; want 200 with an empty list", code, order)
	}
}

func TestValidation(t *testing.T) {
	h := tempApp(t).Handler()
	for _, c := range []struct {
		name, ct, body string
		status         int
		detail         string
	}{
		{"no amount", "application/json", `{"currency": "usd", "order_id": "o"}`, 400, "amount"},
		{"zero amount", "application/json", `{"amount": 0, "currency": "usd", "order_id": "o"}`, 400, "amount"},
		{"fractional amount", "application/json", `{"amount": 10.5, "currency": "usd", "order_id": "o"}`, 400, "amount"},
		{"amount as text", "application/json", `{"amount": "ten", "currency": "usd", "order_id": "o"}`, 400, "JSON"},
		{"bad currency", "application/x-www-form-urlencoded", "amount=1&currency=dollars&order_id=o", 400, "currency"},
		{"no order", "application/x-www-form-urlencoded", "amount=1&currency=usd", 400, "order_id"},
		{"order with space", "application/json", `{"amount": 1, "currency": "usd", "order_id": "o 1"}`, 400, "order_id"},
		{"malformed JSON", "application/json", `{"amount": 1,`, 400, "JSON"},
		{"text after the JSON", "application/json", `{"amount": 1, "currency": "usd", "order_id": "o"}x`, 400, "JSON"},
		{"two JSON objects", "application/json", `{"amount": 1, "currency": "usd", "order_id": "o"}{"amount": 2}`, 400, "JSON"},
		{"malformed form", "application/x-www-form-urlencoded", "amount=%zz", 400, "form"},
		{"text", "text/plain", "amount=1", 415, "application/json"},
	} {
		w := post(h, "key-"+c.name, c.ct, c.body)
		var p testserver.Problem
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != c.status || w.Header().Get("Content-Type") != "application/problem+json" || p.Status != c.status || !strings.Contains(p.Detail, c.detail) ||
			c.status == 400 && p.Type != invalidCharge {
			t.Errorf("%s: %d %q; want a %d problem about %s", c.name, w.Code, w.Body, c.status, c.detail)
		}
	}
	if s := stats(t, h); s.Charges != 0 {
		t.Fatalf("invalid requests reached PayCo: %+v", s)
	}
}

func TestReplayAndStats(t *testing.T) {
	h := tempApp(t).Handler()
	first := post(h, "k", "application/json", jsonBody)
	again := post(h, "k", "application/json", `{"order_id":"o-1","currency":"USD","amount":1000}`)
	if decode(t, again) != decode(t, first) || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %q; want %q replayed", again.Body, first.Body)
	}
	want := payments.Stats{Charges: 1, PerOrder: map[string]int{"o-1": 1}, Settled: 1}
	if s := stats(t, h); !reflect.DeepEqual(s, want) {
		t.Fatalf("stats %+v; want %+v", s, want)
	}
}

// Two keys for one order reach PayCo twice (the stats show it), but
// PayCo's dedup on charge:<order_id> makes one charge; without dedup, two.
func TestDownstreamDedup(t *testing.T) {
	for _, noDedup := range []bool{false, true} {
		app := tempApp(t)
		app.PayCo.NoDedup = noDedup
		h := app.Handler()
		a := decode(t, post(h, "key-a", "application/json", jsonBody))
		b := decode(t, post(h, "key-b", "application/json", jsonBody))
		s := stats(t, h)
		if s.Charges != 2 || s.DoubleCharged != 1 || s.PerOrder["o-1"] != 2 {
			t.Errorf("noDedup=%v: stats %+v; want 2 calls for o-1, counted double", noDedup, s)
		}
		if !noDedup && (a != b || s.Settled != 1 || s.SettledDoubleCharged != 0) {
			t.Errorf("dedup: charges %v and %v, stats %+v; want one charge", a, b, s)
		}
		if noDedup && (a.ID == b.ID || s.Settled != 2 || s.SettledDoubleCharged != 1) {
			t.Errorf("no dedup: charges %v and %v, stats %+v; want two charges", a, b, s)
		}
	}
	app := tempApp(t)
	h := app.Handler()
	decode(t, post(h, "key-a", "application/json", jsonBody))
	w := post(h, "key-b", "application/json", `{"amount": 999, "currency": "usd", "order_id": "o-1"}`)
	if w.Code != 422 || !strings.Contains(w.Body.String(), "order-charged") {
		t.Fatalf("order charged again with another amount: %d %q; want 422 order-charged", w.Code, w.Body)
	}
}

// The order-charged problem names the order's path, and a GET of that
// path finds the order, whatever its id: "." and ".." too, which a path
// cleaned of dot segments would lose.
func TestOrderChargedNamesTheOrder(t *testing.T) {
	h := tempApp(t).Handler()
	for i, id := range []string{"o-1", "a/b", "a%2F..", ".", "..", "x/.."} {
		body := func(amount int) string {
			return fmt.Sprintf(`{"amount": %d, "currency": "usd", "order_id": %q}`, amount, id)
		}
		first := decode(t, post(h, fmt.Sprint("first-", i), "application/json", body(1000)))
		w := post(h, fmt.Sprint("second-", i), "application/json", body(999))
		var p testserver.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != 422 || !strings.HasSuffix(p.Type, "#order-charged") {
			t.Fatalf("order %q charged again with another amount: %d %q; want 422 order-charged", id, w.Code, w.Body)
		}
		_, path, ok := strings.Cut(p.Detail, "look it up at ")
		path = strings.TrimSuffix(path, ".")
		if !ok || !strings.HasPrefix(path, "/v1/orders/") {
			t.Fatalf("order %q: detail %q names no path of the order", id, p.Detail)
		}
		var order struct {
			OrderID string            `json:"order_id"`
			Charges []payments.Charge `json:"charges"`
		}
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if err := json.Unmarshal(w.Body.Bytes(), &order); err != nil || w.Code != 200 || order.OrderID != id || len(order.Charges) != 1 || order.Charges[0] != first {
			t.Errorf("order %q: GET %s: %d %q; want the order with its charge %v", id, path, w.Code, w.Body, first)
		}
	}
}

func TestUnprotected(t *testing.T) {
	app := tempApp(t)
	app.Idempotency = nil
	h := app.Handler()
	post(h, "k", "application/json", jsonBody)
	post(h, "k", "application/json", jsonBody)
	if s := stats(t, h); s.Charges != 2 || s.DoubleCharged != 1 {
		t.Fatalf("without the middleware: %+v; want the same key charged twice", s)
	}
}

func TestFailAfterCharge(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		app := tempApp(t)
		app.Idempotency.OnError = policy
		var failed atomic.Bool
		app.Faults.FailAfterCharge = func(string) bool { return !failed.Swap(true) }
		h := app.Handler()
		first := post(h, "k", "application/json", jsonBody)
		if first.Code != 500 {
			t.Fatalf("%v: first answer %d; want the injected 500", policy, first.Code)
		}
		wantNextStep(t, policy, first.Body.String(), "o-1")
		retry := post(h, "k", "application/json", jsonBody)
		s := stats(t, h)
		switch policy {
		case testserver.ReleaseClaim: // the retry runs again; PayCo's key keeps one charge
			if retry.Code != 201 || s.Charges != 2 || s.Settled != 1 {
				t.Errorf("release: retry %d, stats %+v; want 201, two calls, one charge", retry.Code, s)
			}
		case testserver.SaveError: // the retry replays the 500
			if retry.Code != 500 || retry.Header().Get("Idempotent-Replayed") != "true" || s.Charges != 1 {
				t.Errorf("save: retry %d, stats %+v; want the 500 replayed, one call", retry.Code, s)
			}
		}
	}
}

// wantNextStep checks the detail of a failed charge's answer, body, for
// the order orderID: under ReleaseClaim it says to retry with the same key,
// which runs the charge again; under SaveError the answer is saved and a
// retry gets it replayed, so it says so and names where to look the order
// up instead.
func wantNextStep(t *testing.T, policy testserver.ErrorPolicy, body, orderID string) {
	t.Helper()
	const same = "with the same Idempotency-Key"
	switch policy {
	case testserver.ReleaseClaim:
		if !strings.Contains(body, same) {
			t.Errorf("release: %s; want it to say to retry %s", body, same)
		}
	case testserver.SaveError:
		if strings.Contains(body, same) || !strings.Contains(body, "/v1/orders/"+orderID) || !strings.Contains(body, "saved") {
			t.Errorf("save: %s; want it to say the answer is saved, and to look the order up at /v1/orders/%s, not to retry %s", body, orderID, same)
		}
	}
}

// A charge that PayCo failed answers 502 payco-failed, whose detail says
// what its caller does next under the Middleware's OnError.
func TestPayCoFailedNextStep(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		app := &payments.App{PayCo: closedLedger(t), Idempotency: &testserver.Middleware{Store: &testserver.MemoryStore{}, OnError: policy}}
		w := post(app.Handler(), "k", "application/json", jsonBody)
		if w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "payco-failed") {
			t.Fatalf("%v: %d %s; want 502 payco-failed", policy, w.Code, w.Body)
		}
		wantNextStep(t, policy, w.Body.String(), "o-1")
	}
}

// The Charged hook runs while the key is in flight: a retry then is a 409.
func TestChargedHook(t *testing.T) {
	app := tempApp(t)
	charged, resume := make(chan payments.Charge), make(chan struct{})
	app.Faults.Charged = func(c payments.Charge) {
		charged <- c
		<-resume
	}
	h := app.Handler()
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(h, "k", "application/json", jsonBody) }()
	c := <-charged
	if w := post(h, "k", "application/json", jsonBody); w.Code != 409 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("retry while in flight: %d; want 409 with Retry-After", w.Code)
	}
	close(resume)
	if got := decode(t, <-done); got != c {
		t.Fatalf("answer %+v; want the charge the hook saw, %+v", got, c)
	}
}

// A delayed handler is not cut off by its caller hanging up; it ends with
// the lease (the handler's context), and its answer is saved and replayed.
func TestDelayEndsWithTheLease(t *testing.T) {
	app := tempApp(t)
	app.Idempotency.LockTimeout = 200 * time.Millisecond
	app.Faults.Delay = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	app.Faults.Charged = func(payments.Charge) { cancel() }
	h := app.Handler()
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(jsonBody)).WithContext(ctx)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	app.Faults.Charged = nil
	if w := post(h, "k", "application/json", jsonBody); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d; want the saved answer", w.Code)
	}
}

// Two server processes on one database share the keys and the ledger.
func TestSharedDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.db")
	one, two := newApp(t, path).Handler(), newApp(t, path).Handler()
	first := decode(t, post(one, "k", "application/json", jsonBody))
	replay := post(two, "k", "application/json", jsonBody)
	if decode(t, replay) != first || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second server: %q; want the first server's charge replayed", replay.Body)
	}
	if s := stats(t, two); s.Charges != 1 || s.Settled != 1 {
		t.Fatalf("second server's stats %+v; want the shared ledger's one charge", s)
	}
	three := newApp(t, path).Handler() // a restart
	if s := stats(t, three); s.Charges != 1 {
		t.Fatalf("after a restart: %+v; want the ledger kept", s)
	}
}

// closedLedger returns a PayCo whose database is closed: each of its calls
// fails.
func closedLedger(t *testing.T) *payments.PayCo {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "server.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	payco, err := payments.NewPayCo(ctx, store.DB())
	if err != nil {
		t.Fatal(err)
	}
	store.Close() // the ledger's database with it
	return payco
}

// TestLedgerErrorsAreLoggedNotSent checks that a failing ledger's error goes
// to App.Logger, and not to the client: a driver's error may name the
// database's file, host, user or schema.
func TestLedgerErrorsAreLoggedNotSent(t *testing.T) {
	var logged strings.Builder
	app := &payments.App{PayCo: closedLedger(t), Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	h := app.Handler()
	const closed = "database is closed"

	for _, tc := range []struct {
		name    string
		do      func() *httptest.ResponseRecorder
		status  int
		problem string
	}{
		{"charge", func() *httptest.ResponseRecorder {
			return post(h, "", "application/json", `{"amount":100,"currency":"eur","order_id":"o-1"}`)
		}, http.StatusBadGateway, "payco-failed"},
		{"stats", func() *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/stats", nil))
			return w
		}, http.StatusServiceUnavailable, "ledger-unavailable"},
		{"order", func() *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/orders/o-1", nil))
			return w
		}, http.StatusServiceUnavailable, "ledger-unavailable"},
	} {
		logged.Reset()
		w := tc.do()
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.problem) {
			t.Errorf("%s: %d %s; want %d %s", tc.name, w.Code, w.Body, tc.status, tc.problem)
		}
		if strings.Contains(w.Body.String(), closed) {
			t.Errorf("%s: the answer names the ledger's error: %s", tc.name, w.Body)
		}
		if !strings.Contains(logged.String(), closed) || !strings.Contains(logged.String(), "level=ERROR") {
			t.Errorf("%s: logged %q; want the ledger's error (%q) at level ERROR", tc.name, logged.String(), closed)
		}
	}
}

// A charge that failed at the ledger is logged with its order and, behind
// the Middleware, its Idempotency-Key: the client that reports its 502
// payco-failed names one of them, and a record with neither could not be
// told from the others.
func TestChargeFailedLogNamesOrderAndKey(t *testing.T) {
	var logged strings.Builder
	app := &payments.App{PayCo: closedLedger(t), Idempotency: &testserver.Middleware{Store: &testserver.MemoryStore{}},
		Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	w := post(app.Handler(), "k-42", "application/json", `{"amount":100,"currency":"eur","order_id":"o-42"}`)
	if w.Code != http.StatusBadGateway {
		t.Fatalf("charge on a closed ledger: %d %s; want 502", w.Code, w.Body)
	}
	if out := logged.String(); !strings.Contains(out, `msg="payments: charge failed"`) || !strings.Contains(out, "order_id=o-42") ||
		!strings.Contains(out, "key=k-42") {
		t.Fatalf("logged %q; want the charge's failure with order_id=o-42 and key=k-42", out)
	}
}

// failingBody fails every read with err.
type failingBody struct{ err error }

func (b failingBody) Read([]byte) (int, error) { return 0, b.err }
func (b failingBody) Close() error             { return nil }

// TestBodyErrorsAreLoggedNotSent: a charge whose body cannot be read, on
// an App that reads it itself (no Middleware), is answered 400 without the
// read's error, which goes to App.Logger: net/http's names the server's
// own address. A body over the limit is still said to be too large.
func TestBodyErrorsAreLoggedNotSent(t *testing.T) {
	app := tempApp(t)
	app.Idempotency = nil
	var logged strings.Builder
	app.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	h := app.Handler()

	readErr := &net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080},
		Addr: &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 51234}, Err: os.ErrDeadlineExceeded}
	r := httptest.NewRequest("POST", "/v1/charges", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Body = failingBody{readErr}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "invalid-charge") {
		t.Fatalf("%d %s; want 400 invalid-charge", w.Code, w.Body)
	}
	for _, leak := range []string{"10.1.2.3", "10.9.8.7", "i/o timeout"} {
		if strings.Contains(w.Body.String(), leak) {
			t.Errorf("the answer names %q: %s", leak, w.Body)
		}
	}
	if !strings.Contains(logged.String(), readErr.Error()) || !strings.Contains(logged.String(), "level=INFO") {
		t.Errorf("logged %q; want the read's error, %q, at level INFO (the client's fault)", logged.String(), readErr.Error())
	}

	w = post(h, "", "application/json", `{"amount":100,"currency":"eur","order_id":"`+strings.Repeat("x", 1<<20)+`"}`)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "larger than 1048576 bytes") {
		t.Errorf("a body over the limit: %d %s; want 400 saying it is larger than 1048576 bytes", w.Code, w.Body)
	}
}
