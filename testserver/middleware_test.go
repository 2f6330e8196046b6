package testserver_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// backends are the stores every middleware test runs on.
var backends = []struct {
	name string
	open func(t *testing.T) testserver.Store
}{
	{"memory", func(*testing.T) testserver.Store { return new(testserver.MemoryStore) }},
	{"sqlite", func(t *testing.T) testserver.Store {
		s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "keys.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

func eachStore(t *testing.T, f func(t *testing.T, store testserver.Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.open(t)) })
	}
}

// clock is a settable time source for Middleware.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

// fenceAt returns the fence of a claim another worker took at t.
func fenceAt(t time.Time) testserver.Fence {
	return testserver.Fence{Token: t.UnixNano(), ClaimID: "another worker's"}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// charges is a handler that counts its runs and answers 201 with the run
// number, replayable and unreplayable headers.
type charges struct {
	runs atomic.Int64
	// hold, when set, is called inside the handler before it answers.
	hold func(run int64)
}

func (c *charges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	if c.hold != nil {
		c.hold(n)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", fmt.Sprintf("/v1/charges/ch_%d", n))
	h.Set("ETag", fmt.Sprintf(`"%d"`, n))
	h.Set("Set-Cookie", "session=secret")
	h.Set("X-Run", fmt.Sprint(n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"auth":%q,"request":%q}`, n, r.Header.Get("Authorization"), body)
}

// request builds a request; header is name, value pairs.
func request(method, path, body string, header ...string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// wantProblem checks an application/problem+json answer.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) testserver.Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d (%s); want %d", w.Code, w.Body, status)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q; want application/problem+json", ct)
	}
	var p testserver.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || len(p.Detail) < 20 {
		t.Fatalf("problem %+v; want type %s, status %d, a title and an actionable detail", p, typ, status)
	}
	return p
}

const chargeBody = `{"amount": 1000, "currency": "usd", "order_id": "o-1"}`

func TestDecisionTable(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		clk := newClock()
		h := &charges{}
		started, release := make(chan struct{}), make(chan struct{})
		h.hold = func(n int64) {
			if n == 2 { // the run on key "slow" waits for the test
				close(started)
				<-release
			}
		}
		mw := &testserver.Middleware{Store: store, Now: clk.Now}
		srv := mw.Wrap(h)

		// Row 1: no entry. The claim wins and the handler answers.
		first := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k1"))
		if first.Code != 201 || h.runs.Load() != 1 || first.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("first request: %d %q, runs %d; want the handler's 201, run once, not a replay", first.Code, first.Body, h.runs.Load())
		}
		if first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Run") != "1" {
			t.Errorf("first answer lost the handler's own headers: %v", first.Header())
		}

		// Row 3: done, same fingerprint (JSON reordered, quoted key): replay.
		same := `{ "order_id":"o-1","currency":"usd",  "amount":1000 }`
		replay := serve(srv, request("POST", "/v1/charges", same, "Idempotency-Key", `"k1"`))
		if replay.Code != 201 || !bytes.Equal(replay.Body.Bytes(), first.Body.Bytes()) || h.runs.Load() != 1 {
			t.Fatalf("replay: %d %q, runs %d; want 201 with the first body byte for byte, no run", replay.Code, replay.Body, h.runs.Load())
		}
		rh := replay.Header()
		if rh.Get("Idempotent-Replayed") != "true" || rh.Get("Location") != "/v1/charges/ch_1" || rh.Get("ETag") != `"1"` || rh.Get("Content-Type") != "application/json" {
			t.Errorf("replay headers %v; want Idempotent-Replayed, Location, ETag and Content-Type of the first", rh)
		}
		if rh.Get("Set-Cookie") != "" || rh.Get("X-Run") != "" {
			t.Errorf("replay carries headers outside the allow-list: %v", rh)
		}

		// Row 2: the key reused with another request: 422, nothing runs.
		// The detail names each part that differs, Content-Type included.
		form := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k1")
		form.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for name, r := range map[string]*http.Request{
			"body":         request("POST", "/v1/charges", `{"amount": 999, "currency": "usd", "order_id": "o-1"}`, "Idempotency-Key", "k1"),
			"path":         request("POST", "/v1/refunds", chargeBody, "Idempotency-Key", "k1"),
			"method":       request("PATCH", "/v1/charges", chargeBody, "Idempotency-Key", "k1"),
			"query":        request("POST", "/v1/charges?expand=customer", chargeBody, "Idempotency-Key", "k1"),
			"Content-Type": form,
		} {
			p := wantProblem(t, serve(srv, r), 422, testserver.ProblemMismatch)
			if p.Key != "k1" {
				t.Errorf("%s mismatch names key %q; want k1", name, p.Key)
			}
			if !strings.Contains(p.Detail, name) {
				t.Errorf("%s mismatch: detail %q does not name the %s", name, p.Detail, name)
			}
		}

		// Row 4: in flight, lock young: 409, Retry-After as long as the
		// claim has run (at least 1 s), at most the lease left. Its token,
		// and so its age, is up to 1 ms off the clock's whole seconds.
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "slow")) }()
		<-started
		for _, c := range []struct {
			advance time.Duration
			want    string
		}{{0, "1"}, {1500 * time.Millisecond, "2"}, {8 * time.Second, "10"}, {20500 * time.Millisecond, "30"}, {10 * time.Second, "20"}, {19 * time.Second, "1"}} {
			clk.Add(c.advance)
			w := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "slow"))
			wantProblem(t, w, 409, testserver.ProblemInFlight)
			if got := w.Header().Get("Retry-After"); got != c.want {
				t.Errorf("Retry-After %q after the clock moved %v more; want %s", got, c.advance, c.want)
			}
		}
		// An in-flight key with another body is still a mismatch.
		wantProblem(t, serve(srv, request("POST", "/v1/charges", `{}`, "Idempotency-Key", "slow")), 422, testserver.ProblemMismatch)

		// Row 5: in flight, lock stale: take over; the winner runs.
		clk.Add(time.Second)
		taken := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "slow"))
		if taken.Code != 201 || h.runs.Load() != 3 || taken.Header().Get("X-Run") != "3" {
			t.Fatalf("stale claim: %d %q, runs %d; want the handler's 201 from run 3", taken.Code, taken.Body, h.runs.Load())
		}
		close(release)
		wantProblem(t, <-done, 409, testserver.ProblemTakenOver)

		want := testserver.Stats{Claims: 2, Takeovers: 1, Replays: 1, Conflicts: 6, Mismatches: 6, Fenced: 1}
		if got := mw.Stats(); got != want {
			t.Errorf("Stats = %+v; want %+v", got, want)
		}
	})
}

func TestBadRequests(t *testing.T) {
	long := strings.Repeat("k", 256)
	cases := []struct {
		name   string
		header []string
		body   string
		status int
		typ    string
	}{
		{"missing", nil, chargeBody, 400, testserver.ProblemKeyMissing},
		{"empty", []string{"Idempotency-Key", ""}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"empty quoted", []string{"Idempotency-Key", `""`}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"256 characters", []string{"Idempotency-Key", long}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"10000 characters", []string{"Idempotency-Key", strings.Repeat("k", 10000)}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"non-ASCII", []string{"Idempotency-Key", "clé"}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"control character", []string{"Idempotency-Key", "a\x01b"}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"tab", []string{"Idempotency-Key", "a\tb"}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"unterminated quote", []string{"Idempotency-Key", `"abc`}, chargeBody, 400, testserver.ProblemKeyInvalid},
		// Two lines joined into one by a proxy (RFC 9110 §5.3) are two keys,
		// as two lines are.
		{"two quoted keys", []string{"Idempotency-Key", `"a", "b"`}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"two keys folded", []string{"Idempotency-Key", "a, b"}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"two keys folded without a space", []string{"Idempotency-Key", "a,b"}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"a key and an empty line folded", []string{"Idempotency-Key", "a,"}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"a quoted and a bare key folded", []string{"Idempotency-Key", `"a,b", c`}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"bad escape", []string{"Idempotency-Key", `"a\nb"`}, chargeBody, 400, testserver.ProblemKeyInvalid},
		{"sent twice", []string{"Idempotency-Key", "a", "Idempotency-Key", "a"}, chargeBody, 400, testserver.ProblemKeyRepeated},
		{"body too large", []string{"Idempotency-Key", "a"}, strings.Repeat("x", 2000), 413, testserver.ProblemBodyTooLarge},
	}
	eachStore(t, func(t *testing.T, store testserver.Store) {
		h := &charges{}
		mw := &testserver.Middleware{Store: store, MaxBody: 1000}
		srv := mw.Wrap(h)
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				wantProblem(t, serve(srv, request("POST", "/v1/charges", c.body, c.header...)), c.status, c.typ)
			})
		}
		if h.runs.Load() != 0 {
			t.Errorf("handler ran %d times on bad requests; want 0", h.runs.Load())
		}
		if got := mw.Stats().Rejected; got != int64(len(cases)) {
			t.Errorf("Stats.Rejected = %d; want %d", got, len(cases))
		}
	})
}

// A body without Content-Length (chunked) is cut at MaxBody as well.
func TestBodyTooLargeWithoutLength(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: 10}).Wrap(h)
	r := request("POST", "/", "", "Idempotency-Key", "k")
	r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 11)))
	r.ContentLength = -1
	wantProblem(t, serve(srv, r), 413, testserver.ProblemBodyTooLarge)
	r = request("POST", "/", "", "Idempotency-Key", "k")
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("x"), errReader{}))
	r.ContentLength = -1
	wantProblem(t, serve(srv, r), 400, testserver.ProblemBodyUnreadable)
	if h.runs.Load() != 0 {
		t.Fatal("handler ran")
	}
}

// TestBodyReadTimedOut: a body that did not arrive in time (the server's
// ReadTimeout, whose deadline ends the read with a *net.OpError around
// os.ErrDeadlineExceeded) is answered 408, which idem's clients retry
// under the same key, and not 400, which they take as final although the
// request never ran.
func TestBodyReadTimedOut(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h)
	r := request("POST", "/", "", "Idempotency-Key", "k")
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("x"), iotest.ErrReader(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})))
	r.ContentLength = -1
	w := serve(srv, r)
	wantProblem(t, w, http.StatusRequestTimeout, testserver.ProblemBodyUnreadable)
	if got := retry.Classify(w.Result(), nil); got != retry.Retry || h.runs.Load() != 0 {
		t.Fatalf("idem's clients %v the answer, the handler ran %d times; want retry, no run", got, h.runs.Load())
	}
}

// TestBodyRefusedLogsKey: the records of a body refused as too large or
// unreadable name the request's key, as the problem answered does, so that
// an operator can find the request a client reports.
func TestBodyRefusedLogsKey(t *testing.T) {
	var buf bytes.Buffer
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: 10,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	srv := mw.Wrap(&charges{})
	wantProblem(t, serve(srv, request("POST", "/", strings.Repeat("x", 11), "Idempotency-Key", "big-1")), 413, testserver.ProblemBodyTooLarge)
	r := request("POST", "/", "", "Idempotency-Key", "broken-1")
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("x"), errReader{}))
	r.ContentLength = -1
	wantProblem(t, serve(srv, r), 400, testserver.ProblemBodyUnreadable)
	for _, want := range []string{
		`level=DEBUG msg="idempotency: request rejected" key=big-1 status=413`,
		`level=INFO msg="idempotency: request body unreadable" key=broken-1 err=`,
		`level=DEBUG msg="idempotency: request rejected" key=broken-1 status=400`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestBodyTooLargeForAnOuterLimit: a body that an http.MaxBytesReader set
// before the Middleware cuts short, at fewer bytes than MaxBody, is refused
// with 413, and the problem names the limit that refused it.
func TestBodyTooLargeForAnOuterLimit(t *testing.T) {
	h := &charges{}
	srv := http.MaxBytesHandler((&testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: 1000}).Wrap(h), 10)
	p := wantProblem(t, serve(srv, request("POST", "/", strings.Repeat("x", 11), "Idempotency-Key", "k")), 413, testserver.ProblemBodyTooLarge)
	if !strings.Contains(p.Detail, "larger than 10 bytes") || h.runs.Load() != 0 {
		t.Fatalf("detail %q, handler runs %d; want the limit of 10 bytes named, no run", p.Detail, h.runs.Load())
	}
}

// TestBodyOfMaxBody: MaxBody is the largest body read, so a body of
// exactly MaxBody bytes runs, with or without a Content-Length.
func TestBodyOfMaxBody(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: 10}).Wrap(h)
	for i, length := range []int64{10, -1} {
		r := request("POST", "/", "", "Idempotency-Key", fmt.Sprint("k", i))
		r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 10)))
		r.ContentLength = length
		if w := serve(srv, r); w.Code != 201 || h.runs.Load() != int64(i+1) {
			t.Fatalf("10 bytes, Content-Length %d, MaxBody 10: %d %q; want the handler's 201", length, w.Code, w.Body)
		}
	}
}

// TestBodyOfLargestMaxBody: a MaxBody of math.MaxInt64, no limit in
// effect, reads the body whole: the handler gets it, and another body
// under the same key is a mismatch, not a replay.
func TestBodyOfLargestMaxBody(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: math.MaxInt64}).Wrap(h)
	for _, length := range []int64{int64(len(chargeBody)), -1} {
		r := request("POST", "/", chargeBody, "Idempotency-Key", fmt.Sprint("k", length))
		r.ContentLength = length
		w := serve(srv, r)
		var got struct{ Request string }
		if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != http.StatusCreated || err != nil || got.Request != chargeBody {
			t.Fatalf("MaxBody math.MaxInt64, Content-Length %d: %d %s; want the handler's 201 with the body it read, %s", length, w.Code, w.Body, chargeBody)
		}
	}
	other := request("POST", "/", `{"amount": 5}`, "Idempotency-Key", fmt.Sprint("k", -1))
	wantProblem(t, serve(srv, other), http.StatusUnprocessableEntity, testserver.ProblemMismatch)
}

// TestZeroValues: a Middleware with only its Store set reads request
// bodies of up to 1 MiB (DefaultMaxBody), saves answers of up to 1 MiB
// (DefaultMaxSavedResponse) for replay, and replays the headers that
// ReplayHeaders lists for nil, and no other.
func TestZeroValues(t *testing.T) {
	const mib = 1 << 20
	t.Run("MaxBody", func(t *testing.T) {
		srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
		for _, size := range []int{mib, mib + 1} {
			r := request("POST", "/", "", "Idempotency-Key", fmt.Sprint("k", size))
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", size))), -1
			w := serve(srv, r)
			if size > mib {
				wantProblem(t, w, http.StatusRequestEntityTooLarge, testserver.ProblemBodyTooLarge)
			} else if w.Code != http.StatusCreated {
				t.Fatalf("a body of 1 MiB: %d; want the handler's 201", w.Code)
			}
		}
	})
	t.Run("MaxSavedResponse", func(t *testing.T) {
		srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			size, _ := strconv.Atoi(r.URL.Query().Get("size"))
			w.WriteHeader(http.StatusCreated)
			w.Write(bytes.Repeat([]byte("x"), size))
		}))
		for _, size := range []int{mib, mib + 1} {
			path := fmt.Sprint("/?size=", size)
			first := serve(srv, request("POST", path, "", "Idempotency-Key", path))
			replay := serve(srv, request("POST", path, "", "Idempotency-Key", path))
			if first.Code != http.StatusCreated || first.Body.Len() != size {
				t.Fatalf("an answer of %d bytes: %d with %d bytes; want the handler's 201 whole", size, first.Code, first.Body.Len())
			}
			if size > mib {
				if replay.Code != http.StatusInternalServerError || !strings.Contains(replay.Body.String(), testserver.ProblemResponseTooLarge) {
					t.Fatalf("replay of an answer of 1 MiB and a byte: %d with %d bytes; want the 500 marker", replay.Code, replay.Body.Len())
				}
			} else if replay.Code != http.StatusCreated || replay.Body.Len() != size || replay.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay of an answer of 1 MiB: %d with %d bytes; want it replayed whole", replay.Code, replay.Body.Len())
			}
		}
	})
	t.Run("ReplayHeaders", func(t *testing.T) {
		replayed := []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Location", "ETag",
			"Last-Modified", "Cache-Control", "Expires", "Link", "Vary", "Content-Range", "Allow",
			"Content-Disposition", "X-Content-Type-Options"}
		srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, name := range append(replayed, "Set-Cookie", "X-Run") {
				w.Header().Set(name, "v")
			}
			w.WriteHeader(http.StatusCreated)
		}))
		serve(srv, request("POST", "/", "", "Idempotency-Key", "k"))
		w := serve(srv, request("POST", "/", "", "Idempotency-Key", "k"))
		h := w.Header().Clone()
		h.Del("Idempotent-Replayed")
		for _, name := range replayed {
			if h.Get(name) != "v" {
				t.Errorf("replay lacks %s", name)
			}
			h.Del(name)
		}
		if len(h) != 0 {
			t.Errorf("replay has headers %v besides those ReplayHeaders lists for nil", h)
		}
	})
}

// TestQuotedKeyWithComma: a comma inside a quoted key is part of the key,
// not a join of two header lines; the same key sent again is replayed.
func TestQuotedKeyWithComma(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h)
	for i, replayed := range []string{"", "true"} {
		w := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", `"a,b"`))
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != replayed || h.runs.Load() != 1 {
			t.Fatalf("request %d: %d %q, replayed %q, runs %d; want 201, replayed %q, run once",
				i+1, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), h.runs.Load(), replayed)
		}
	}
}

// TestFingerprintMediaType: the same bytes under another media type are
// another request (a handler parses a form and text differently): 422. A
// parameter of the media type (charset) is not part of the fingerprint:
// replayed.
func TestFingerprintMediaType(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h)
	send := func(ctype string) *httptest.ResponseRecorder {
		r := request("POST", "/v1/charges", "amount=1000&currency=usd&order_id=o-1", "Idempotency-Key", "k")
		r.Header.Set("Content-Type", ctype)
		return serve(srv, r)
	}
	for i, c := range []struct{ ctype, replayed string }{
		{"application/x-www-form-urlencoded", ""},
		{"application/x-www-form-urlencoded; charset=utf-8", "true"},
	} {
		w := send(c.ctype)
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != c.replayed || h.runs.Load() != 1 {
			t.Fatalf("request %d (%s): %d, replayed %q, runs %d; want 201, replayed %q, run once",
				i+1, c.ctype, w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load(), c.replayed)
		}
	}
	wantProblem(t, send("text/plain"), 422, testserver.ProblemMismatch)
	if h.runs.Load() != 1 {
		t.Fatalf("runs %d; want 1", h.runs.Load())
	}
}

// TestFormParsedOutside: a handler outside Wrap that parses the form (a
// CSRF middleware's PostFormValue) reads the body before the Middleware
// does: its fields then stand for the body, so that another form under the
// key is 422, not the first's answer; a multipart form, whose parts cannot
// be compared so, is refused with 500, nothing run.
func TestFormParsedOutside(t *testing.T) {
	h := &charges{}
	wrapped := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h)
	csrf := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
			r.ParseMultipartForm(1 << 20)
		}
		_ = r.PostFormValue("csrf_token")
		wrapped.ServeHTTP(w, r)
	})
	send := func(form string) *httptest.ResponseRecorder {
		r := request("POST", "/v1/charges", form, "Idempotency-Key", "k")
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return serve(csrf, r)
	}
	if w := send("order_id=A&amount=1000&csrf_token=t"); w.Code != 201 {
		t.Fatalf("first: %d; want 201", w.Code)
	}
	wantProblem(t, send("order_id=B&amount=99999&csrf_token=t"), 422, testserver.ProblemMismatch)
	if w := send("order_id=A&amount=1000&csrf_token=t"); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
		t.Fatalf("the first again: %d, replayed %q, runs %d; want its answer replayed, run once", w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load())
	}

	body := "--b\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\nA\r\n--b--\r\n"
	r := request("POST", "/v1/charges", body, "Idempotency-Key", "k2")
	r.Header.Set("Content-Type", "multipart/form-data; boundary=b")
	wantProblem(t, serve(csrf, r), 500, testserver.ProblemBodyUnreadable)
	if h.runs.Load() != 1 {
		t.Fatalf("runs %d; want the multipart request refused, nothing run", h.runs.Load())
	}
}

// TestFingerprintKeyTwice: a JSON object with a member named twice has no
// canonical form (a handler decoding into a struct keeps the first value
// where a later one is null): two such bodies that differ in the member
// that is named twice are two requests, 422, not the first's answer.
func TestFingerprintKeyTwice(t *testing.T) {
	h := &charges{}
	srv := (&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h)
	send := func(body string) *httptest.ResponseRecorder {
		r := request("POST", "/v1/charges", body, "Idempotency-Key", "k")
		r.Header.Set("Content-Type", "application/json")
		return serve(srv, r)
	}
	if w := send(`{"amount":1000,"order_id":"A","order_id":null}`); w.Code != 201 {
		t.Fatalf("first: %d; want 201", w.Code)
	}
	wantProblem(t, send(`{"amount":1000,"order_id":"B","order_id":null}`), 422, testserver.ProblemMismatch)
	if w := send(`{"amount":1000,"order_id":"A","order_id":null}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
		t.Fatalf("the first again: %d, replayed %q, runs %d; want its answer replayed, run once", w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load())
	}
}

// TestFingerprintWithoutContentType: a body without a Content-Type that
// parses as JSON is compared as JSON, as idem.Transport compares it: the
// same members in another order are replayed, another value is 422. A key
// claimed before, under the fingerprint that hashed such a body byte for
// byte, is still the same request's (409 while it runs, not 422).
func TestFingerprintWithoutContentType(t *testing.T) {
	h := &charges{}
	store := new(testserver.MemoryStore)
	srv := (&testserver.Middleware{Store: store}).Wrap(h)
	send := func(key, body string) *httptest.ResponseRecorder {
		r := request("POST", "/v1/charges", body, "Idempotency-Key", key)
		r.Header.Del("Content-Type")
		return serve(srv, r)
	}
	for i, c := range []struct{ body, replayed string }{
		{`{"amount":1000,"currency":"usd","order_id":"o-1"}`, ""},
		{`{ "order_id": "o-1", "currency": "usd", "amount": 1000 }`, "true"},
	} {
		w := send("k", c.body)
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != c.replayed || h.runs.Load() != 1 {
			t.Fatalf("request %d: %d %q, replayed %q, runs %d; want 201, replayed %q, run once",
				i+1, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), h.runs.Load(), c.replayed)
		}
	}
	wantProblem(t, send("k", `{"amount":2000,"currency":"usd","order_id":"o-1"}`), 422, testserver.ProblemMismatch)

	// The fingerprint of earlier versions: each field's length, then the
	// field; the body as it is.
	body := `{"order_id":"o-2","amount":1000}`
	old := sha256.New()
	for _, f := range []string{"POST", "/v1/charges", "", testserver.CredentialScope(request("POST", "/", "")), "", body} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		old.Write(n[:])
		old.Write([]byte(f))
	}
	now := time.Now()
	if _, claimed, err := store.Claim(t.Context(), testserver.CredentialScope(request("POST", "/", "")), "old", hex.EncodeToString(old.Sum(nil)),
		testserver.Fence{Token: now.UnixNano(), ClaimID: "before"}, now); err != nil || !claimed {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	wantProblem(t, send("old", body), 409, testserver.ProblemInFlight)
	wantProblem(t, send("old", `{"order_id":"o-2","amount":2000}`), 422, testserver.ProblemMismatch)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestKeyForms(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{`"abc"`, "abc"},
		{`"a\"b\\c"`, `a"b\c`},
		{`"a,b"`, "a,b"},
		{`"a\",b"`, `a",b`},
		{"a b", "a b"},
		{strings.Repeat("k", 255), strings.Repeat("k", 255)},
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
	} {
		got, err := testserver.ParseKey(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", `""`, " a", "a ", `"a`, `"a"b`, `"a\b"`, "\x7f", strings.Repeat("k", 256), "a, b", "a,b", "a,", `a"b,c`} {
		_, err := testserver.ParseKey(in)
		var ke *testserver.KeyError
		if !errors.As(err, &ke) || !errors.Is(err, testserver.ErrInvalidKey) || ke.Value != in || ke.Reason == "" {
			t.Errorf("ParseKey(%q) error = %v; want a *KeyError matching ErrInvalidKey", in, err)
		}
	}
}

func TestPassThrough(t *testing.T) {
	h := &charges{}
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := mw.Wrap(h)
	// GET is not protected: a key is ignored, and there is no replay.
	for range 2 {
		if w := serve(srv, request("GET", "/v1/charges/1", "", "Idempotency-Key", "k")); w.Code != 201 {
			t.Fatalf("GET: %d", w.Code)
		}
	}
	if h.runs.Load() != 2 {
		t.Fatalf("GET ran %d times; want 2 (not protected)", h.runs.Load())
	}
	// Optional: a POST without a key runs unprotected; with one, protected.
	mw = &testserver.Middleware{Store: new(testserver.MemoryStore), Optional: true, Methods: []string{"POST", "PUT"}}
	srv = mw.Wrap(h)
	for range 2 {
		serve(srv, request("POST", "/", chargeBody))
		serve(srv, request("PUT", "/", chargeBody, "Idempotency-Key", "k"))
	}
	if h.runs.Load() != 5 {
		t.Fatalf("runs %d; want 5 (two unprotected POSTs, one protected PUT)", h.runs.Load())
	}
	wantProblem(t, serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "")), 400, testserver.ProblemKeyInvalid)
}

// TestNestedWrap: a route wrapped, and the mux around it wrapped again,
// by the same Middleware or by another over the same store: the inner one
// passes the request the outer one claimed through to its handler, which
// runs once, and a retry gets its answer replayed. Before, the inner one
// found the key in flight and answered 409, which the outer one saved and
// replayed to every retry: the handler never ran.
func TestNestedWrap(t *testing.T) {
	store := new(testserver.MemoryStore)
	outer := &testserver.Middleware{Store: store}
	for i, inner := range []*testserver.Middleware{outer, {Store: store}} {
		h := &charges{}
		mux := http.NewServeMux()
		mux.Handle("POST /v1/charges", inner.Wrap(h))
		srv := outer.Wrap(mux)
		key := fmt.Sprint("k-", i)
		first := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", key))
		replay := serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", key))
		if first.Code != 201 || replay.Code != 201 || replay.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
			t.Errorf("%d: first %d %q, retry %d replayed %q, the handler ran %d times; want 201, its replay, one run",
				i, first.Code, first.Body, replay.Code, replay.Header().Get("Idempotent-Replayed"), h.runs.Load())
		}
	}
}

// TestMethodsMatchInAnyCase: a "post" or a "Put" is protected as a POST or
// a PUT is, as idem.Transport keys them: a client retries such a request
// under its key, and each retry must be replayed, not run again.
func TestMethodsMatchInAnyCase(t *testing.T) {
	for _, c := range []struct {
		methods []string
		method  string
	}{{nil, "post"}, {nil, "Patch"}, {[]string{"put"}, "PUT"}, {[]string{"POST", "PUT"}, "Put"}} {
		h := &charges{}
		srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), Methods: c.methods}).Wrap(h)
		for i := range 2 {
			w := serve(srv, request(c.method, "/v1/charges", chargeBody, "Idempotency-Key", "k"))
			if w.Code != 201 || h.runs.Load() != 1 || (i == 1) != (w.Header().Get("Idempotent-Replayed") == "true") {
				t.Fatalf("Methods %q, %s #%d: %d, replayed %q, runs %d; want 201, the retry replayed, one run",
					c.methods, c.method, i+1, w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load())
			}
		}
		wantProblem(t, serve(srv, request(c.method, "/v1/charges", chargeBody)), 400, testserver.ProblemKeyMissing)
	}
}

// TestOnError: a handler that fails (5xx, a panic) or asks to be retried
// (429, 408 or 425, which idem's clients retry under the same key) gets its
// claim released or its answer saved, as OnError says.
func TestOnError(t *testing.T) {
	for _, c := range []struct {
		policy testserver.ErrorPolicy
		panics bool
		status int
	}{
		{testserver.ReleaseClaim, false, 502}, {testserver.ReleaseClaim, true, 0}, {testserver.ReleaseClaim, false, 429}, {testserver.ReleaseClaim, false, 408},
		{testserver.ReleaseClaim, false, 425},
		{testserver.SaveError, false, 502}, {testserver.SaveError, true, 0}, {testserver.SaveError, false, 429}, {testserver.SaveError, false, 408},
		{testserver.SaveError, false, 425},
	} {
		t.Run(fmt.Sprintf("%v/panic=%v/%d", c.policy, c.panics, c.status), func(t *testing.T) {
			eachStore(t, func(t *testing.T, store testserver.Store) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						if c.panics {
							panic("downstream exploded")
						}
						w.Header().Set("Content-Type", "text/plain")
						w.WriteHeader(c.status)
						io.WriteString(w, "payco unreachable")
						return
					}
					w.WriteHeader(201)
					io.WriteString(w, "charged")
				})
				mw := &testserver.Middleware{Store: store, OnError: c.policy}
				srv := mw.Wrap(h)
				first := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				if c.panics {
					wantProblem(t, first, 500, testserver.ProblemHandlerFailed)
				} else if first.Code != c.status || first.Body.String() != "payco unreachable" {
					t.Fatalf("first answer %d %q; want the handler's %d", first.Code, first.Body, c.status)
				}
				retry := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				switch c.policy {
				case testserver.ReleaseClaim:
					if retry.Code != 201 || runs.Load() != 2 || mw.Stats().Released != 1 {
						t.Fatalf("retry after a released claim: %d, runs %d, %+v; want a second run answering 201", retry.Code, runs.Load(), mw.Stats())
					}
				case testserver.SaveError:
					if retry.Code != first.Code || !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) ||
						retry.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
						t.Fatalf("retry after a saved error: %d %q, runs %d; want the first error replayed, one run", retry.Code, retry.Body, runs.Load())
					}
				}
			})
		})
	}
}

// explode is a handler that panics, named so that its frame can be found in
// a stack.
func explode(http.ResponseWriter, *http.Request) { panic("downstream exploded") }

// panicLogChildEnv, set to 1, makes the test binary a child process that
// runs TestPanicLogged's "log package" case.
const panicLogChildEnv = "IDEM_TESTSERVER_PANIC_LOG_CHILD"

// TestPanicLogged: a handler's panic is logged with its value and its
// stack, as net/http logs one: to the Logger when there is one, otherwise
// to the server's ErrorLog, or to the log package's standard logger.
//
// The standard logger is the process's: rather than swap its output while
// other tests may log, the last case runs in a child process, where the
// logger writes to standard error, as it does by default, and the test
// reads it there.
func TestPanicLogged(t *testing.T) {
	wantLogged := func(t *testing.T, where, logged string) {
		t.Helper()
		if !strings.Contains(logged, "downstream exploded") || !strings.Contains(logged, "testserver_test.explode(") {
			t.Fatalf("%s:\n%s\nwant the panic's value and the handler's frame", where, logged)
		}
	}
	t.Run("Logger", func(t *testing.T) {
		var buf bytes.Buffer
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Logger: slog.New(slog.NewTextHandler(&buf, nil))}
		wantProblem(t, serve(mw.Wrap(http.HandlerFunc(explode)), request("POST", "/", chargeBody, "Idempotency-Key", "k")), 500, testserver.ProblemHandlerFailed)
		wantLogged(t, "Logger", buf.String())
	})
	t.Run("log package", func(t *testing.T) {
		if os.Getenv(panicLogChildEnv) == "1" {
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
			wantProblem(t, serve(mw.Wrap(http.HandlerFunc(explode)), request("POST", "/", chargeBody, "Idempotency-Key", "k")), 500, testserver.ProblemHandlerFailed)
			return
		}
		child := exec.Command(os.Args[0], "-test.run=^TestPanicLogged$/^log_package$", "-test.count=1")
		child.Env = append(os.Environ(), panicLogChildEnv+"=1")
		var stderr bytes.Buffer
		child.Stderr = &stderr
		if out, err := child.Output(); err != nil {
			t.Fatalf("child process: %v\n%s%s", err, out, &stderr)
		}
		wantLogged(t, "log package, in a child process", stderr.String())
	})
	t.Run("ErrorLog", func(t *testing.T) {
		var buf syncBuffer
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
		srv := httptest.NewUnstartedServer(mw.Wrap(http.HandlerFunc(explode)))
		srv.Config.ErrorLog = log.New(&buf, "", 0)
		srv.Start()
		defer srv.Close()
		if a := post(t, srv, "k"); a.resp.StatusCode != 500 {
			t.Fatalf("status %d; want 500", a.resp.StatusCode)
		}
		wantLogged(t, "server's ErrorLog", buf.String())
	})
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Worker A stalls past its lease; B takes over and answers. A's late save
// and release change nothing, and the client gets B's answer on replay.
func TestZombieWriter(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			eachStore(t, func(t *testing.T, store testserver.Store) {
				clk := newClock()
				started, unblockA := make(chan struct{}), make(chan struct{})
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 { // worker A
						close(started)
						<-unblockA
						w.WriteHeader(500) // A fails late: its release must be fenced too
						io.WriteString(w, "A")
						return
					}
					w.WriteHeader(201)
					io.WriteString(w, "B")
				})
				mw := &testserver.Middleware{Store: store, Now: clk.Now, OnError: policy}
				srv := mw.Wrap(h)
				send := func() *httptest.ResponseRecorder {
					return serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				}
				a := make(chan *httptest.ResponseRecorder)
				go func() { a <- send() }()
				<-started
				clk.Add(testserver.DefaultLockTimeout)
				if b := send(); b.Code != 201 || b.Body.String() != "B" {
					t.Fatalf("worker B: %d %q; want 201 B", b.Code, b.Body)
				}
				close(unblockA)
				wantProblem(t, <-a, 409, testserver.ProblemTakenOver)
				replay := send()
				if replay.Code != 201 || replay.Body.String() != "B" || replay.Header().Get("Idempotent-Replayed") != "true" {
					t.Fatalf("replay after the zombie: %d %q; want B's 201 B", replay.Code, replay.Body)
				}
				if s := mw.Stats(); runs.Load() != 2 || s.Fenced != 1 || s.Takeovers != 1 || s.Released != 0 {
					t.Fatalf("runs %d, %+v; want 2 runs, 1 takeover, 1 fenced write, nothing released", runs.Load(), s)
				}
			})
		})
	}
}

// TestHandlerThatWritesNothing: a handler that returns without writing
// answers 200 with no body, as net/http makes it, and that is what is
// saved and replayed.
func TestHandlerThatWritesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		var runs atomic.Int64
		srv := (&testserver.Middleware{Store: store}).Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs.Add(1) }))
		for i, replayed := range []string{"", "true"} {
			w := serve(srv, request("POST", "/", "", "Idempotency-Key", "k"))
			if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Idempotent-Replayed") != replayed || runs.Load() != 1 {
				t.Fatalf("request %d: %d %q, replayed %q, runs %d; want 200, no body, replayed %q, run once",
					i+1, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), runs.Load(), replayed)
			}
		}
	})
}

// TestBodyWithNoContent: a handler that writes a body after a 204 or a 304
// gets net/http's http.ErrBodyNotAllowed, and the body is neither sent,
// saved, sniffed for a Content-Type nor counted against MaxSavedResponse:
// the first caller and the retry get the same status without a body or a
// type. Before, the Write succeeded, the answer got a sniffed text/plain,
// and a body past MaxSavedResponse made the retry's answer a 500
// response-too-large for a 204.
func TestBodyWithNoContent(t *testing.T) {
	for _, status := range []int{http.StatusNoContent, http.StatusNotModified} {
		var writeErr atomic.Value
		srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: 1024}).Wrap(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(status)
				_, err := w.Write(bytes.Repeat([]byte("x"), 2048))
				writeErr.Store(fmt.Sprint(err))
			}))
		for i, replayed := range []string{"", "true"} {
			w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			if w.Code != status || w.Body.Len() != 0 || w.Header().Get("Content-Type") != "" || w.Header().Get("Idempotent-Replayed") != replayed {
				t.Errorf("%d, request %d: %d %q, Content-Type %q, replayed %q; want %d, no body, no type, replayed %q",
					status, i+1, w.Code, w.Body, w.Header().Get("Content-Type"), w.Header().Get("Idempotent-Replayed"), status, replayed)
			}
		}
		if got := writeErr.Load(); got != http.ErrBodyNotAllowed.Error() {
			t.Errorf("%d: the handler's Write returned %v; want %v", status, got, http.ErrBodyNotAllowed)
		}
	}
}

// takeOverRace holds every TakeOver until n requests are in one, so that
// all of them race for the same stale claim, and holds each lost one until
// the winner saved its answer.
type takeOverRace struct {
	*testserver.MemoryStore
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{} // closed once n TakeOvers arrived
	saved   chan struct{} // closed by the first Save
	once    sync.Once
}

func (s *takeOverRace) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	s.mu.Lock()
	if s.arrived++; s.arrived == s.n {
		close(s.all)
	}
	s.mu.Unlock()
	<-s.all
	won, err := s.MemoryStore.TakeOver(ctx, scope, key, old, new)
	if err == nil && !won {
		<-s.saved
	}
	return won, err
}

func (s *takeOverRace) Save(ctx context.Context, scope, key string, token testserver.Fence, resp testserver.Response) error {
	defer s.once.Do(func() { close(s.saved) })
	return s.MemoryStore.Save(ctx, scope, key, token, resp)
}

// TestStaleClaimOneWinner: requests that all find one stale claim and race
// to take it over run the handler once, in the request that won the
// compare-and-set; each that lost looks at the key again and gets the
// winner's answer, replayed.
func TestStaleClaimOneWinner(t *testing.T) {
	const n = 8
	synctest.Test(t, func(t *testing.T) {
		clk := newClock()
		store := &takeOverRace{MemoryStore: new(testserver.MemoryStore), n: n, all: make(chan struct{}), saved: make(chan struct{})}
		r := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")
		fp := testserver.Fingerprint(r, "", []byte(chargeBody))
		// A worker claimed the key and died.
		if _, _, err := store.Claim(context.Background(), "", "k", fp, fenceAt(clk.Now()), clk.Now()); err != nil {
			t.Fatal(err)
		}
		clk.Add(testserver.DefaultLockTimeout)
		h := &charges{}
		mw := &testserver.Middleware{Store: store, Now: clk.Now}
		srv := mw.Wrap(h)
		answers := make(chan *httptest.ResponseRecorder, n)
		for range n {
			go func() { answers <- serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")) }()
		}
		replays := 0
		for range n {
			w := <-answers
			if w.Code != 201 || !strings.Contains(w.Body.String(), `"run":1,`) {
				t.Errorf("answer %d %q; want the 201 of run 1", w.Code, w.Body)
			}
			if w.Header().Get("Idempotent-Replayed") == "true" {
				replays++
			}
		}
		if s := mw.Stats(); h.runs.Load() != 1 || replays != n-1 || s.Takeovers != 1 || s.Replays != n-1 {
			t.Fatalf("runs %d, %d replays, %+v; want 1 run, the %d other answers replayed", h.runs.Load(), replays, s, n-1)
		}
	})
}

// TestTakeOverOfTheLastToken: a stale claim whose token is the largest
// (locked at the end of time.Duration's range, with a clock past it) has no
// larger token to fence it with: max(now, token+1) wrapped around to the
// smallest. The take-over is refused as a store error, the handler not run
// and the claim left as it was, rather than made with a smaller token.
func TestTakeOverOfTheLastToken(t *testing.T) {
	store := new(testserver.MemoryStore)
	r := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")
	fp := testserver.Fingerprint(r, "", []byte(chargeBody))
	last := testserver.Fence{Token: math.MaxInt64, ClaimID: "another worker's"}
	lockedAt := time.Unix(0, math.MaxInt64)
	if _, _, err := store.Claim(context.Background(), "", "k", fp, last, lockedAt); err != nil {
		t.Fatal(err)
	}
	h := &charges{}
	mw := &testserver.Middleware{Store: store, Now: func() time.Time { return lockedAt.Add(testserver.DefaultLockTimeout) }, Logger: slog.New(slog.DiscardHandler)}
	w := serve(mw.Wrap(h), r)
	wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
	e, _, err := store.Claim(context.Background(), "", "k", fp, testserver.Fence{Token: 1, ClaimID: "probe"}, lockedAt)
	if err != nil || e.Fence != last || h.runs.Load() != 0 || mw.Stats().Takeovers != 0 {
		t.Fatalf("after a take-over of token MaxInt64: entry %+v, %v, %d runs, %+v; want the claim left with its fence, no run", e, err, h.runs.Load(), mw.Stats())
	}
}

// 64 identical requests at once over HTTP: one run; the others get 409
// while it runs, and every later request the byte-identical replay.
func TestConcurrentIdenticalRequests(t *testing.T) {
	const n = 64
	eachStore(t, func(t *testing.T, store testserver.Store) {
		rejected := make(chan struct{}, n)
		h := &charges{hold: func(int64) {
			for range n - 1 { // answer once every other request was turned away
				select {
				case <-rejected:
				case <-time.After(10 * time.Second):
					panic("the other requests were not answered while the first ran")
				}
			}
		}}
		mw := &testserver.Middleware{Store: store}
		ts := httptest.NewServer(mw.Wrap(h))
		defer ts.Close()
		post := func() (int, []byte, error) {
			req, err := http.NewRequest("POST", ts.URL+"/v1/charges", strings.NewReader(chargeBody))
			if err != nil {
				return 0, nil, err
			}
			req.Header.Set("Idempotency-Key", "same")
			req.Header.Set("Content-Type", "application/json")
			resp, err := ts.Client().Do(req)
			if err != nil {
				return 0, nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, b, err
		}
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			counts = map[int]int{}
			first  []byte
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body, err := post()
				if err != nil {
					t.Error(err)
				}
				if code == 409 {
					rejected <- struct{}{}
				}
				mu.Lock()
				defer mu.Unlock()
				counts[code]++
				if code == 201 {
					first = body
				}
			}()
		}
		wg.Wait()
		if h.runs.Load() != 1 || counts[201] != 1 || counts[409] != n-1 {
			t.Fatalf("runs %d, answers %v; want 1 run, one 201 and %d × 409", h.runs.Load(), counts, n-1)
		}
		for range 3 {
			code, body, err := post()
			if err != nil || code != 201 || !bytes.Equal(body, first) {
				t.Fatalf("replay: %d %q, %v; want 201 %q", code, body, err, first)
			}
		}
		if h.runs.Load() != 1 {
			t.Fatalf("runs %d after replays; want 1", h.runs.Load())
		}
	})
}

func TestResponseTooLarge(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		var runs atomic.Int64
		big := strings.Repeat("0123456789", 10)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Location", "/v1/reports/1")
			w.WriteHeader(201)
			for i := 0; i < len(big); i += 7 { // in pieces, past the cap mid-way
				io.WriteString(w, big[i:min(i+7, len(big))])
			}
		})
		mw := &testserver.Middleware{Store: store, MaxSavedResponse: 16}
		srv := mw.Wrap(h)
		first := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if first.Code != 201 || first.Body.String() != big {
			t.Fatalf("first answer %d, %d bytes; want the whole 201 answer", first.Code, first.Body.Len())
		}
		replay := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		p := wantProblem(t, replay, 500, testserver.ProblemResponseTooLarge)
		if p.OriginalStatus != 201 || replay.Header().Get("Location") != "/v1/reports/1" || replay.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("marker %+v, headers %v; want original status 201 and the Location", p, replay.Header())
		}
		if runs.Load() != 1 || mw.Stats().TooLarge != 1 {
			t.Fatalf("runs %d, %+v; want 1 run and TooLarge 1", runs.Load(), mw.Stats())
		}
		// A response of exactly the cap is saved whole.
		big = big[:16]
		exact := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k2"))
		again := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k2"))
		if exact.Body.String() != big || again.Code != 201 || again.Body.String() != big || runs.Load() != 2 {
			t.Fatalf("at the cap: %q, replay %d %q, runs %d; want %q saved and replayed", exact.Body, again.Code, again.Body, runs.Load(), big)
		}
	})
}

// TestPanicAfterStreaming: a handler that panics once part of an answer
// too large to save was sent cannot change that answer: its caller sees the
// connection break rather than a short success, and the marker saved names
// the status that was sent, whatever OnError says; the handler never runs
// again.
func TestPanicAfterStreaming(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				w.Write(bytes.Repeat([]byte("x"), 100)) // past MaxSavedResponse: streamed
				panic("boom")
			})
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: 10, OnError: policy}
			srv := httptest.NewServer(mw.Wrap(h))
			defer srv.Close()
			if a := try(t, srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k"); a.err == nil {
				t.Fatalf("first caller: %s with %d bytes, read without error; want the answer broken off", a.resp.Status, len(a.body))
			}
			a := post(t, srv, "k")
			var p testserver.Problem
			if err := json.Unmarshal([]byte(a.body), &p); err != nil || a.resp.StatusCode != 500 || p.Type != testserver.ProblemResponseTooLarge || p.OriginalStatus != 201 || runs.Load() != 1 {
				t.Fatalf("retry: %s %+v (%v) after %d runs; want the marker naming 201, one run", a.resp.Status, p, err, runs.Load())
			}
		})
	}
}

// TestSavePanicsWhileStreaming: a store whose Save panics once it saved
// the marker of an answer too large to save, before the answer streams,
// breaks that answer off as a handler's panic does; once the handler
// returned, a retry on the same Middleware gets the marker, not 409 until
// the claim's lease ends.
func TestSavePanicsWhileStreaming(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat([]byte("x"), 100)) // past MaxSavedResponse: streamed
	})
	var logged syncBuffer
	mw := &testserver.Middleware{Store: &failingStore{savedThenPanics: true}, MaxSavedResponse: 10, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	if a := try(t, srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k"); a.err == nil {
		t.Fatalf("first caller: %s with %d bytes, read without error; want the answer broken off", a.resp.Status, len(a.body))
	}
	if !strings.Contains(logged.String(), "store exploded after its save") {
		t.Fatalf("log:\n%s\nwant the store's panic", logged.String())
	}
	a := post(t, srv, "k")
	var p testserver.Problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Type != testserver.ProblemResponseTooLarge || p.OriginalStatus != 201 || runs.Load() != 1 {
		t.Fatalf("retry: %s %+v (%v) after %d runs; want the marker naming 201, one run", a.resp.Status, p, err, runs.Load())
	}
}

// stallingWriter is an http.ResponseWriter whose caller reads the body
// slowly: its first Write of the body blocks until release is closed.
type stallingWriter struct {
	*httptest.ResponseRecorder
	entered, release chan struct{}
	once             sync.Once
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered); <-w.release })
	return w.ResponseRecorder.Write(p)
}

// TestSlowReaderOfAStreamedAnswer: a caller that reads an answer too large
// to save slowly holds the handler in Write, past its lease: a retry then
// gets the marker, saved before the answer began to stream, not a second
// run. Under ReleaseClaim a failure's streamed answer is released once the
// handler returns, as before.
func TestSlowReaderOfAStreamedAnswer(t *testing.T) {
	for _, c := range []struct {
		policy testserver.ErrorPolicy
		status int
		runs   int64
	}{
		{testserver.ReleaseClaim, http.StatusCreated, 1},
		{testserver.SaveError, http.StatusBadGateway, 1},
	} {
		t.Run(fmt.Sprint(c.policy, c.status), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.WriteHeader(c.status)
					w.Write(bytes.Repeat([]byte("x"), 100)) // past MaxSavedResponse: streamed
				})
				srv := (&testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: 10, OnError: c.policy, LockTimeout: time.Second}).Wrap(h)
				w := &stallingWriter{ResponseRecorder: httptest.NewRecorder(), entered: make(chan struct{}), release: make(chan struct{})}
				done := make(chan struct{})
				go func() {
					defer close(done)
					srv.ServeHTTP(w, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k"))
				}()
				<-w.entered
				time.Sleep(2 * time.Second) // past the lease, the first caller still reading
				p := wantProblem(t, serve(srv, request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")), 500, testserver.ProblemResponseTooLarge)
				if p.OriginalStatus != c.status || runs.Load() != c.runs {
					t.Fatalf("retry: %+v after %d runs; want the marker naming %d, %d run", p, runs.Load(), c.status, c.runs)
				}
				close(w.release)
				<-done
				if w.Code != c.status || w.Body.Len() != 100 {
					t.Fatalf("first caller: %d with %d bytes; want %d with the 100 bytes", w.Code, w.Body.Len(), c.status)
				}
			})
		})
	}
}

// TestRetryWhileTheAnswerStreams: a retry that comes while an answer too
// large to save is still being written, its marker saved already, is told
// the request is in flight (409), as for any claim in flight: the handler
// may yet fail, or go on. Once the handler returned, a retry on the
// server that ran it gets the marker; on another server sharing the
// store, which cannot tell, once the claim's lease has ended.
func TestRetryWhileTheAnswerStreams(t *testing.T) {
	const lt = time.Minute
	eachStore(t, func(t *testing.T, store testserver.Store) {
		clk := newClock()
		var runs atomic.Int64
		midway, finish := make(chan struct{}), make(chan struct{})
		var finished sync.Once
		defer finished.Do(func() { close(finish) }) // a test that failed ends the handler
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Location", "/v1/reports/1")
			w.WriteHeader(http.StatusCreated)
			w.Write(bytes.Repeat([]byte("x"), 100)) // past MaxSavedResponse: streamed
			close(midway)
			<-finish
			w.Write(bytes.Repeat([]byte("y"), 100))
		})
		a := &testserver.Middleware{Store: store, MaxSavedResponse: 10, LockTimeout: lt, Now: clk.Now}
		b := &testserver.Middleware{Store: store, MaxSavedResponse: 10, LockTimeout: lt, Now: clk.Now}
		retry := func(mw *testserver.Middleware) *httptest.ResponseRecorder {
			return serve(mw.Wrap(h), request("POST", "/v1/reports", chargeBody, "Idempotency-Key", "k"))
		}
		inFlight := func(w *httptest.ResponseRecorder, when string) {
			t.Helper()
			wantProblem(t, w, http.StatusConflict, testserver.ProblemInFlight)
			if ra := w.Header().Get("Retry-After"); ra == "" || w.Header().Get("Idempotent-Replayed") != "" || runs.Load() != 1 {
				t.Fatalf("%s: Retry-After %q, replayed %q, after %d runs; want a Retry-After, no replay, one run",
					when, ra, w.Header().Get("Idempotent-Replayed"), runs.Load())
			}
		}
		marker := func(w *httptest.ResponseRecorder, when string) {
			t.Helper()
			p := wantProblem(t, w, http.StatusInternalServerError, testserver.ProblemResponseTooLarge)
			if p.OriginalStatus != http.StatusCreated || w.Header().Get("Location") != "/v1/reports/1" || runs.Load() != 1 {
				t.Fatalf("%s: %+v, headers %v, after %d runs; want the marker of the 201 with its Location, one run", when, p, w.Header(), runs.Load())
			}
			for name := range w.Header() {
				switch name {
				case "Content-Type", "Cache-Control", "Location", "Idempotent-Replayed":
				default:
					t.Errorf("%s: the marker's replay has the header %s; want none the Middleware keeps for itself", when, name)
				}
			}
		}

		first := make(chan *httptest.ResponseRecorder, 1)
		go func() { first <- retry(a) }()
		<-midway
		clk.Add(2 * time.Second)
		inFlight(retry(a), "a retry on the server streaming the answer")
		inFlight(retry(b), "a retry on another server")

		finished.Do(func() { close(finish) })
		if w := <-first; w.Code != http.StatusCreated || w.Body.Len() != 200 {
			t.Fatalf("first caller: %d with %d bytes; want the 201 with its 200 bytes", w.Code, w.Body.Len())
		}
		marker(retry(a), "a retry on the server that ran the handler, once it returned")
		inFlight(retry(b), "a retry on another server, within the lease")
		clk.Add(lt - 2*time.Second)
		marker(retry(b), "a retry on another server, once the lease ended")
		if st := a.Stats(); st.Conflicts != 1 || st.Replays != 1 || st.TooLarge != 1 {
			t.Errorf("A: %+v; want 1 conflict, 1 replay, 1 too large", st)
		}
	})
}

// failingStore fails the chosen methods.
type failingStore struct {
	testserver.MemoryStore
	claim, takeOver, save bool
	saveFails             int32 // the first saves that fail, when save is false
	savedThenFails        bool  // the first save is made, then reported failed (a connection lost after its commit)
	savedThenPanics       bool  // the first save is made, then the store panics
	saves                 atomic.Int32
}

var errDown = errors.New("store down")

func (s *failingStore) Claim(ctx context.Context, scope, key, fp string, tok testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if s.claim {
		return testserver.Entry{}, false, errDown
	}
	return s.MemoryStore.Claim(ctx, scope, key, fp, tok, now)
}

func (s *failingStore) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	if s.takeOver {
		return false, errDown
	}
	return s.MemoryStore.TakeOver(ctx, scope, key, old, new)
}

func (s *failingStore) Save(ctx context.Context, scope, key string, tok testserver.Fence, resp testserver.Response) error {
	n := s.saves.Add(1)
	if s.save || n <= s.saveFails {
		return errDown
	}
	err := s.MemoryStore.Save(ctx, scope, key, tok, resp)
	if s.savedThenFails && n == 1 && err == nil {
		return errDown
	}
	if s.savedThenPanics && n == 1 {
		panic("store exploded after its save")
	}
	return err
}

func TestStoreErrors(t *testing.T) {
	h := &charges{}
	closed, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	// Claim fails, on a closed store too, and a nil Store: 503, the
	// handler never runs. A closed store fails the release that follows
	// the failed claim too: two store errors.
	for _, tc := range []struct {
		name   string
		mw     *testserver.Middleware
		errors int64
	}{
		{"claim", &testserver.Middleware{Store: &failingStore{claim: true}}, 1},
		{"closed store", &testserver.Middleware{Store: closed}, 2},
		{"nil store", &testserver.Middleware{}, 1},
	} {
		w := serve(tc.mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		wantProblem(t, w, 503, testserver.ProblemStoreUnavailable)
		if st := tc.mw.Stats(); w.Header().Get("Retry-After") == "" || h.runs.Load() != 0 || st.StoreErrors != tc.errors {
			t.Fatalf("%s: Retry-After %q, runs %d, %+v; want a Retry-After, no run, %d store errors", tc.name, w.Header().Get("Retry-After"), h.runs.Load(), st, tc.errors)
		}
	}

	// TakeOver fails on a stale claim: 503, no run.
	clk := newClock()
	fs := &failingStore{takeOver: true}
	if _, _, err := fs.Claim(context.Background(), "", "k", "other-worker", fenceAt(clk.Now()), clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour)
	mw := &testserver.Middleware{Store: fs, Now: clk.Now}
	w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	// The fingerprint differs from "other-worker": a mismatch comes first.
	wantProblem(t, w, 422, testserver.ProblemMismatch)
	r := request("POST", "/", chargeBody, "Idempotency-Key", "k2")
	fp := testserver.Fingerprint(r, "", []byte(chargeBody))
	if _, _, err := fs.MemoryStore.Claim(context.Background(), "", "k2", fp, fenceAt(clk.Now()), clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour)
	wantProblem(t, serve(mw.Wrap(h), r), 503, testserver.ProblemStoreUnavailable)
	if h.runs.Load() != 0 {
		t.Fatalf("handler ran %d times; want 0", h.runs.Load())
	}

	// Save fails after the handler ran, every time it is tried: the
	// caller gets the handler's answer; the claim stays in flight, so a
	// retry is told to wait.
	synctest.Test(t, func(t *testing.T) {
		h := &charges{}
		fs := &failingStore{save: true}
		mw := &testserver.Middleware{Store: fs}
		if w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")); w.Code != 201 {
			t.Fatalf("after a failed save: %d; want the handler's 201", w.Code)
		}
		wantProblem(t, serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")), 409, testserver.ProblemInFlight)
		if h.runs.Load() != 1 || mw.Stats().StoreErrors != 1 || fs.saves.Load() != testserver.MaxSaves {
			t.Fatalf("runs %d, %d saves tried, %+v; want 1 run, %d saves, 1 store error", h.runs.Load(), fs.saves.Load(), mw.Stats(), testserver.MaxSaves)
		}
	})
}

// TestSaveTriedAgain: a save that fails for a while (another process's
// lock held past the store's busy timeout) is tried again, and the retry
// of the request gets the replay, not a second run after LockTimeout.
func TestSaveTriedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &charges{}
		fs := &failingStore{saveFails: 3}
		mw := &testserver.Middleware{Store: fs}
		start := time.Now()
		w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != 201 || time.Since(start) > 2*time.Second {
			t.Fatalf("%d after %v; want the handler's 201 within the tries' waits", w.Code, time.Since(start))
		}
		w = serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 || mw.Stats().StoreErrors != 0 {
			t.Fatalf("retry: %d, replayed %q, runs %d, %+v; want the replayed 201, one run, no store error",
				w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load(), mw.Stats())
		}
	})
}

// TestSaveMadeThenReportedFailed: a save that the store made but reported
// failed (its connection lost after the commit) is fenced when tried
// again, as it would be had the claim been taken over: which of the two
// cannot be told, and the caller gets the handler's answer, as for a save
// that failed, not a 409 saying the claim was taken over; the retry gets
// the replay.
func TestSaveMadeThenReportedFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &charges{}
		mw := &testserver.Middleware{Store: &failingStore{savedThenFails: true}}
		w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if st := mw.Stats(); w.Code != 201 || st.Fenced != 0 {
			t.Fatalf("%d %s, %+v; want the handler's 201, nothing fenced", w.Code, w.Body, st)
		}
		w = serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
			t.Fatalf("retry: %d, replayed %q, runs %d; want the replayed 201, one run", w.Code, w.Header().Get("Idempotent-Replayed"), h.runs.Load())
		}
	})
}

// Two credentials with the same key and body: two runs, and each replay is
// its own.
func TestTenantIsolation(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		h := &charges{}
		srv := (&testserver.Middleware{Store: store}).Wrap(h)
		send := func(auth string) *httptest.ResponseRecorder {
			r := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "shared-key")
			if auth != "" {
				r.Header.Set("Authorization", auth)
			}
			return serve(srv, r)
		}
		tenants := []string{"Bearer sk_a", "Bearer sk_b", ""}
		firsts := map[string]string{}
		for _, auth := range tenants {
			w := send(auth)
			if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("tenant %q: %d, replayed %q; want its own run", auth, w.Code, w.Header().Get("Idempotent-Replayed"))
			}
			firsts[auth] = w.Body.String()
		}
		if h.runs.Load() != int64(len(tenants)) {
			t.Fatalf("runs %d; want one per tenant", h.runs.Load())
		}
		for _, auth := range tenants {
			w := send(auth)
			if w.Body.String() != firsts[auth] || !strings.Contains(w.Body.String(), fmt.Sprintf(`"auth":%q`, auth)) {
				t.Errorf("tenant %q replay %q; want its own %q", auth, w.Body, firsts[auth])
			}
		}
	})
}

// The save runs even when the caller hung up while the handler ran.
func TestSaveAfterClientGone(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		var deadline time.Time
		ctx, cancel := context.WithCancel(context.Background())
		var handlerErr error
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			deadline, _ = r.Context().Deadline()
			cancel() // the client goes away while the work is under way
			handlerErr = r.Context().Err()
			w.WriteHeader(201)
		})
		mw := &testserver.Middleware{Store: store, LockTimeout: time.Hour}
		srv := mw.Wrap(h)
		before := time.Now()
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k").WithContext(ctx))
		if deadline.IsZero() || deadline.Before(before.Add(59*time.Minute)) || deadline.After(time.Now().Add(time.Hour)) {
			t.Errorf("handler deadline %v; want about LockTimeout (1 h) from now", deadline)
		}
		if handlerErr != nil {
			t.Errorf("the handler's context ended (%v) when the caller hung up; want the work to run on until the lease ends", handlerErr)
		}
		w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after the caller hung up: %d; want the saved 201 replayed", w.Code)
		}
	})
}

func TestPrune(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		clk := newClock()
		h := &charges{}
		mw := &testserver.Middleware{Store: store, Now: clk.Now, Retention: time.Hour, PruneBatch: 2}
		srv := mw.Wrap(h)
		for i := range 5 {
			serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", fmt.Sprint("old", i)))
		}
		clk.Add(23 * time.Hour)
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "young"))
		clk.Add(time.Hour + time.Second)
		// Retention below 24 h counts as 24 h: only the five old keys are due.
		n, err := mw.Prune(context.Background())
		if err != nil || n != 5 {
			t.Fatalf("Prune = %d, %v; want 5", n, err)
		}
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "young"))
		if h.runs.Load() != 6 {
			t.Fatalf("runs %d; want 6: the young key replayed", h.runs.Load())
		}
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "old0"))
		if h.runs.Load() != 7 {
			t.Fatalf("runs %d; want 7: a pruned key is a new operation", h.runs.Load())
		}
	})
}

// Prune without a Store fails closed with ErrNoStore, deleting nothing.
func TestPruneNilStore(t *testing.T) {
	n, err := (&testserver.Middleware{}).Prune(context.Background())
	if n != 0 || !errors.Is(err, testserver.ErrNoStore) {
		t.Fatalf("Prune with a nil Store = %d, %v; want 0, ErrNoStore", n, err)
	}
}

// TestBadOptions: a negative LockTimeout or PruneBatch (or a Now out of a
// token's range) is refused as a nil
// Store is, not taken for the default: Prune returns ErrOptions naming the
// field and deletes nothing, and a protected request is answered 503
// without running the handler, the error logged once.
func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(*testserver.Middleware)
	}{
		{"LockTimeout", func(mw *testserver.Middleware) { mw.LockTimeout = -time.Second }},
		{"PruneBatch", func(mw *testserver.Middleware) { mw.PruneBatch = -1 }},
		{"OnError", func(mw *testserver.Middleware) { mw.OnError = testserver.SaveError + 1 }},
		// Prune would delete the claim of a handler still running.
		{"Retention", func(mw *testserver.Middleware) { mw.LockTimeout = testserver.DefaultRetention }},
		// A clock whose readings no token holds: the zero time of a Now
		// not set up, and one past 2262, under which every entry would be
		// due for Prune and every claim stale.
		{"Now", func(mw *testserver.Middleware) { mw.Now = func() time.Time { return time.Time{} } }},
		{"Now", func(mw *testserver.Middleware) {
			mw.Now = func() time.Time { return time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC) }
		}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			clk := newClock()
			store := new(testserver.MemoryStore)
			if _, _, err := store.Claim(t.Context(), "", "old", "fp", fenceAt(clk.Now()), clk.Now()); err != nil {
				t.Fatal(err)
			}
			clk.Add(1000 * time.Hour) // "old" is due
			var logged bytes.Buffer
			mw := &testserver.Middleware{Store: store, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
			tc.set(mw)
			n, err := mw.Prune(t.Context())
			if n != 0 || !errors.Is(err, testserver.ErrOptions) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Prune = %d, %v; want 0 and ErrOptions naming %s", n, err, tc.field)
			}
			if _, claimed, err := store.Claim(t.Context(), "", "old", "fp", fenceAt(clk.Now()), clk.Now()); err != nil || claimed {
				t.Errorf("after Prune, Claim of the due key: claimed %v, %v; want it still there", claimed, err)
			}
			h := &charges{}
			w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			wantProblem(t, w, 503, testserver.ProblemStoreUnavailable)
			if h.runs.Load() != 0 || mw.Stats().StoreErrors != 1 {
				t.Errorf("runs %d, %+v; want no run, one store error", h.runs.Load(), mw.Stats())
			}
			if c := strings.Count(logged.String(), tc.field); c != 1 || !strings.Contains(logged.String(), testserver.ErrOptions.Error()) {
				t.Errorf("log %q: want ErrOptions naming %s once", logged.String(), tc.field)
			}
		})
	}
}

// TestPruneAtRetention: a key exactly Retention old is kept, so that a
// client that retries until its horizon, as long as the server's
// retention, still gets the replay at its last instant; a nanosecond
// later it is due. The default keeps keys an hour past the clients' 24 h
// horizon.
func TestPruneAtRetention(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		kept      time.Duration // how old a key is when Prune would first delete it, less 1 ns
	}{
		{"floor", testserver.MinRetention, 24 * time.Hour},
		{"below the floor", time.Hour, 24 * time.Hour},
		{"default", 0, 25 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, store testserver.Store) {
				clk := newClock()
				h := &charges{}
				mw := &testserver.Middleware{Store: store, Now: clk.Now, Retention: tc.retention}
				srv := mw.Wrap(h)
				serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				clk.Add(tc.kept)
				if n, err := mw.Prune(context.Background()); err != nil || n != 0 {
					t.Fatalf("Prune of a key exactly %v old = %d, %v; want 0", tc.kept, n, err)
				}
				if w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k")); w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
					t.Fatalf("retry at %v: %d, runs %d; want the replay", tc.kept, w.Code, h.runs.Load())
				}
				clk.Add(time.Nanosecond)
				if n, err := mw.Prune(context.Background()); err != nil || n != 1 {
					t.Fatalf("Prune of a key %v and 1 ns old = %d, %v; want 1", tc.kept, n, err)
				}
			})
		})
	}
}

// The logger hears every decision and never a credential.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	clk := newClock()
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Now: clk.Now,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	srv := mw.Wrap(&charges{})
	for _, body := range []string{chargeBody, chargeBody, `{}`} {
		serve(srv, request("POST", "/", body, "Idempotency-Key", "k", "Authorization", "Bearer sk_live_secret"))
	}
	serve(srv, request("POST", "/", chargeBody))
	log := buf.String()
	for _, want := range []string{"idempotency: claimed", "idempotency: replayed", "idempotency: key reused with another request", "idempotency: request rejected"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "sk_live_secret") {
		t.Errorf("log holds the credential:\n%s", log)
	}
}

// panickyLog is a slog.Handler that panics on the records whose message
// begins with on.
type panickyLog struct{ on string }

func (panickyLog) Enabled(context.Context, slog.Level) bool { return true }
func (l panickyLog) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, l.on) {
		panic("logger broke on " + r.Message)
	}
	return nil
}
func (l panickyLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l panickyLog) WithGroup(string) slog.Handler      { return l }

// TestLoggerPanics: a Logger's panic is not recovered: it leaves ServeHTTP
// with nothing more answered, as a handler's panic leaves it under net/http,
// and the key as the Middleware had it at that record. A record before the
// handler ran leaves the claim in flight (409) until LockTimeout, after
// which a retry takes it over and runs the handler, for the first time.
// Every record after the handler ran (its panic, abort or short body, an
// answer too large, the save) comes once the answer is saved: the retry
// gets it replayed, and the handler never runs twice, under SaveError as
// SaveError promises; after an aborted answer, the abort's panic replaces
// the Logger's.
func TestLoggerPanics(t *testing.T) {
	for _, c := range []struct {
		name, on string
		policy   testserver.ErrorPolicy
		first    func(http.ResponseWriter) // what the first run does instead of its 201, or nil
		limit    int64                     // MaxSavedResponse, or 0
		want     any                       // the panic ServeHTTP ends with
		sent     string                    // the body the first caller got, streamed, before the panic
		runs     int64                     // runs of the handler by the first request
		replayed int                       // the status the retry gets replayed, or 0
	}{
		{"before the handler", "idempotency: claimed", testserver.ReleaseClaim, nil, 0, "logger broke on idempotency: claimed", "", 0, 0},
		{"on the handler's panic", "idempotency: handler panicked", testserver.SaveError, func(http.ResponseWriter) { panic("downstream exploded") }, 0,
			"logger broke on idempotency: handler panicked", "", 1, http.StatusInternalServerError},
		{"on the handler's abort", "idempotency: handler aborted", testserver.SaveError, func(http.ResponseWriter) { panic(http.ErrAbortHandler) }, 0,
			http.ErrAbortHandler, "", 1, http.StatusInternalServerError},
		{"on a short body", "idempotency: handler's body is shorter", testserver.SaveError, func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "short")
		}, 0, http.ErrAbortHandler, "", 1, http.StatusInternalServerError},
		{"on an answer too large", "idempotency: response too large", testserver.ReleaseClaim, nil, 4,
			"logger broke on idempotency: response too large to save; a marker is saved", "run 1", 1, http.StatusInternalServerError},
		{"after the save", "idempotency: saved", testserver.ReleaseClaim, nil, 0, "logger broke on idempotency: saved", "", 1, http.StatusCreated},
		{"after an aborted answer", "idempotency: saved", testserver.SaveError, func(http.ResponseWriter) { panic(http.ErrAbortHandler) }, 0,
			http.ErrAbortHandler, "", 1, http.StatusInternalServerError},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 && c.first != nil {
					c.first(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d", runs.Load())
			})
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Now: clk.Now, OnError: c.policy, MaxSavedResponse: c.limit,
				Logger: slog.New(panickyLog{c.on})}
			w := httptest.NewRecorder()
			v := func() (v any) {
				defer func() { v = recover() }()
				mw.Wrap(h).ServeHTTP(w, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				return nil
			}()
			if v != c.want || w.Body.String() != c.sent || (c.sent == "" && len(w.Header()) != 0) || runs.Load() != c.runs {
				t.Fatalf("panic %v, answer %d %v %q, %d runs; want the panic %v, %q answered, %d runs", v, w.Code, w.Header(), w.Body, runs.Load(), c.want, c.sent, c.runs)
			}
			retry := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			if c.replayed != 0 {
				if retry.Code != c.replayed || retry.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
					t.Fatalf("retry: %d %q after %d runs; want the saved %d, replayed", retry.Code, retry.Body, runs.Load(), c.replayed)
				}
				return
			}
			wantProblem(t, retry, http.StatusConflict, testserver.ProblemInFlight)
			clk.Add(testserver.DefaultLockTimeout)
			retry = serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			if want := fmt.Sprintf("run %d", c.runs+1); retry.Code != http.StatusCreated || retry.Body.String() != want || mw.Stats().Takeovers != 1 {
				t.Fatalf("retry after LockTimeout: %d %q, %+v; want the 201 of a take-over, %q", retry.Code, retry.Body, mw.Stats(), want)
			}
		})
	}
}

// slowClaimStore's first Claim takes delay.
type slowClaimStore struct {
	*testserver.MemoryStore
	delay time.Duration
	calls atomic.Int32
}

func (s *slowClaimStore) Claim(ctx context.Context, scope, key, fp string, tok testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if s.calls.Add(1) == 1 {
		time.Sleep(s.delay)
	}
	return s.MemoryStore.Claim(ctx, scope, key, fp, tok, now)
}

// untilLeaseEnds returns a handler that answers 201 once its context
// ends, and the most of its runs that ran at once.
func untilLeaseEnds() (http.Handler, *atomic.Int32) {
	var running, most atomic.Int32
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		defer running.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		<-r.Context().Done() // honours its context
		w.WriteHeader(http.StatusCreated)
	}), &most
}

// steppingClaimStore calls step during its first Claim, once the token
// is chosen: a clock stepped while the store writes.
type steppingClaimStore struct {
	*testserver.MemoryStore
	step  func()
	calls atomic.Int32
}

func (s *steppingClaimStore) Claim(ctx context.Context, scope, key, fp string, tok testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if s.calls.Add(1) == 1 {
		s.step()
	}
	return s.MemoryStore.Claim(ctx, scope, key, fp, tok, now)
}

// slowTakeOver's TakeOver takes d on clk.
type slowTakeOver struct {
	*testserver.MemoryStore
	clk *clock
	d   time.Duration
}

func (s slowTakeOver) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	won, err := s.MemoryStore.TakeOver(ctx, scope, key, old, new)
	s.clk.Add(s.d)
	return won, err
}

// TestHandlerEndsWithItsLease: the handler's context ends LockTimeout after
// the claim was taken, not after the handler started: time the store took
// to claim does not extend it, so a retry that comes once the lease is over
// never runs beside the first handler. A claim or a take-over that took
// longer than the lease runs nothing, answers 503 and counts a store error,
// neither a claim nor a take-over; a claim is released, a take-over left
// in flight, stale, for the retry to take over.
func TestHandlerEndsWithItsLease(t *testing.T) {
	const lt = 60 * time.Second
	t.Run("slow claim", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, most := untilLeaseEnds()
			mw := &testserver.Middleware{Store: &slowClaimStore{MemoryStore: new(testserver.MemoryStore), delay: 5 * time.Second}, LockTimeout: lt}
			var wg sync.WaitGroup
			wg.Go(func() { serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")) })
			time.Sleep(lt + time.Second) // the retry comes once the lease is over
			wg.Go(func() { serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")) })
			wg.Wait()
			// The first handler's lease ended at 60 s, and it saved its answer
			// then: the retry gets it.
			if most.Load() != 1 || mw.Stats().Replays != 1 {
				t.Fatalf("%d handlers ran at once, %+v; want one, and the retry replayed", most.Load(), mw.Stats())
			}
		})
	})
	t.Run("clock stepped back during the claim", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Server A's wall clock is stepped back an hour while the store
			// claims the key (an NTP correction); server B, on the same
			// store, keeps the right time. A's handler must still end with
			// the lease the store grants it, LockTimeout from its token,
			// when B may take the key over: not an hour later.
			h, most := untilLeaseEnds()
			var back atomic.Int64 // how far A's clock is stepped back
			store := &steppingClaimStore{MemoryStore: new(testserver.MemoryStore), step: func() { back.Store(int64(time.Hour)) }}
			a := &testserver.Middleware{Store: store, LockTimeout: lt, Now: func() time.Time { return time.Now().Add(-time.Duration(back.Load())) }}
			b := &testserver.Middleware{Store: store, LockTimeout: lt}
			var wg sync.WaitGroup
			wg.Go(func() { serve(a.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")) })
			time.Sleep(lt + time.Second) // the retry reaches B once the lease is over
			wg.Go(func() { serve(b.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")) })
			wg.Wait()
			if most.Load() != 1 || b.Stats().Replays != 1 {
				t.Fatalf("%d handlers ran at once, A %+v, B %+v; want one, and B's retry replayed A's answer", most.Load(), a.Stats(), b.Stats())
			}
		})
	})
	t.Run("claim slower than the lease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := &charges{}
			store := &slowClaimStore{MemoryStore: new(testserver.MemoryStore), delay: lt + time.Second}
			mw := &testserver.Middleware{Store: store, LockTimeout: lt}
			w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
			if st := mw.Stats(); h.runs.Load() != 0 || st != (testserver.Stats{StoreErrors: 1}) {
				t.Fatalf("the handler ran %d times, %+v; want none, one store error and nothing else", h.runs.Load(), st)
			}
			// The claim was released: the retry runs at once.
			w = serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			if st := mw.Stats(); w.Code != http.StatusCreated || h.runs.Load() != 1 || st.Claims != 1 {
				t.Fatalf("retry: %d after %d runs, %+v; want 201 after one, one claim", w.Code, h.runs.Load(), st)
			}
		})
	})
	t.Run("take-over slower than the lease", func(t *testing.T) {
		clk := newClock()
		store := slowTakeOver{MemoryStore: new(testserver.MemoryStore), clk: clk, d: lt + time.Second}
		fp := testserver.Fingerprint(request("POST", "/", chargeBody), "", []byte(chargeBody))
		// A worker claimed the key and died.
		if _, _, err := store.Claim(context.Background(), "", "k", fp, fenceAt(clk.Now()), clk.Now()); err != nil {
			t.Fatal(err)
		}
		clk.Add(lt)
		h := &charges{}
		mw := &testserver.Middleware{Store: store, LockTimeout: lt, Now: clk.Now}
		w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
		if st := mw.Stats(); h.runs.Load() != 0 || st != (testserver.Stats{StoreErrors: 1}) {
			t.Fatalf("the handler ran %d times, %+v; want none, one store error and nothing else", h.runs.Load(), st)
		}
		// The claim taken over is left in flight, stale already: the retry
		// takes it over at once, and its handler runs with TakenOver set,
		// where a release would have let it claim the key afresh and run
		// as a first run, although the dead worker may have done the work.
		mw = &testserver.Middleware{Store: store.MemoryStore, LockTimeout: lt, Now: clk.Now} // a take-over in time
		w = serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if st := mw.Stats(); w.Code != http.StatusCreated || h.runs.Load() != 1 || st.Claims != 0 || st.Takeovers != 1 {
			t.Fatalf("retry: %d after %d runs, %+v; want 201 after one, one take-over", w.Code, h.runs.Load(), st)
		}
	})
}

// TestClaimAheadOfTheClock: a claim taken by a server whose clock ran an
// hour ahead, which then died, is in flight for each server that reads it
// for LockTimeout from when that server first read it, and is then taken
// over: not for LockTimeout and the hour. Its take-over's token is ahead
// too, and the take-over's lease runs LockTimeout from before it was
// written, the time the store took spent, as a claim's does.
func TestClaimAheadOfTheClock(t *testing.T) {
	const lt = time.Minute
	fp := testserver.Fingerprint(request("POST", "/", chargeBody), "", []byte(chargeBody))
	eachStore(t, func(t *testing.T, store testserver.Store) {
		clk := newClock()
		ahead := fenceAt(clk.Now().Add(time.Hour)) // the dead server's claim
		if _, _, err := store.Claim(context.Background(), "", "k", fp, ahead, clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		h := &charges{}
		var claim testserver.Claim
		a := &testserver.Middleware{Store: store, LockTimeout: lt, Now: clk.Now}
		b := &testserver.Middleware{Store: store, LockTimeout: lt, Now: clk.Now}
		inFlight := func(mw *testserver.Middleware, when string) {
			t.Helper()
			w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			wantProblem(t, w, http.StatusConflict, testserver.ProblemInFlight)
			if ra := w.Header().Get("Retry-After"); ra == "" || h.runs.Load() != 0 {
				t.Fatalf("%s: Retry-After %q after %d runs; want one, and no run", when, ra, h.runs.Load())
			}
		}
		inFlight(a, "A, first read") // A reads it first now
		clk.Add(lt / 2)
		inFlight(b, "B, first read") // B half a lease later
		clk.Add(lt/2 - time.Nanosecond)
		inFlight(a, "A, a nanosecond before its LockTimeout")
		clk.Add(time.Nanosecond)
		inFlight(b, "B, LockTimeout after A's first read")

		wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claim, _ = testserver.ClaimFrom(r.Context())
			h.ServeHTTP(w, r)
		})
		w := serve(a.Wrap(wrapped), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != http.StatusCreated || h.runs.Load() != 1 || !claim.TakenOver || claim.Token <= ahead.Token {
			t.Fatalf("A, LockTimeout after its first read: %d after %d runs, claim %+v; want the handler's 201, a take-over with a token above %d",
				w.Code, h.runs.Load(), claim, ahead.Token)
		}
		if st := a.Stats(); st.Takeovers != 1 || st.Conflicts != 2 {
			t.Errorf("A: %+v; want 2 conflicts, 1 take-over", st)
		}
		w = serve(b.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
			t.Fatalf("B after the take-over: %d (%s) after %d runs; want A's 201 replayed", w.Code, w.Body, h.runs.Load())
		}
	})
	t.Run("take-over's lease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const took = 5 * time.Second
			store := &slowTakeOverSleeps{MemoryStore: new(testserver.MemoryStore), d: took}
			ahead := fenceAt(time.Now().Add(time.Hour))
			if _, _, err := store.Claim(context.Background(), "", "k", fp, ahead, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			var left time.Duration
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				dl, _ := r.Context().Deadline()
				left = time.Until(dl)
				w.WriteHeader(http.StatusCreated)
			})
			mw := &testserver.Middleware{Store: store, LockTimeout: lt}
			wantProblem(t, serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")), http.StatusConflict, testserver.ProblemInFlight)
			time.Sleep(lt)
			w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
			if w.Code != http.StatusCreated || left != lt-took {
				t.Fatalf("take-over: %d, the handler's lease %v; want 201 and %v, LockTimeout less the take-over's %v", w.Code, left, lt-took, took)
			}
		})
	})
}

// TestClaimsAheadPastTheCap: once a Middleware remembers when it first read
// testserver.MaxAhead claims ahead of its clock, a new one takes the place
// of the oldest once that one is LockTimeout old (its claim stale for this
// Middleware, as every claim read before it), and is taken over
// LockTimeout after it was first read, not once this clock caught up with
// its token.
func TestClaimsAheadPastTheCap(t *testing.T) {
	const lt = time.Minute
	fp := testserver.Fingerprint(request("POST", "/", chargeBody), "", []byte(chargeBody))
	clk := newClock()
	store := new(testserver.MemoryStore)
	h := &charges{}
	mw := &testserver.Middleware{Store: store, LockTimeout: lt, Now: clk.Now}
	read := func(key string) *httptest.ResponseRecorder {
		return serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", key))
	}
	claimAhead := func(key string) {
		if _, _, err := store.Claim(context.Background(), "", key, fp, fenceAt(clk.Now().Add(time.Hour)), clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range testserver.MaxAhead {
		key := fmt.Sprint("old-", i)
		claimAhead(key)
		wantProblem(t, read(key), http.StatusConflict, testserver.ProblemInFlight)
	}
	clk.Add(lt)
	claimAhead("new")
	wantProblem(t, read("new"), http.StatusConflict, testserver.ProblemInFlight)
	clk.Add(lt)
	if w := read("new"); w.Code != http.StatusCreated || h.runs.Load() != 1 || mw.Stats().Takeovers != 1 {
		t.Fatalf("LockTimeout after the first read of a claim an hour ahead, past %d others: %d after %d runs, %+v; want it taken over",
			testserver.MaxAhead, w.Code, h.runs.Load(), mw.Stats())
	}
}

// slowTakeOverSleeps's TakeOver takes d, slept.
type slowTakeOverSleeps struct {
	*testserver.MemoryStore
	d time.Duration
}

func (s slowTakeOverSleeps) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	won, err := s.MemoryStore.TakeOver(ctx, scope, key, old, new)
	time.Sleep(s.d)
	return won, err
}

// TestHandlerSilentAfterItsLease: a handler that returns at the end of its
// lease without having answered anything (as a handler that honours its
// context does: it returns once ctx.Done() is closed) failed: its run is
// not saved as the empty 200 net/http would send, which every retry would
// get replayed and a client take as done. Its caller gets 503
// ProblemLeaseEnded, and OnError decides: ReleaseClaim releases the claim
// (a retry runs the handler again), SaveError saves the 503 (a retry gets
// it replayed). A handler that answers after its lease ended is saved as
// it answered.
func TestHandlerSilentAfterItsLease(t *testing.T) {
	const lt = 5 * time.Second
	silent := func(runs *atomic.Int64) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-r.Context().Done()
		})
	}
	send := func(srv http.Handler) *httptest.ResponseRecorder {
		return serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	}
	t.Run("release", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var runs atomic.Int64
			var buf bytes.Buffer
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), LockTimeout: lt,
				Logger: slog.New(slog.NewTextHandler(&buf, nil))}
			srv := mw.Wrap(silent(&runs))
			start := time.Now()
			w := send(srv)
			// The lease runs from the claim's token, up to 1 ms before the
			// clock's reading.
			if d := time.Since(start); d > lt || d <= lt-time.Millisecond {
				t.Errorf("answered after %v; want at the lease's end, %v less the token's part of a millisecond", d, lt)
			}
			p := wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemLeaseEnded)
			if p.Key != "k" || w.Header().Get("Retry-After") != "1" {
				t.Errorf("problem %+v, Retry-After %q; want key k, Retry-After 1", p, w.Header().Get("Retry-After"))
			}
			if st := mw.Stats(); runs.Load() != 1 || st != (testserver.Stats{Claims: 1, Released: 1}) {
				t.Fatalf("runs %d, %+v; want one run, one claim, released", runs.Load(), st)
			}
			if want := `level=WARN msg="idempotency: handler returned no answer after its lease ended" key=k`; !strings.Contains(buf.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, buf.String())
			}
			// The claim is gone: the retry runs the handler again, at once.
			w = send(srv)
			wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemLeaseEnded)
			if st := mw.Stats(); runs.Load() != 2 || w.Header().Get("Idempotent-Replayed") != "" || st.Claims != 2 || st.Released != 2 {
				t.Fatalf("retry: runs %d, replayed %q, %+v; want a second run, not a replay", runs.Load(), w.Header().Get("Idempotent-Replayed"), st)
			}
		})
	})
	t.Run("save", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var runs atomic.Int64
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), LockTimeout: lt, OnError: testserver.SaveError}
			srv := mw.Wrap(silent(&runs))
			first := send(srv)
			wantProblem(t, first, http.StatusServiceUnavailable, testserver.ProblemLeaseEnded)
			// Saved, it is the key's answer: no Retry-After asks for a
			// retry that would only get it replayed (without one).
			if ra := first.Header().Get("Retry-After"); ra != "" {
				t.Errorf("saved lease-ended answer with Retry-After %q; want none", ra)
			}
			retry := send(srv)
			wantProblem(t, retry, http.StatusServiceUnavailable, testserver.ProblemLeaseEnded)
			if retry.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) || runs.Load() != 1 {
				t.Fatalf("retry: %q, replayed %q, runs %d; want the first 503 replayed, one run", retry.Body, retry.Header().Get("Idempotent-Replayed"), runs.Load())
			}
			if st := mw.Stats(); st != (testserver.Stats{Claims: 1, Replays: 1}) {
				t.Fatalf("%+v; want one claim, one replay", st)
			}
		})
	})
	t.Run("answered late", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var runs atomic.Int64
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), LockTimeout: lt}
			srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				<-r.Context().Done()
				w.WriteHeader(http.StatusCreated)
			}))
			for i, replayed := range []string{"", "true"} {
				w := send(srv)
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != replayed || runs.Load() != 1 {
					t.Fatalf("request %d: %d, replayed %q, runs %d; want 201, replayed %q, one run", i+1, w.Code, w.Header().Get("Idempotent-Replayed"), runs.Load(), replayed)
				}
			}
		})
	})
}

// TestHandlerAnsweredAfterItsLease: a handler that answers once its lease
// ended is saved as it answered, and the Logger is told, at Warn, that the
// run outlasted LockTimeout: during that time another request could have
// taken the claim over and run the handler again. A handler that answers
// within its lease gets no such record.
func TestHandlerAnsweredAfterItsLease(t *testing.T) {
	const lt = 5 * time.Second
	const want = `level=WARN msg="idempotency: handler returned after its lease ended; a retry could have taken its claim over and run it again" key=k lock_timeout=5s`
	for name, run := range map[string]time.Duration{"late": 2 * lt, "in time": lt / 2} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var buf bytes.Buffer
				mw := &testserver.Middleware{Store: new(testserver.MemoryStore), LockTimeout: lt,
					Logger: slog.New(slog.NewTextHandler(&buf, nil))}
				srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					<-time.After(run) // a handler that does not honour its context
					w.WriteHeader(http.StatusCreated)
				}))
				for i, replayed := range []string{"", "true"} {
					w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
					if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != replayed {
						t.Fatalf("request %d: %d, replayed %q; want 201, replayed %q", i+1, w.Code, w.Header().Get("Idempotent-Replayed"), replayed)
					}
				}
				if got := strings.Contains(buf.String(), want); got != (run > lt) {
					t.Errorf("handler ran %v of a %v lease; log has %q: %v, want %v:\n%s", run, lt, want, got, run > lt, buf.String())
				}
			})
		})
	}
}

// A request whose context ends before the claim (the caller hung up, or a
// deadline set by an outer handler passed) is not a store error, and the
// answer, if anyone still reads it, is a 503 problem: never an empty 200.
func TestContextEndedBeforeClaim(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	past, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	for name, ctx := range map[string]context.Context{"caller gone": cancelled, "deadline passed": past} {
		t.Run(name, func(t *testing.T) {
			h := &charges{}
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
			w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k").WithContext(ctx))
			if h.runs.Load() != 0 || mw.Stats().StoreErrors != 0 {
				t.Fatalf("runs %d, %+v; want no run and no store error", h.runs.Load(), mw.Stats())
			}
			wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
		})
	}
}

// ReplayHeaders chooses the saved headers, but never a cookie; a sniffed
// Content-Type is saved so the replay has the same one.
func TestReplayHeaders(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Cost", "3")
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("Location", "/x")
		io.WriteString(w, "<html><body>done</body></html>")
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), ReplayHeaders: []string{"x-request-cost", "Set-Cookie", "Content-Type"}}
	srv := mw.Wrap(h)
	first := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	replay := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	if ct := replay.Header().Get("Content-Type"); ct != first.Header().Get("Content-Type") || !strings.HasPrefix(ct, "text/html") {
		t.Errorf("replay Content-Type %q, first %q; want the same sniffed text/html", ct, first.Header().Get("Content-Type"))
	}
	if replay.Header().Get("X-Request-Cost") != "3" || replay.Header().Get("Set-Cookie") != "" || replay.Header().Get("Location") != "" {
		t.Errorf("replay headers %v; want X-Request-Cost only, never Set-Cookie, Location not listed", replay.Header())
	}
	if replay.Code != 200 || replay.Body.String() != first.Body.String() {
		t.Errorf("replay %d %q; want 200 %q", replay.Code, replay.Body, first.Body)
	}
}

// TestReplaySafetyHeaders: by default a replay carries the headers that
// tell a browser how to treat the body, as the first answer did:
// X-Content-Type-Options (nosniff), which keeps it from sniffing a type
// the server did not declare, and Content-Disposition (attachment), which
// keeps it from rendering the body inline. The CORS headers are not
// replayed: they answer the request's Origin, and a CORS middleware
// outside Wrap sets them on each request, the replay's included, for its
// own Origin.
func TestReplaySafetyHeaders(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Disposition", `attachment; filename="receipt.txt"`)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "<html>receipt</html>")
	})
	cors := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			w.Header().Add("Vary", "Origin")
			next.ServeHTTP(w, r)
		})
	}
	srv := cors((&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h))
	first := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k", "Origin", "https://a.example"))
	replay := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k", "Origin", "https://b.example"))
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second request: %d %v; want a replay", replay.Code, replay.Header())
	}
	for _, name := range []string{"X-Content-Type-Options", "Content-Disposition"} {
		if got, want := replay.Header().Values(name), first.Header().Values(name); !slices.Equal(got, want) {
			t.Errorf("replay's %s: %q; want the first answer's, %q", name, got, want)
		}
	}
	if got := replay.Header().Get("Access-Control-Allow-Origin"); got != "https://b.example" {
		t.Errorf("replay's Access-Control-Allow-Origin: %q; want the one its own Origin gets, https://b.example", got)
	}
}

// Credential headers are never saved, even when listed in ReplayHeaders:
// a token the first answer handed out (X-Auth-Token, X-Api-Key) is sent
// to that caller only, and is neither in the store nor in any replay.
func TestReplayHeadersNeverSaveCredentials(t *testing.T) {
	const token = "tok_handed_out_once"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Cost", "3")
		w.Header().Set("X-Auth-Token", token)
		w.Header().Set("X-Api-Key", token)
		w.Header().Set("X-Session-Token", token)
		w.WriteHeader(http.StatusCreated)
	})
	store := new(testserver.MemoryStore)
	mw := &testserver.Middleware{Store: store, ReplayHeaders: []string{"X-Request-Cost", "X-Auth-Token", "x-api-key", "X-Session-Token"}}
	srv := mw.Wrap(h)
	first := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	if first.Header().Get("X-Auth-Token") != token {
		t.Fatalf("first answer headers %v; want the handler's, token included", first.Header())
	}
	replay := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	if replay.Header().Get("Idempotent-Replayed") != "true" || replay.Header().Get("X-Request-Cost") != "3" {
		t.Fatalf("replay headers %v; want a replay with X-Request-Cost", replay.Header())
	}
	for _, name := range []string{"X-Auth-Token", "X-Api-Key", "X-Session-Token"} {
		if v := replay.Header().Get(name); v != "" {
			t.Errorf("replay carries %s: %q; want credential headers never replayed", name, v)
		}
	}
	e, _, err := store.Claim(context.Background(), "", "k", "", testserver.Fence{Token: 1}, time.Now())
	if err != nil || e.Response == nil {
		t.Fatalf("stored entry %+v, %v; want the saved answer", e, err)
	}
	for name := range e.Response.Header {
		if name != "X-Request-Cost" && name != "Content-Type" {
			t.Errorf("the store saved header %s: %v", name, e.Response.Header[name])
		}
	}
}

// TestKeysEqualButForCase: two bodies whose JSON keys differ only in case
// and order are different requests for a Go handler (encoding/json keeps
// the last of such keys in a struct field), so they get different
// fingerprints: the second is refused with 422, not given the first's
// answer.
func TestKeysEqualButForCase(t *testing.T) {
	h := &charges{}
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	first := serve(mw.Wrap(h), request("POST", "/", `{"amount":5,"Amount":1000,"currency":"usd"}`, "Idempotency-Key", "k"))
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	second := serve(mw.Wrap(h), request("POST", "/", `{"Amount":1000,"amount":5,"currency":"usd"}`, "Idempotency-Key", "k"))
	wantProblem(t, second, http.StatusUnprocessableEntity, testserver.ProblemMismatch)
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times; want once", h.runs.Load())
	}
}

// countingWriter is an http.ResponseWriter that counts the body bytes
// written and never reads them.
type countingWriter struct {
	header http.Header
	status int
	n      int64
}

func (w *countingWriter) Header() http.Header { return w.header }
func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *countingWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += int64(len(p))
	return len(p), nil
}

// TestMaxSavedResponseAboveStoreLimit: with MaxSavedResponse above what
// SQLite can save in a row (1e9 bytes), an answer larger than that is
// still saved as the too-large marker, not tried whole by a Save that
// fails and leaves the claim in flight. The handler writes its body in one
// Write of a slice it never touches, which the Middleware streams without
// copying, so the test does not use a gigabyte of memory.
func TestMaxSavedResponseAboveStoreLimit(t *testing.T) {
	if math.MaxInt < 1<<32 {
		t.Skip("a body of 1e9 bytes needs a 64-bit address space")
	}
	const size = 1_000_000_001 // SQLite's default SQLITE_MAX_LENGTH, and a byte
	store, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var runs atomic.Int64
	mw := &testserver.Middleware{Store: store, MaxSavedResponse: math.MaxInt64}
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		w.Write(make([]byte, size))
	}))
	first := &countingWriter{header: make(http.Header)}
	srv.ServeHTTP(first, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	if first.status != http.StatusCreated || first.n != size {
		t.Fatalf("first answer %d with %d bytes; want 201 with %d", first.status, first.n, size)
	}
	replay := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	p := wantProblem(t, replay, 500, testserver.ProblemResponseTooLarge)
	if p.OriginalStatus != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("marker %+v after %d runs; want original status 201, one run", p, runs.Load())
	}
	if st := mw.Stats(); st.TooLarge != 1 || st.StoreErrors != 0 {
		t.Fatalf("%+v; want TooLarge 1, no store error", st)
	}
}

// TestStreamingHandler: a handler that flushes as it writes, as streaming
// handlers do, runs once under the Middleware. While its answer is buffered
// a Flush sends nothing (the answer goes out whole once saved, and a retry
// gets it again); once the answer is past MaxSavedResponse, and streamed,
// a Flush reaches the connection.
func TestStreamingHandler(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusCreated)
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush() // panics if w is no Flusher
		}
	})
	want := "data: 0\n\ndata: 1\n\ndata: 2\n\n"
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	for i := range 2 {
		w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if w.Code != 201 || w.Body.String() != want || runs.Load() != 1 {
			t.Fatalf("answer %d: %d %q after %d runs; want 201 %q, one run", i+1, w.Code, w.Body, runs.Load(), want)
		}
		if w.Flushed {
			t.Fatalf("answer %d was flushed before the handler ended; want it sent whole", i+1)
		}
	}

	mw = &testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: 12}
	w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
	if w.Code != 201 || w.Body.String() != want || !w.Flushed {
		t.Fatalf("streamed answer: %d %q, flushed %v; want 201 %q, flushed", w.Code, w.Body, w.Flushed, want)
	}
}

// TestNoSniffedTypeWhenEncoded: like net/http, the Middleware does not
// sniff a Content-Type from a body that has a Content-Encoding (it would
// name the compression, application/x-gzip, not the content), on the
// first answer nor on the replay.
func TestNoSniffedTypeWhenEncoded(t *testing.T) {
	gz := []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0} // gzip of ""
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for i := range 2 {
		resp := post(t, srv, "k").resp
		if ct, ok := resp.Header["Content-Type"]; resp.StatusCode != 200 || ok {
			t.Fatalf("answer %d: %s, Content-Type %q; want 200 and none, as net/http sends", i+1, resp.Status, ct)
		}
	}
}

// TestInvalidStatusCode: a handler that writes a status net/http refuses
// (outside 100 to 999) panics where it writes it, as it would without the
// Middleware: its caller gets 500 handler-failed, and no replay carries the
// status that net/http cannot send.
func TestInvalidStatusCode(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(1000) })
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), OnError: policy}
			for range 2 {
				w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				wantProblem(t, w, 500, testserver.ProblemHandlerFailed)
			}
		})
	}
}

// hangUpInClaim is a Store whose Claim is written, and then reported
// failed because the caller hung up meanwhile: a commit that outlived the
// request's context.
type hangUpInClaim struct {
	testserver.Store
	cancel context.CancelFunc
}

func (s hangUpInClaim) Claim(ctx context.Context, scope, key, fp string, token testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if _, _, err := s.Store.Claim(context.WithoutCancel(ctx), scope, key, fp, token, now); err != nil {
		return testserver.Entry{}, false, err
	}
	s.cancel()
	return testserver.Entry{}, false, ctx.Err()
}

// TestCallerHangingUpDuringClaim: a claim the store made although the
// caller hung up while it was written is released, so that the retry runs
// at once rather than meet 409 until the lease ends.
func TestCallerHangingUpDuringClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		first := (&testserver.Middleware{Store: hangUpInClaim{store, cancel}}).Wrap(h)
		serve(first, request("POST", "/", chargeBody, "Idempotency-Key", "k").WithContext(ctx))
		retry := serve((&testserver.Middleware{Store: store}).Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if retry.Code != http.StatusCreated || runs.Load() != 1 {
			t.Fatalf("retry after the caller hung up during its claim: %d %s, %d runs; want 201 from one run", retry.Code, retry.Body, runs.Load())
		}
	})
}

// lostAnswerClaim is a Store whose first Claim is written, and then
// reported failed, as a connection lost while the claim committed is (a
// PostgreSQL session terminated, a restart).
type lostAnswerClaim struct {
	testserver.Store
	calls *atomic.Int32
}

var errConnLost = errors.New("unexpected EOF")

func (s lostAnswerClaim) Claim(ctx context.Context, scope, key, fp string, token testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	e, claimed, err := s.Store.Claim(ctx, scope, key, fp, token, now)
	if err == nil && s.calls.Add(1) == 1 {
		return testserver.Entry{}, false, errConnLost
	}
	return e, claimed, err
}

// TestClaimWhoseAnswerWasLost: a claim the store made although it
// reported a failure (its answer lost with the connection) is released,
// fenced by its token, so that the retry runs at once rather than meet
// 409 until the lease ends; the failed request is answered 503, as any
// store failure.
func TestClaimWhoseAnswerWasLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		h := &charges{}
		srv := (&testserver.Middleware{Store: lostAnswerClaim{store, new(atomic.Int32)}}).Wrap(h)
		wantProblem(t, serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k")), http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
		retry := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if retry.Code != http.StatusCreated || h.runs.Load() != 1 {
			t.Fatalf("retry after a claim whose answer was lost: %d %s, %d runs; want 201 from one run", retry.Code, retry.Body, h.runs.Load())
		}
	})
}

// slowRelease is a Store whose Claim fails, as one whose database is
// down does, and whose Release waits until answered is closed (the 503
// has reached its caller) or its context ends.
type slowRelease struct {
	testserver.Store
	answered chan struct{}
	released chan error // the context's error when Release stopped waiting
}

func (s slowRelease) Claim(context.Context, string, string, string, testserver.Fence, time.Time) (testserver.Entry, bool, error) {
	return testserver.Entry{}, false, errConnLost
}

func (s slowRelease) Release(ctx context.Context, scope, key string, token testserver.Fence) (bool, error) {
	select {
	case <-s.answered:
		s.released <- nil
	case <-ctx.Done():
		s.released <- ctx.Err()
	}
	return false, errConnLost
}

// TestStoreFailureAnsweredBeforeTheRelease: the release that follows a
// failed Claim (in case the claim was made and its answer lost) runs after
// the 503 has reached its caller, on a connection that is then closed:
// with the store down, that release may wait as long as any store write,
// and the caller, who would get the same 503, waited for it too.
func TestStoreFailureAnsweredBeforeTheRelease(t *testing.T) {
	store := slowRelease{new(testserver.MemoryStore), make(chan struct{}), make(chan error, 1)}
	srv := httptest.NewServer((&testserver.Middleware{Store: store, Logger: slog.New(slog.DiscardHandler)}).Wrap(&charges{}))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(chargeBody))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	close(store.answered)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), testserver.ProblemStoreUnavailable) {
		t.Fatalf("got %d %q, %v; want the 503 of a store failure", resp.StatusCode, body, err)
	}
	if err := <-store.released; err != nil {
		t.Fatalf("the release stopped with %v before the caller had its answer; want the answer first", err)
	}
	if !resp.Close {
		t.Error("the connection stays open; want it closed, as the release may hold it")
	}
}

// releaseSeesAnswer is a Store whose Claim fails, as one whose database is
// down does, and whose Release records whether the answer had been written
// by then.
type releaseSeesAnswer struct {
	testserver.Store
	w        *httptest.ResponseRecorder
	answered *bool
}

func (s releaseSeesAnswer) Claim(context.Context, string, string, string, testserver.Fence, time.Time) (testserver.Entry, bool, error) {
	return testserver.Entry{}, false, errConnLost
}

func (s releaseSeesAnswer) Release(context.Context, string, string, testserver.Fence) (bool, error) {
	*s.answered = s.w.Body.Len() > 0
	return false, errConnLost
}

// TestStoreFailureOverHTTP2KeepsTheConnection: over HTTP/2 too the 503 of
// a failed Claim is written before the release, but without Connection:
// close, which net/http's HTTP/2 server takes for a GOAWAY that ends the
// connection and every other stream's use of it, where an HTTP/1.1
// connection, held until the release returns, must be closed.
func TestStoreFailureOverHTTP2KeepsTheConnection(t *testing.T) {
	for _, major := range []int{1, 2} {
		var answered bool
		w := httptest.NewRecorder()
		store := releaseSeesAnswer{new(testserver.MemoryStore), w, &answered}
		r := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")
		r.ProtoMajor, r.ProtoMinor = major, 0
		(&testserver.Middleware{Store: store, Logger: slog.New(slog.DiscardHandler)}).Wrap(&charges{}).ServeHTTP(w, r)
		wantProblem(t, w, http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
		want := map[int]string{1: "close", 2: ""}[major]
		if got := w.Header().Get("Connection"); got != want || !answered {
			t.Errorf("HTTP/%d: Connection %q, answered before the release %v; want %q, true", major, got, answered, want)
		}
	}
}

// lostTakeOver is a Store whose TakeOver is written and then reported
// failed: its answer lost with the connection (pgstore's TakeOver then
// reports an error, not a win), or, with cancel set, its caller hung up
// while the store wrote.
type lostTakeOver struct {
	testserver.Store
	cancel context.CancelFunc
}

func (s lostTakeOver) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	if _, err := s.Store.TakeOver(context.WithoutCancel(ctx), scope, key, old, new); err != nil {
		return false, err
	}
	if s.cancel != nil {
		s.cancel()
		return false, ctx.Err()
	}
	return false, errConnLost
}

// TestTakeOverWhoseAnswerWasLost: a take-over the store made although it
// reported a failure (its answer lost, or its caller hung up) holds the
// claim of a run that may have done the work. It is left in flight, and
// taken over again once stale, so that the handler runs with TakenOver
// set and reconciles; released, the retry would claim the key afresh and
// run the handler as a first run, without TakenOver.
func TestTakeOverWhoseAnswerWasLost(t *testing.T) {
	for name, hangUp := range map[string]bool{"answer lost": false, "caller hung up": true} {
		t.Run(name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, store testserver.Store) {
				const lt = time.Minute
				clk := newClock()
				fp := testserver.Fingerprint(request("POST", "/", chargeBody), "", []byte(chargeBody))
				// A worker claimed the key, may have done the work, and died.
				if _, _, err := store.Claim(context.Background(), "", "k", fp, fenceAt(clk.Now()), clk.Now()); err != nil {
					t.Fatal(err)
				}
				clk.Add(lt)
				var mu sync.Mutex
				var takenOver []bool // Claim.TakenOver of each run
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					c, _ := testserver.ClaimFrom(r.Context())
					mu.Lock()
					takenOver = append(takenOver, c.TakenOver)
					mu.Unlock()
					w.WriteHeader(http.StatusCreated)
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				lost := lostTakeOver{Store: store}
				if hangUp {
					lost.cancel = cancel
				}
				first := &testserver.Middleware{Store: lost, LockTimeout: lt, Now: clk.Now}
				wantProblem(t, serve(first.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k").WithContext(ctx)),
					http.StatusServiceUnavailable, testserver.ProblemStoreUnavailable)
				mw := &testserver.Middleware{Store: store, LockTimeout: lt, Now: clk.Now}
				wantProblem(t, serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")), http.StatusConflict, testserver.ProblemInFlight)
				clk.Add(lt)
				retry := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
				mu.Lock()
				defer mu.Unlock()
				if retry.Code != http.StatusCreated || !slices.Equal(takenOver, []bool{true}) {
					t.Fatalf("retry once the take-over is stale: %d %s, runs with TakenOver %v; want 201 from one run with TakenOver set",
						retry.Code, retry.Body, takenOver)
				}
			})
		})
	}
}

// duplicateKey marks the context of the duplicate request that
// hangUpOnDuplicate hangs up.
type duplicateKey struct{}

// hangUpOnDuplicate is a Store whose Claim, for a request whose context
// carries duplicateKey, claims and then fails as its caller hangs up.
type hangUpOnDuplicate struct{ testserver.Store }

func (s hangUpOnDuplicate) Claim(ctx context.Context, scope, key, fp string, token testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if cancel, ok := ctx.Value(duplicateKey{}).(context.CancelFunc); ok {
		return hangUpInClaim{s.Store, cancel}.Claim(ctx, scope, key, fp, token, now)
	}
	return s.Store.Claim(ctx, scope, key, fp, token, now)
}

// TestDuplicateHangingUpDuringClaim: a request delivered twice at once (a
// proxy that duplicates it on two connections) while the clock reads the
// same for both, whose duplicate's caller hangs up while the store looks
// at the key, leaves the first's claim alone: the release of the claim the
// duplicate may have made is fenced by a claim of its own, and a retry
// finds the key in flight rather than run the handler a second time. So it
// is when the duplicate reaches another server on the same store, whose
// clock reads the same (a coarse clock, or clocks kept in step), and so
// draws the same token: at any reading, the earliest included.
func TestDuplicateHangingUpDuringClaim(t *testing.T) {
	readings := map[string]time.Time{
		"coarse clock":      newClock().Now(),
		"clock before 1678": time.Unix(0, math.MinInt64),
	}
	for name, servers := range map[string]int{"one server": 1, "two servers": 2} {
		for reading, at := range readings {
			t.Run(name+"/"+reading, func(t *testing.T) {
				eachStore(t, func(t *testing.T, store testserver.Store) {
					var runs atomic.Int64
					started, finish := make(chan struct{}), make(chan struct{})
					h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if runs.Add(1) == 1 {
							close(started)
							<-finish
						}
						w.WriteHeader(http.StatusCreated)
					})
					clk := &clock{now: at} // reads the same for every request
					first := &testserver.Middleware{Store: hangUpOnDuplicate{store}, Now: clk.Now}
					other := first
					if servers == 2 {
						other = &testserver.Middleware{Store: hangUpOnDuplicate{store}, Now: clk.Now}
					}
					var wg sync.WaitGroup
					var w *httptest.ResponseRecorder
					wg.Go(func() { w = serve(first.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")) })
					<-started
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					dup := request("POST", "/", chargeBody, "Idempotency-Key", "k")
					serve(other.Wrap(h), dup.WithContext(context.WithValue(ctx, duplicateKey{}, cancel)))
					retry := serve(other.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
					close(finish)
					wg.Wait()
					if runs.Load() != 1 || retry.Code != http.StatusConflict || w.Code != http.StatusCreated {
						t.Fatalf("handler ran %d times; first %d, retry %d %s; want one run, 201, and 409 for the retry while it ran",
							runs.Load(), w.Code, retry.Code, retry.Body)
					}
				})
			})
		}
	}
}

// failingRelease is a Store whose Release fails.
type failingRelease struct{ testserver.Store }

func (failingRelease) Release(context.Context, string, string, testserver.Fence) (bool, error) {
	return false, errDown
}

// TestReleaseErrors: a Release that fails is a store error, counted in
// Stats.StoreErrors, whichever release it is: the one after a handler's
// error answer or panic (ReleaseClaim), or that of a claim whose handler
// never runs, made too late for its lease, while its caller hung up, or
// by a Claim that failed.
func TestReleaseErrors(t *testing.T) {
	fail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	panics := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })
	for _, tc := range []struct {
		name string
		h    http.Handler
		want int
	}{
		{"error answer", fail, http.StatusServiceUnavailable},
		{"panic", panics, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := &testserver.Middleware{Store: failingRelease{new(testserver.MemoryStore)}, Logger: slog.New(slog.DiscardHandler)}
			if w := serve(mw.Wrap(tc.h), request("POST", "/", chargeBody, "Idempotency-Key", "k")); w.Code != tc.want {
				t.Fatalf("status %d (%s); want the handler's %d", w.Code, w.Body, tc.want)
			}
			if st := mw.Stats(); st.StoreErrors != 1 || st.Released != 0 {
				t.Fatalf("%+v; want one store error, nothing released", st)
			}
		})
	}
	t.Run("claim slower than the lease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const lt = time.Minute
			h := &charges{}
			store := failingRelease{&slowClaimStore{MemoryStore: new(testserver.MemoryStore), delay: lt + time.Second}}
			mw := &testserver.Middleware{Store: store, LockTimeout: lt}
			wantProblem(t, serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")), 503, testserver.ProblemStoreUnavailable)
			// The claim that came too late, and its release.
			if st := mw.Stats(); h.runs.Load() != 0 || st.StoreErrors != 2 {
				t.Fatalf("runs %d, %+v; want no run, two store errors", h.runs.Load(), st)
			}
		})
	})
	t.Run("claim failed", func(t *testing.T) {
		h := &charges{}
		mw := &testserver.Middleware{Store: failingRelease{&failingStore{claim: true}}, Logger: slog.New(slog.DiscardHandler)}
		wantProblem(t, serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k")), 503, testserver.ProblemStoreUnavailable)
		// The claim, and the release of what it may have made all the same.
		if st := mw.Stats(); h.runs.Load() != 0 || st.StoreErrors != 2 {
			t.Fatalf("runs %d, %+v; want no run, two store errors", h.runs.Load(), st)
		}
	})
	t.Run("caller hung up during the claim", func(t *testing.T) {
		h := &charges{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mw := &testserver.Middleware{Store: hangUpInClaim{failingRelease{new(testserver.MemoryStore)}, cancel}}
		serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k").WithContext(ctx))
		// The caller hanging up is not a store error; the release's failure is.
		if st := mw.Stats(); h.runs.Load() != 0 || st.StoreErrors != 1 {
			t.Fatalf("runs %d, %+v; want no run, one store error", h.runs.Load(), st)
		}
	})
}

// losingTakeOver is a store whose every take-over is lost to another
// request: the claim it finds stays stale.
type losingTakeOver struct{ *testserver.MemoryStore }

func (losingTakeOver) TakeOver(context.Context, string, string, testserver.Fence, testserver.Fence) (bool, error) {
	return false, nil
}

// TestLostTakeOversLogged: a request that loses every take-over race it
// runs answers 409, counts a conflict and, as every decision, logs it.
func TestLostTakeOversLogged(t *testing.T) {
	clk := newClock()
	store := losingTakeOver{new(testserver.MemoryStore)}
	r := request("POST", "/v1/charges", chargeBody, "Idempotency-Key", "k")
	fp := testserver.Fingerprint(r, "", []byte(chargeBody))
	if _, _, err := store.Claim(context.Background(), "", "k", fp, fenceAt(clk.Now()), clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Add(testserver.DefaultLockTimeout)
	var buf bytes.Buffer
	mw := &testserver.Middleware{Store: store, Now: clk.Now,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	h := &charges{}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	req, err := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(chargeBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := mw.Stats(); resp.StatusCode != http.StatusConflict || h.runs.Load() != 0 || s.Conflicts != 1 || s.Takeovers != 0 {
		t.Fatalf("%d, runs %d, %+v; want 409, no run, one conflict", resp.StatusCode, h.runs.Load(), s)
	}
	if want := `msg="idempotency: in flight" key=k retry_after=1`; !strings.Contains(buf.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, buf.String())
	}
}
