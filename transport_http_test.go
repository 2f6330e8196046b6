package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

// countingServer is a server on 127.0.0.1 that answers 201 and counts the
// requests it got.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestContentLengthOtherThanTheBody: a request whose ContentLength is not
// the length of its body (or of the body GetBody gives) is refused with
// ErrRequestBody before anything is stored or sent, as net/http refuses it.
func TestContentLengthOtherThanTheBody(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  func(url string) *http.Request
	}{
		{"shorter, no GetBody", func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader(`{"a":1}`)))
			req.ContentLength = 3
			return req
		}},
		{"longer, GetBody", func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"a":1}`))
			req.ContentLength = 30
			return req
		}},
		{"no body", func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, nil)
			req.ContentLength = 5
			return req
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, sent := countingServer(t)
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Jar: jar, Policy: fastPolicy}
			resp, err := tr.RoundTrip(tt.req(srv.URL))
			if resp != nil {
				resp.Body.Close()
			}
			if !errors.Is(err, idem.ErrRequestBody) || sent.Load() != 0 {
				t.Fatalf("got %v, %v, %d requests sent; want ErrRequestBody, nothing sent", resp, err, sent.Load())
			}
			if recs, _ := jar.List(context.Background(), idem.Filter{}); len(recs) != 0 {
				t.Fatalf("jar holds %+v; want nothing stored", recs)
			}
		})
	}
}
