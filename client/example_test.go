package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// paymentsServer is a stand-in for a payments API: it charges once per
// Idempotency-Key and replays the answer to retries. Its first
// failFirst answers are 503.
func paymentsServer(failFirst int64) *httptest.Server {
	var n atomic.Int64
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	charge := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= failFirst {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		charge.ServeHTTP(w, r)
	}))
}

// oneAttempt returns a payments server whose first answer is a 503, and a
// Client over a jar in memory that sends each call once: its first call
// stays pending.
func oneAttempt(ctx context.Context) (*httptest.Server, *client.Client) {
	c, err := client.New(ctx, "", &client.Options{Jar: &idem.MemoryJar{}, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		log.Fatal(err)
	}
	return paymentsServer(1), c
}

// A Client over a jar file: the key of "charge:order-42" is in the file
// before the first send, so a program that restarts and makes the same
// call sends the same key, and the server replays its first answer.
func ExampleNew() {
	srv := paymentsServer(0)
	defer srv.Close()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "client-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keys.db") // created with mode 0600

	var keys []string
	for run := 1; run <= 2; run++ { // the second run is the program restarted
		c, err := client.New(ctx, path, nil)
		if err != nil {
			log.Fatal(err)
		}
		resp, err := c.PostJSON(ctx, "charge:order-42", srv.URL+"/charges", map[string]any{"amount": 1000}, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("run", run, resp.StatusCode, "replayed:", resp.Replayed)
		keys = append(keys, resp.Key)
		if err := c.Close(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("same key:", keys[0] == keys[1])
	// Output:
	// run 1 201 replayed: false
	// run 2 201 replayed: true
	// same key: true
}

func ExampleClient_PostJSON() {
	srv := paymentsServer(0)
	defer srv.Close()
	ctx := context.Background()

	// A real program gives a jar file path instead of an in-memory jar:
	// client.New(ctx, "keys.db", opts).
	c, err := client.New(ctx, "", &client.Options{
		Jar: &idem.MemoryJar{},
		Header: func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer sk_test_123") // never stored in the jar
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	in := map[string]any{"order": "order-42", "amount": 1000}
	var out struct{ ID, Status string }
	for range 2 {
		resp, err := c.PostJSON(ctx, "charge:order-42", srv.URL+"/charges", in, &out)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, out.ID, out.Status, "replayed:", resp.Replayed)
	}
	// Output:
	// 201 ch_1 succeeded replayed: false
	// 201 ch_1 succeeded replayed: true
}

func ExampleClient_Resume() {
	ctx := context.Background()
	srv, c := oneAttempt(ctx) // the first attempt fails, and is not retried
	defer srv.Close()
	defer c.Close()

	_, err := c.PostJSON(ctx, "charge:order-7", srv.URL+"/charges", map[string]any{"order": "order-7", "amount": 500}, nil)
	fmt.Println("outcome unknown:", errors.Is(err, idem.ErrPending))

	// Later, or after a restart: resume what is pending, with the same key.
	pending, err := c.Pending(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, rec := range pending {
		fmt.Printf("%s: %d attempt(s), last status %d\n", rec.Op, rec.Attempts, rec.LastStatus)
		var out struct{ ID, Status string }
		resp, err := c.ResumeJSON(ctx, rec.Op, &out) // or Resume, to read the answer yourself
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("resumed:", resp.StatusCode, out.Status, "same key:", resp.Key == rec.Key)
	}
	// Output:
	// outcome unknown: true
	// charge:order-7: 1 attempt(s), last status 503
	// resumed: 201 succeeded same key: true
}

// Every answer that is not 2xx is a *StatusError with its status and body.
// Its Err says what the answer means for the operation: errors.Is matches
// idem.ErrPending when the call got no answer (call it again later under
// the name; the *idem.PendingError's State is pending here, a new
// operation, which Resume also sends) and
// idem.ErrMismatch when the server refused the request with 422 (a key
// reused with another request, or a request the API will not process: do
// not retry it under this key); any other answer is final.
func ExampleStatusError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/busy":
			w.Header().Set("Retry-After", "120") // longer than Policy.MaxRetryAfter: not waited for
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/reused":
			w.WriteHeader(http.StatusUnprocessableEntity)
		default:
			http.Error(w, "no such order", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	c, err := client.New(ctx, "", &client.Options{Jar: &idem.MemoryJar{}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for _, path := range []string{"/busy", "/reused", "/orders/none"} {
		_, err := c.PostJSON(ctx, "charge:order-42"+path, srv.URL+path, map[string]any{"amount": 4200}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) {
			log.Fatal(err) // no answer: an *idem.PendingError, *idem.ReconcileError, …
		}
		var pending *idem.PendingError
		switch {
		case errors.As(err, &pending):
			fmt.Println(se.StatusCode, "outcome unknown: resume it in", time.Until(pending.NextAttempt).Round(time.Minute))
		case errors.Is(err, idem.ErrMismatch):
			fmt.Println(se.StatusCode, "refused: do not retry it under this key")
		default:
			fmt.Printf("%d final: %s", se.StatusCode, se.Body)
		}
	}
	// Output:
	// 503 outcome unknown: resume it in 2m0s
	// 422 refused: do not retry it under this key
	// 404 final: no such order
}

// A Header that adds a credential for the API it is meant for, and refuses
// any other host: Resume sends the URL the jar holds, which whoever can
// write the jar can change. Refused, nothing is sent, and the operation
// stays pending.
func ExampleOptions_header() {
	api := paymentsServer(0)
	defer api.Close()
	var reached atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
	defer elsewhere.Close()

	known, err := url.Parse(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	c, err := client.New(ctx, "", &client.Options{Jar: &idem.MemoryJar{}, Policy: retry.Policy{MaxAttempts: 1},
		Header: func(r *http.Request) error {
			// r.Host, when set, is the Host a resume sends (see idem.Record).
			if r.URL.Scheme != known.Scheme || r.URL.Host != known.Host || (r.Host != "" && r.Host != known.Host) {
				return fmt.Errorf("no credential for %s://%s", r.URL.Scheme, r.URL.Host)
			}
			r.Header.Set("Authorization", "Bearer sk_test_123")
			return nil
		}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	resp, err := c.PostJSON(ctx, "charge:order-7", api.URL+"/charges", map[string]any{"amount": 500}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("to the API:", resp.StatusCode)

	// An operation whose URL names another host, as one another program
	// wrote into the jar: neither the call nor its resume sends it.
	_, err = c.PostJSON(ctx, "charge:order-8", elsewhere.URL+"/charges", map[string]any{"amount": 500}, nil)
	fmt.Println("elsewhere, pending:", errors.Is(err, idem.ErrPending))
	_, err = c.Resume(ctx, "charge:order-8")
	fmt.Println("resumed, pending:", errors.Is(err, idem.ErrPending), "requests that reached it:", reached.Load())
	// Output:
	// to the API: 201
	// elsewhere, pending: true
	// resumed, pending: true requests that reached it: 0
}

// An operation whose outcome stays unknown is reconciled: the caller asks
// the server what happened. When the charge is not there, and the request
// is not running, Abandon records it, and the next call under the name is
// a new operation, sent with a new key.
func ExampleClient_Abandon() {
	ctx := context.Background()
	srv, c := oneAttempt(ctx) // the first attempt fails, and is not retried
	defer srv.Close()
	defer c.Close()

	order := map[string]any{"order": "order-7", "amount": 500}
	_, err := c.PostJSON(ctx, "charge:order-7", srv.URL+"/charges", order, nil)
	fmt.Println("outcome unknown:", errors.Is(err, idem.ErrPending))
	first, err := c.Jar().Get(ctx, "charge:order-7")
	if err != nil {
		log.Fatal(err)
	}

	// The server's ledger has no charge for order-7: it did not happen.
	if err := c.Abandon(ctx, "charge:order-7", "no charge for order-7 in the ledger"); err != nil {
		log.Fatal(err)
	}
	resp, err := c.PostJSON(ctx, "charge:order-7", srv.URL+"/charges", order, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("charged again:", resp.StatusCode, "new key:", resp.Key != first.Key)
	// Output:
	// outcome unknown: true
	// charged again: 201 new key: true
}
