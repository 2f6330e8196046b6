package testserver_test

import (
	"log/slog"
	"net"
	"net/http"
	"os"
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

// failingBody fails every read with err.
type failingBody struct{ err error }

func (b failingBody) Read([]byte) (int, error) { return 0, b.err }
func (b failingBody) Close() error             { return nil }

// readTimeout is the error net/http gives a handler reading a body past
// the server's ReadTimeout: it names the server's own address, which
// behind a load balancer is an internal one.
var readTimeout = &net.OpError{Op: "read", Net: "tcp",
	Source: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080},
	Addr:   &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 51234}, Err: os.ErrDeadlineExceeded}

// TestBodyErrorLoggedNotSent: a request body that cannot be read is
// answered body-unreadable (408 for this timeout) without the read's error, which goes to
// the Logger: it may name the server's internal address, a file or
// another layer's message.
func TestBodyErrorLoggedNotSent(t *testing.T) {
	var logged strings.Builder
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran")
	}))
	r := request("POST", "/v1/charges", "", "Idempotency-Key", "k-1")
	r.Body = failingBody{readTimeout}
	w := serve(srv, r)
	p := wantProblem(t, w, http.StatusRequestTimeout, testserver.ProblemBodyUnreadable)
	for _, leak := range []string{"10.1.2.3", "10.9.8.7", "i/o timeout"} {
		if strings.Contains(w.Body.String(), leak) {
			t.Errorf("the answer names %q: %s", leak, p.Detail)
		}
	}
	if !strings.Contains(logged.String(), readTimeout.Error()) {
		t.Errorf("logged %q; want the read's error, %q", logged.String(), readTimeout.Error())
	}
}
