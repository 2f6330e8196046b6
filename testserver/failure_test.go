package testserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// TestFailureAnswersToTheTransport: what the package doc tells a handler
// to answer for a failure, seen by idem.Transport in front of the
// Middleware under its default ErrorPolicy. The handler fails its first
// run of each path as the path says and answers 201 on the next: a 503
// (with Retry-After) is retried with the same key and runs the handler
// again, a 500 is returned and not retried, and an aborted answer
// (http.ErrAbortHandler, a body shorter than its Content-Length) is
// retried as a network error.
func TestFailureAnswersToTheTransport(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs[r.URL.Path]++
		first := runs[r.URL.Path] == 1
		mu.Unlock()
		if first {
			switch r.URL.Path {
			case "/unavailable":
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			case "/internal-error":
				w.WriteHeader(http.StatusInternalServerError)
				return
			case "/abort":
				panic(http.ErrAbortHandler)
			case "/short":
				w.Header().Set("Content-Length", "100")
				io.WriteString(w, "short")
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer((&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h))
	defer srv.Close()
	hc := &http.Client{Transport: &idem.Transport{Jar: new(idem.MemoryJar), Base: srv.Client().Transport,
		Policy: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}}}
	for path, want := range map[string]struct{ status, runs int }{
		"/unavailable":    {http.StatusCreated, 2},
		"/internal-error": {http.StatusInternalServerError, 1},
		"/abort":          {http.StatusCreated, 2},
		"/short":          {http.StatusCreated, 2},
	} {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+path, strings.NewReader(chargeBody))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		mu.Lock()
		n := runs[path]
		mu.Unlock()
		if resp.StatusCode != want.status || n != want.runs {
			t.Errorf("%s: %s after %d runs; want %d after %d", path, resp.Status, n, want.status, want.runs)
		}
	}
}
