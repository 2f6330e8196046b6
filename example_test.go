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
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// A server that is busy once (409), then answers. The Transport retries
// with the same key; the caller sees one response.
func ExampleTransport() {
	var calls atomic.Int32
	keys := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if calls.Add(1) == 1 {
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
	first, second := <-keys, <-keys
	fmt.Println(resp.StatusCode, calls.Load(), "attempts, same key:", first == second)
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
		// The stored header has no credentials: add them here.
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
	// next run: charge:order-42 201 {"id":"ch_1"} replayed: true
	// charges: 1
}
