package testserver_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/idemkit/idem/testserver"
)

// benchBody is a request body that can be read again: Reset before each
// request, without an allocation.
type benchBody struct{ bytes.Reader }

func (*benchBody) Close() error { return nil }

// benchWriter is a ResponseWriter that keeps the status and drops the
// body; its header is emptied before each request.
type benchWriter struct {
	header http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.header }
func (w *benchWriter) WriteHeader(status int)      { w.status = status }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkMiddleware: one request through the Middleware on a
// MemoryStore, in process (no network), beside the bare handler it wraps
// (path=bare), which reads the body and answers a 201 with a JSON body.
// path=first is a POST under a new key (claim, run, save), path=replay a
// POST under a key whose answer is saved (replayed), path=unkeyed a GET,
// which passes through. The request and the writer are reused; the key of
// path=first is a new string per request, as a server parses it.
func BenchmarkMiddleware(b *testing.B) {
	answer := []byte(`{"id":"ch_1","status":"succeeded"}`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
	})
	for _, bc := range []struct {
		name    string
		method  string
		keyed   bool // a new key per request
		wrapped bool
		want    int
	}{
		{name: "bare", method: http.MethodPost, want: http.StatusCreated},
		{name: "first", method: http.MethodPost, keyed: true, wrapped: true, want: http.StatusCreated},
		{name: "replay", method: http.MethodPost, wrapped: true, want: http.StatusCreated},
		{name: "unkeyed", method: http.MethodGet, wrapped: true, want: http.StatusCreated},
	} {
		b.Run("path="+bc.name, func(b *testing.B) {
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
			var srv http.Handler = h
			if bc.wrapped {
				srv = mw.Wrap(h)
			}
			body := new(benchBody)
			r, err := http.NewRequest(bc.method, "http://127.0.0.1/v1/charges", body)
			if err != nil {
				b.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer sk_test_1")
			key := []string{"replayed"}
			if bc.method == http.MethodPost {
				r.Header["Idempotency-Key"] = key
			}
			w := &benchWriter{header: http.Header{}}
			serve := func() {
				body.Reset([]byte(chargeBody))
				r.ContentLength = int64(len(chargeBody))
				clear(w.header)
				w.status = 0
				srv.ServeHTTP(w, r)
				if w.status != bc.want {
					b.Fatalf("status %d, want %d", w.status, bc.want)
				}
			}
			serve() // path=replay: saves the answer replayed below
			var buf []byte
			var n int64
			b.ReportAllocs()
			for ; b.Loop(); n++ {
				if bc.keyed {
					buf = strconv.AppendInt(append(buf[:0], "k-"...), n, 10)
					key[0] = string(buf)
				}
				serve()
			}
			b.StopTimer()
			want := testserver.Stats{}
			switch bc.name {
			case "first":
				want.Claims = 1 + n
			case "replay":
				want.Claims, want.Replays = 1, n
			}
			if s := mw.Stats(); s != want {
				b.Fatalf("stats %+v, want %+v", s, want)
			}
		})
	}
}
