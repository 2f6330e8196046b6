package idem_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
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
