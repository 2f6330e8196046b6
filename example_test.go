package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// A server that is busy once (409), then answers. The Transport retries
// with the same key; the caller sees one response.
func ExampleTransport() {
	var (
		mu   sync.Mutex
		keys []string // the Idempotency-Key of each attempt
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	hc := &http.Client{Transport: &idem.Transport{Jar: &idem.MemoryJar{}}}
	ctx := idem.WithOperation(context.Background(), "charge:order-42")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock() // each attempt's key was kept before its answer was sent
	defer mu.Unlock()
	fmt.Println(resp.StatusCode, len(keys), "attempts, same key:", len(keys) == 2 && keys[0] == keys[1])
	// Output: 201 2 attempts, same key: true
}

// Counting retries with Hooks, for a metric.
func ExampleHooks() {
	var calls, retries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	tr := &idem.Transport{
		Jar:    &idem.MemoryJar{},
		Policy: retry.Policy{InitialInterval: 1}, // retry at once, for the example
		Hooks: idem.Hooks{
			OnRetry: func(e idem.Event) { retries.Add(1) },
		},
	}
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", retries.Load(), "retries")
	// Output: 200 after 2 retries
}

// A program that stopped while its charge was in flight (killed, or out of
// attempts) resumes it on its next run: the operation is pending in the jar
// file, with its key and its request, and is sent again from there. The
// server ran the charge the first time and replays its answer. (Package
// client does the same with Client.Pending and Client.Resume.)
func ExampleRecord_NewRequest() {
	const token = "sk_test_example" // a credential, which the jar never keeps
	var charges atomic.Int32
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	charge := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, charges.Add(1))
	}))
	var lost atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !lost.Swap(true) { // the first answer is lost: the server charged
			charge.ServeHTTP(httptest.NewRecorder(), r)
			panic(http.ErrAbortHandler)
		}
		charge.ServeHTTP(w, r)
	}))
	defer srv.Close()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keys.db")
	ctx := context.Background()

	// The first run sends the charge once and stops, its outcome unknown.
	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		log.Fatal(err)
	}
	hc := &http.Client{Transport: &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}}
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "charge:order-42"),
		http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":4200}`))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token) // the server scopes keys by it
	_, err = hc.Do(req)
	fmt.Println("first run, outcome unknown:", errors.Is(err, idem.ErrPending))
	if err := jar.Close(); err != nil {
		log.Fatal(err)
	}

	// The next run sends every pending operation again, from its record.
	jar, err = keyjar.Open(ctx, path, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close()
	hc = &http.Client{Transport: &idem.Transport{Jar: jar}}
	pending, err := jar.List(ctx, idem.Filter{State: idem.StatePending})
	if err != nil {
		log.Fatal(err)
	}
	for _, rec := range pending {
		req, err := rec.NewRequest(ctx)
		if errors.Is(err, idem.ErrBodyNotStored) {
			continue // larger than MaxStoredBody: send it again with its body
		}
		if err != nil {
			log.Fatal(err)
		}
		// The stored header has no credentials: add those the first send
		// carried. Without its Authorization, this server would take the
		// request for a new one, and charge again.
		fmt.Println("next run:", rec.Op, "withheld:", rec.Withheld())
		for _, name := range rec.Withheld() {
			if name != "Authorization" {
				log.Fatalf("no credential for %s", name)
			}
			req.Header.Set(name, "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			log.Fatal(err) // an *idem.PendingError: still unknown, try on the next run
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("next run:", rec.Op, resp.StatusCode, string(body), "replayed:", retry.Replayed(resp))
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// first run, outcome unknown: true
	// next run: charge:order-42 withheld: [Authorization]
	// next run: charge:order-42 201 {"id":"ch_1"} replayed: true
	// charges: 1
}

// An operation is named by the caller. Every call under one name sends
// one key: the call made again (after a lost answer, or a restart, with a
// jar file) gets the server's saved answer instead of a second charge. A
// name called with another request is refused before anything is sent.
func ExampleWithOperation() {
	var (
		mu   sync.Mutex
		keys []string // the keys of the requests the server got since the last call
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	hc := &http.Client{Transport: &idem.Transport{Jar: &idem.MemoryJar{}}}

	seen := map[string]int{} // each key the server got, numbered
	for _, c := range []struct{ op, body string }{
		{"charge:order-42", `{"amount":4200}`},
		{"charge:order-42", `{"amount":4200}`}, // the same call again
		{"charge:order-43", `{"amount":4200}`},
		{"charge:order-42", `{"amount":9900}`}, // another request under a name in use
	} {
		ctx := idem.WithOperation(context.Background(), c.op)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(c.body))
		if err != nil {
			log.Fatal(err)
		}
		resp, err := hc.Do(req)
		if errors.Is(err, idem.ErrMismatch) {
			fmt.Println(c.op, c.body, "refused, nothing sent")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock() // each request's key was kept before its answer was sent
		sent := keys
		keys = nil
		mu.Unlock()
		for _, key := range sent {
			if seen[key] == 0 {
				seen[key] = len(seen) + 1
			}
			fmt.Println(c.op, c.body, "sent with key", seen[key])
		}
	}
	// Output:
	// charge:order-42 {"amount":4200} sent with key 1
	// charge:order-42 {"amount":4200} sent with key 1
	// charge:order-43 {"amount":4200} sent with key 2
	// charge:order-42 {"amount":9900} refused, nothing sent
}

// What a call's error tells the caller to do. A *PendingError: the outcome
// is unknown, and a later call under the same name resumes it with the
// same key. A *ReconcileError: the first send is older than the retry
// horizon (24 h by default); ask the server what happened before anything
// else. ErrMismatch: the name was first used for another request, a bug in
// the caller; nothing was sent. A *JarError: the jar failed before the
// send; nothing was sent.
func ExampleTransport_errors() {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // nothing listens there any more: every attempt is refused
	jar := &idem.MemoryJar{}
	call := func(policy retry.Policy, body string) error {
		hc := &http.Client{Transport: &idem.Transport{Jar: jar, Policy: policy}}
		ctx := idem.WithOperation(context.Background(), "charge:order-42")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, down.URL+"/charges", strings.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	handle := func(err error) {
		var pending *idem.PendingError
		var reconcile *idem.ReconcileError
		var jarErr *idem.JarError
		switch {
		case errors.As(err, &pending):
			fmt.Printf("%s: outcome unknown after %d attempt(s): call again later\n", pending.Op, pending.Attempts)
		case errors.As(err, &reconcile):
			fmt.Printf("%s: past the horizon after %d attempt(s): reconcile with the server\n", reconcile.Op, reconcile.Attempts)
		case errors.Is(err, idem.ErrMismatch):
			fmt.Println("another request under a name in use: nothing sent")
		case errors.As(err, &jarErr):
			fmt.Println("the jar failed: nothing sent")
		case err != nil:
			fmt.Println("not sent:", err) // the request itself, or the caller's context
		}
	}

	handle(call(retry.Policy{MaxAttempts: 2, InitialInterval: 1}, `{"amount":4200}`))
	handle(call(retry.Policy{}, `{"amount":9900}`))
	// The same call, as a day later: a horizon that has passed.
	handle(call(retry.Policy{Horizon: time.Nanosecond}, `{"amount":4200}`))
	// Output:
	// charge:order-42: outcome unknown after 2 attempt(s): call again later
	// another request under a name in use: nothing sent
	// charge:order-42: past the horizon after 2 attempt(s): reconcile with the server
}

// ExampleFilter walks a jar's pending operations in pages of two, each
// page after the last record of the one before: operations created at the
// same time are each listed once, and one forgotten between two pages, the
// one the next page starts after included, changes nothing else.
func ExampleFilter() {
	ctx := context.Background()
	jar := &idem.MemoryJar{}
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i, op := range []string{"charge:e", "charge:d", "charge:c", "charge:b", "charge:a"} {
		created := at.Add(time.Duration(i/2) * time.Second) // two by two at the same time
		if _, _, err := jar.Begin(ctx, idem.Record{Op: op, Key: "key-" + op, Method: "POST", URL: "https://api.example.com/charges", Created: created}); err != nil {
			log.Fatal(err)
		}
	}
	f := idem.Filter{State: idem.StatePending, Limit: 2}
	for {
		page, err := jar.List(ctx, f)
		if err != nil {
			log.Fatal(err)
		}
		for _, r := range page {
			fmt.Println(r.Created.Format(time.TimeOnly), r.Op)
		}
		if len(page) < f.Limit {
			break
		}
		f.After = page[len(page)-1].Cursor()
		if err := jar.Forget(ctx, page[len(page)-1].Op); err != nil { // deleted meanwhile
			log.Fatal(err)
		}
	}
	// Output:
	// 12:00:00 charge:d
	// 12:00:00 charge:e
	// 12:00:01 charge:b
	// 12:00:01 charge:c
	// 12:00:02 charge:a
}

// breaker is a base transport with a circuit breaker: once open, it sends
// nothing, and says so with idem.ErrNotSent.
type breaker struct {
	base http.RoundTripper
	open atomic.Bool
}

func (b *breaker) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.open.Load() {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, fmt.Errorf("circuit breaker open: %w", idem.ErrNotSent)
	}
	return b.base.RoundTrip(r)
}

// A base transport that refuses an attempt before sending any of it wraps
// its error in ErrNotSent: the Transport neither counts nor retries the
// attempt, and the operation stays pending, to be resumed once the
// breaker closes.
func ExampleErrNotSent() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	jar := &idem.MemoryJar{}
	b := &breaker{base: http.DefaultTransport}
	b.open.Store(true)
	hc := &http.Client{Transport: &idem.Transport{Jar: jar, Base: b}}
	ctx := idem.WithOperation(context.Background(), "charge:order-42")
	send := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":4200}`))
		if err != nil {
			log.Fatal(err)
		}
		return hc.Do(req)
	}

	_, err := send()
	rec, _ := jar.Get(ctx, "charge:order-42")
	fmt.Println("not sent:", errors.Is(err, idem.ErrNotSent), "pending:", errors.Is(err, idem.ErrPending), "attempts:", rec.Attempts)

	b.open.Store(false)
	resp, err := send()
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	rec, _ = jar.Get(ctx, "charge:order-42")
	fmt.Println("then:", resp.StatusCode, rec.State, "attempts:", rec.Attempts)
	// Output:
	// not sent: true pending: true attempts: 0
	// then: 201 done attempts: 1
}
