package testserver_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/testserver"
)

// endlessBody counts the bytes read from an endless request body.
type endlessBody struct{ n atomic.Int64 }

func (b *endlessBody) Read(p []byte) (int, error) {
	clear(p)
	b.n.Add(int64(len(p)))
	return len(p), nil
}

func (b *endlessBody) Close() error { return nil }

// Every read of untrusted input in the Middleware is bounded: a keyed
// request's body is read to MaxBody+1 bytes at most (nothing when its
// Content-Length says it is too large), a request that is refused for its
// key is not read at all, and a request of an unprotected method is left
// to the handler. (Headers are bounded by the http.Server, MaxHeaderBytes;
// a key longer than MaxKeyLen is refused: see TestBadInputOnTheWire.)
func TestMiddlewareReadsAreBounded(t *testing.T) {
	const maxBody = 1000
	for _, c := range []struct {
		name     string
		method   string
		key      string
		length   int64 // Content-Length; -1 for unknown (chunked)
		status   int
		maxRead  int64
		handlers int64
	}{
		{"endless chunked body", "POST", "k", -1, 413, maxBody + 1, 0},
		{"Content-Length above MaxBody", "POST", "k", 1 << 40, 413, 0, 0},
		{"invalid key", "POST", strings.Repeat("k", 300), -1, 400, 0, 0},
		{"missing key", "POST", "", -1, 400, 0, 0},
		{"unprotected method", "GET", "k", -1, 201, 0, 1}, // the handler below does not read it
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int64
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxBody: maxBody}
			srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1) // and leaves the body alone
				w.WriteHeader(http.StatusCreated)
			}))
			body := &endlessBody{}
			r := request(c.method, "/v1/charges", "")
			r.Body, r.ContentLength = body, c.length
			if c.key != "" {
				r.Header.Set("Idempotency-Key", c.key)
			}
			w := serve(srv, r)
			if w.Code != c.status || body.n.Load() > c.maxRead || runs.Load() != c.handlers {
				t.Fatalf("status %d after reading %d bytes, %d handler runs; want %d, at most %d bytes, %d runs",
					w.Code, body.n.Load(), runs.Load(), c.status, c.maxRead, c.handlers)
			}
		})
	}
}
