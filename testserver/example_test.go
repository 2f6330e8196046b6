package testserver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/testserver"
	_ "modernc.org/sqlite"
)

func ExampleMiddleware() {
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(charge))
	defer srv.Close()

	send := func(key, body string) {
		req, err := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			panic(err)
		}
		if resp.StatusCode >= 400 {
			b = []byte(resp.Header.Get("Content-Type"))
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	send("order-42", `{"amount": 1000, "currency": "usd"}`)
	send("order-42", `{"currency": "usd", "amount": 1000}`) // same JSON, other order: a replay
	send("order-42", `{"amount": 2000, "currency": "usd"}`) // the key reused for another charge
	send("", `{"amount": 1000, "currency": "usd"}`)         // no key
	fmt.Println("charges:", charges.Load())
	s := mw.Stats()
	fmt.Println("claims:", s.Claims, "replays:", s.Replays, "mismatches:", s.Mismatches, "rejected:", s.Rejected)
	// Output:
	// 201 replayed="" {"id":"ch_1"}
	// 201 replayed="true" {"id":"ch_1"}
	// 422 replayed="" application/problem+json
	// 400 replayed="" application/problem+json
	// charges: 1
	// claims: 1 replays: 1 mismatches: 1 rejected: 1
}

func ExampleParseKey() {
	for _, v := range []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`, `"order-42"`, `"a", "b"`, ""} {
		key, err := testserver.ParseKey(v)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "order-42" <nil>
	// "" testserver: invalid Idempotency-Key "\"a\", \"b\"": text follows the closing quote; send exactly one key
	// "" testserver: invalid Idempotency-Key "": the key is empty; send 1 to 255 printable ASCII characters, e.g. a UUID
}

// A handler that writes its order with the claim's scope and key, under
// the table's primary key, and fences each of its writes on the claim's
// token. The first run's call to the payment processor stalls past its
// lease; the retry takes the claim over, takes the order over with its
// greater token, and charges under the processor's key for the order. The
// first run's call then fails, and its late write of the failure changes
// nothing: the order stays charged, once.
func ExampleClaimFrom() {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // each connection to :memory: is a database of its own
	if _, err := db.Exec(`CREATE TABLE orders (scope TEXT NOT NULL, key TEXT NOT NULL,
		token INTEGER NOT NULL, status TEXT NOT NULL, PRIMARY KEY (scope, key))`); err != nil {
		log.Fatal(err)
	}

	// The processor charges once per key. Its first call stalls, then
	// times out.
	var mu sync.Mutex
	charged := map[string]bool{}
	stalled, resume := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	charge := func(ctx context.Context, key string) error {
		if calls.Add(1) == 1 {
			close(stalled)
			<-resume
			return errors.New("processor timed out")
		}
		mu.Lock()
		defer mu.Unlock()
		charged[key] = true
		return nil
	}

	order := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := testserver.ClaimFrom(r.Context())
		if !ok {
			http.Error(w, "send an Idempotency-Key", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		// One order per scope and key. A run that took over finds the
		// order of the run before and takes it over too: its token is
		// greater. A run that was taken over finds a greater token and
		// gets no row; it answers 503 (see Claim.Token), and its caller
		// gets the Middleware's 409.
		var status string
		err := db.QueryRowContext(ctx, `INSERT INTO orders (scope, key, token, status) VALUES (?, ?, ?, 'new')
			ON CONFLICT (scope, key) DO UPDATE SET token = excluded.token WHERE orders.token <= excluded.token
			RETURNING status`, c.Scope, c.Key, c.Token).Scan(&status)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			http.Error(w, "a later run holds the order", http.StatusServiceUnavailable)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// An earlier run (c.TakenOver, or one that failed) may have
		// charged: the processor's key makes a second call safe.
		if status != "charged" {
			status = "charged"
			if err := charge(ctx, "charge:"+c.Key); err != nil {
				status = "failed"
			}
			res, err := db.ExecContext(ctx, `UPDATE orders SET status = ? WHERE scope = ? AND key = ? AND token = ?`,
				status, c.Scope, c.Key, c.Token)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				http.Error(w, "a later run holds the order", http.StatusServiceUnavailable)
				return
			}
		}
		if status == "failed" {
			http.Error(w, "the processor failed", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %s charged, taken over: %v", c.Key, c.TakenOver)
	})

	var now atomic.Int64 // the Middleware's clock, in Unix nanoseconds
	now.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Now: func() time.Time { return time.Unix(0, now.Load()) }}
	srv := mw.Wrap(order)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(`{"amount":1000}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}

	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- send() }()
	<-stalled
	now.Add(int64(testserver.DefaultLockTimeout)) // the first run's lease ends
	retry := send()
	fmt.Println("retry:", retry.Code, retry.Body)
	close(resume)
	fmt.Println("first:", (<-first).Code)
	again := send()
	fmt.Println("again:", again.Code, again.Body, "replayed:", again.Header().Get("Idempotent-Replayed"))
	var status string
	if err := db.QueryRow(`SELECT status FROM orders WHERE key = 'order-42'`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order:", status, "charges:", len(charged), "processor calls:", calls.Load())
	// Output:
	// retry: 201 order order-42 charged, taken over: true
	// first: 409
	// again: 201 order order-42 charged, taken over: true replayed: true
	// order: charged charges: 1 processor calls: 2
}
