package idem_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/stallproxy"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
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

// seen is what a server got of one attempt.
type seen struct {
	proto, key, body, expect, host string
	length                         int64
	close                          bool
	trailer                        http.Header // read after the body
}

// scripted is a server on 127.0.0.1 (over TLS with HTTP/2 when h2 is
// true) that answers its attempts with statuses in turn, the last one to
// every later attempt, and records each. It reads the body only for a
// status below 300: a 409 or a 503 goes out before it, as from a server
// that refuses a request at once.
func scripted(t *testing.T, h2 bool, statuses ...int) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		i := min(len(got), len(statuses)-1)
		got = append(got, seen{proto: r.Proto, key: r.Header.Get(idem.KeyHeader), expect: r.Header.Get("Expect"),
			host: r.Host, length: r.ContentLength, close: r.Close})
		mu.Unlock()
		code := statuses[i]
		if code < 300 {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got[len(got)-1].body, got[len(got)-1].trailer = string(b), r.Trailer
			mu.Unlock()
		}
		w.WriteHeader(code)
	}))
	srv.EnableHTTP2 = h2
	if h2 {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// sameKey reports whether every attempt carried one key.
func sameKey(got []seen) bool {
	for _, s := range got {
		if s.key == "" || s.key != got[0].key {
			return false
		}
	}
	return len(got) > 0
}

// TestHTTPSemanticsOfAttempts: the Transport over real servers on
// 127.0.0.1. Each attempt carries one key, the body whole with its length
// (a chunked one included), and what the caller set that net/http reads
// from the request: Expect: 100-continue (to a server that answers 409
// and 503 before it reads the body), Close, Host.
func TestHTTPSemanticsOfAttempts(t *testing.T) {
	const body = `{"amount":100}`
	type request func(url string) *http.Request
	plain := func(url string) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		return req
	}
	for _, tt := range []struct {
		name  string
		h2    bool
		req   request
		check func(seen) bool
	}{
		{"HTTP/2", true, plain, func(s seen) bool { return s.proto == "HTTP/2.0" }},
		{"Expect: 100-continue", false, func(url string) *http.Request {
			req := plain(url)
			req.Header.Set("Expect", "100-continue")
			return req
		}, func(s seen) bool { return s.expect == "100-continue" }},
		{"chunked, no GetBody", false, func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader(body)))
			req.ContentLength = -1
			return req
		}, func(seen) bool { return true }},
		{"chunked, GetBody", false, func(url string) *http.Request {
			req := plain(url)
			req.ContentLength = -1
			return req
		}, func(seen) bool { return true }},
		{"Close and Host", false, func(url string) *http.Request {
			req := plain(url)
			req.Close, req.Host = true, "api.example.test"
			return req
		}, func(s seen) bool { return s.close && s.host == "api.example.test" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, got := scripted(t, tt.h2, http.StatusConflict, http.StatusServiceUnavailable, http.StatusCreated)
			base := srv.Client().Transport.(*http.Transport).Clone()
			base.ExpectContinueTimeout = time.Minute // the server answers first, or asks for the body
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: fastPolicy}
			resp, err := tr.RoundTrip(tt.req(srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			g := got()
			if resp.StatusCode != http.StatusCreated || len(g) != 3 || !sameKey(g) {
				t.Fatalf("%s after %+v; want 201 after 3 attempts with one key", resp.Status, g)
			}
			for i, s := range g {
				if !tt.check(s) || s.length != int64(len(body)) || (i == 2) != (s.body == body) {
					t.Errorf("attempt %d: %+v; want %d bytes declared, the body read by the 201 only", i+1, s, len(body))
				}
			}
		})
	}
}

// TestGetBodyGivingBackAReadBody: a GetBody that gives back the reader it
// gave before (for the fingerprint), already read, would make an attempt
// declare the body's length and hold none of it: over HTTP/2, net/http
// sends it all the same, an empty body under the key, which a server
// refuses with a 400 that settles the operation. It is ErrRequestBody,
// before anything is stored or sent, over HTTP/1.1 as over HTTP/2; so is
// one read part way, and no reader at all. A fresh body, the usual GetBody's, is sent.
func TestGetBodyGivingBackAReadBody(t *testing.T) {
	const body = `{"amount":100}`
	for _, h2 := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			getBody func() func() (io.ReadCloser, error)
		}{
			{"the same reader", func() func() (io.ReadCloser, error) {
				r := io.NopCloser(strings.NewReader(body))
				return func() (io.ReadCloser, error) { return r, nil }
			}},
			{"read part way", func() func() (io.ReadCloser, error) {
				calls := 0
				return func() (io.ReadCloser, error) {
					calls++
					r := strings.NewReader(body)
					if calls > 2 { // past the caller's Body and the fingerprint's
						r.Seek(3, io.SeekStart)
					}
					return io.NopCloser(r), nil
				}
			}},
			{"no reader and no error", func() func() (io.ReadCloser, error) {
				calls := 0
				return func() (io.ReadCloser, error) {
					if calls++; calls > 2 {
						return nil, nil
					}
					return io.NopCloser(strings.NewReader(body)), nil
				}
			}},
		} {
			t.Run(fmt.Sprintf("%s, HTTP/2 %v", tc.name, h2), func(t *testing.T) {
				srv, got := scripted(t, h2, http.StatusCreated)
				jar := &idem.MemoryJar{}
				tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, Policy: fastPolicy}
				req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.GetBody = tc.getBody()
				req.Body, _ = req.GetBody()
				req.ContentLength = int64(len(body))
				resp, err := tr.RoundTrip(req)
				if resp != nil {
					resp.Body.Close()
				}
				recs, _ := jar.List(context.Background(), idem.Filter{})
				if !errors.Is(err, idem.ErrRequestBody) || len(got()) != 0 || len(recs) != 0 {
					t.Fatalf("got %v, %v; the server got %+v, the jar holds %d records; want ErrRequestBody, nothing sent or stored", resp, err, got(), len(recs))
				}
			})
		}
	}
}

// TestRequestTrailers: the trailers of a caller's request reach the
// server with the body of an attempt, a retry's included: each is sent
// chunked, as net/http sends trailers only after a chunked body.
func TestRequestTrailers(t *testing.T) {
	srv, got := scripted(t, false, http.StatusServiceUnavailable, http.StatusCreated)
	tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy}
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Checksum": {"abc"}}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := got(); len(g) != 2 || g[1].body != "hello" || g[1].trailer.Get("X-Checksum") != "abc" {
		t.Fatalf("the server got %+v; want a retry with the body and the trailer X-Checksum: abc", g)
	}
}

// TestRedirectAfterAKeyedPost: an http.Client that follows a 301, 302 or
// 303 answer to a keyed POST sends a GET, without a body, which the
// Transport passes through: the operation is done with the 3xx, its key
// stays on the POST, and the jar holds the POST alone. One that follows a
// 307 or 308 answer to an unnamed operation sends the POST again, body
// included, as an operation of its own, with a key of its own.
func TestRedirectAfterAKeyedPost(t *testing.T) {
	const body = `{"amount":100}`
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			var mu sync.Mutex
			var keys []string // the key of each request, POST /charges first
			var followed string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				defer mu.Unlock()
				keys = append(keys, r.Header.Get(idem.KeyHeader))
				if r.URL.Path == "/charges" {
					http.Redirect(w, r, "/charge/1", code)
					return
				}
				followed = r.Method + " " + string(b)
			}))
			defer srv.Close()
			jar := &idem.MemoryJar{}
			hc := &http.Client{Transport: &idem.Transport{Jar: jar, Policy: fastPolicy}}
			resp, err := hc.Post(srv.URL+"/charges", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			recs, err := jar.List(context.Background(), idem.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(recs, func(a, b idem.Record) int { return strings.Compare(b.URL, a.URL) }) // /charges first
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK || len(keys) != 2 || keys[0] == "" || recs[0].LastStatus != code {
				t.Fatalf("%s after requests with keys %q, records %+v; want 200 after 2 requests, the first keyed, done with %d", resp.Status, keys, recs, code)
			}
			if code < http.StatusTemporaryRedirect {
				if followed != "GET " || keys[1] != "" || len(recs) != 1 || recs[0].State != idem.StateDone {
					t.Fatalf("followed with %q, key %q; records %+v; want a GET without body nor key, the POST alone done", followed, keys[1], recs)
				}
				return
			}
			if followed != "POST "+body || keys[1] == "" || keys[1] == keys[0] || len(recs) != 2 ||
				recs[0].State != idem.StateDone || recs[1].State != idem.StateDone {
				t.Fatalf("followed with %q, keys %q; records %+v; want the POST with its body and a key of its own, both done", followed, keys, recs)
			}
		})
	}
}

// TestRedirectCarriesNoCallersKey: http.Client copies the header of a
// keyed POST onto the GET that follows its 301, 302 or 303, and onto every
// later request of the chain, the caller's Idempotency-Key included: the
// Transport sends them without it, as package client does, since the key
// is the operation's and no business of the redirect's host, perhaps
// another. A GET that follows a GET is the same request sent again, and
// carries the key its caller set, as net/http sends it.
func TestRedirectCarriesNoCallersKey(t *testing.T) {
	const key = "order-42-charge"
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			var mu sync.Mutex
			keys := map[string][]string{} // the keys of each request, by method and path
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				mu.Lock()
				keys[r.Method+" "+r.URL.Path] = r.Header.Values(idem.KeyHeader)
				mu.Unlock()
				switch r.URL.Path {
				case "/charges", "/orders":
					http.Redirect(w, r, r.URL.Path+"/1", code)
				case "/charges/1":
					http.Redirect(w, r, "/receipts/1", code) // a second redirect of the chain
				}
			}))
			defer srv.Close()
			hc := &http.Client{Transport: &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy}}
			for _, method := range []string{http.MethodPost, http.MethodGet} {
				path := map[string]string{http.MethodPost: "/charges", http.MethodGet: "/orders"}[method]
				req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"amount":100}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(idem.KeyHeader, key)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || req.Header.Get(idem.KeyHeader) != key {
					t.Fatalf("%s %s: %s, the caller's key now %q; want 200, the caller's request unchanged", method, path, resp.Status, req.Header.Get(idem.KeyHeader))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			want := map[string][]string{"POST /charges": {key}, "GET /charges/1": nil, "GET /receipts/1": nil, "GET /orders": {key}, "GET /orders/1": {key}}
			for where, w := range want {
				if got, ok := keys[where]; !ok || !slices.Equal(got, w) {
					t.Errorf("%s (reached: %v) carried the keys %q; want %q", where, ok, got, w)
				}
			}
		})
	}
}

// TestRedirectOfTheSameRequestKeepsItsKey: a 307 or 308 of a method the
// Transport does not key sends the same request again, to the new URL, and
// http.Client copies the key its caller set: the Transport leaves it
// there, as net/http sends it. A 301 of a DELETE, which http.Client follows
// with a GET, sends that GET without it.
func TestRedirectOfTheSameRequestKeepsItsKey(t *testing.T) {
	const key = "order-42-refund"
	for _, tc := range []struct {
		method string
		code   int
		want   []string // the key of the request to /refunds/1
	}{
		{http.MethodDelete, http.StatusTemporaryRedirect, []string{key}},
		{http.MethodDelete, http.StatusPermanentRedirect, []string{key}},
		{http.MethodPut, http.StatusPermanentRedirect, []string{key}},
		{http.MethodDelete, http.StatusMovedPermanently, nil}, // followed with a GET
	} {
		t.Run(tc.method+"/"+strconv.Itoa(tc.code), func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			var followed string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/refunds" {
					http.Redirect(w, r, "/refunds/1", tc.code)
					return
				}
				mu.Lock()
				got, followed = r.Header.Values(idem.KeyHeader), r.Method
				mu.Unlock()
			}))
			defer srv.Close()
			hc := &http.Client{Transport: &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy}}
			req, err := http.NewRequest(tc.method, srv.URL+"/refunds", strings.NewReader(`{"amount":100}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(idem.KeyHeader, key)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK || followed == "" || !slices.Equal(got, tc.want) {
				t.Errorf("%s, the redirect followed with %q carrying the keys %q; want 200, the keys %q", resp.Status, followed, got, tc.want)
			}
		})
	}
}

// TestRedirectChainThatLoops: a request whose Response leads back to
// itself, which http.Client never makes but a wrapper that sets Response by
// hand may, is sent once, as a redirect of the same request (its key kept),
// and RoundTrip returns: the walk to the chain's first request ends where
// the chain comes round again.
func TestRedirectChainThatLoops(t *testing.T) {
	var sent, keyed atomic.Int64
	tr := &idem.Transport{Jar: &idem.MemoryJar{}, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent.Add(1)
		if r.Header.Get(idem.KeyHeader) == "order-42-read" {
			keyed.Add(1)
		}
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})}
	for _, n := range []int{1, 2, 3} { // requests in the loop
		reqs := make([]*http.Request, n)
		for i := range reqs {
			reqs[i] = httptest.NewRequest(http.MethodGet, "http://api.example.test/v1/orders/"+strconv.Itoa(i), nil)
			reqs[i].Header.Set(idem.KeyHeader, "order-42-read")
		}
		for i, r := range reqs {
			r.Response = &http.Response{StatusCode: http.StatusTemporaryRedirect, Request: reqs[(i+1)%n]}
		}
		done := make(chan error, 1)
		go func() {
			resp, err := tr.RoundTrip(reqs[0])
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		watchdog := time.NewTimer(10 * time.Second)
		select {
		case err := <-done:
			watchdog.Stop()
			if err != nil {
				t.Errorf("a loop of %d: %v; want the request sent", n, err)
			}
		case <-watchdog.C:
			t.Fatalf("a loop of %d: RoundTrip has not returned after 10 s", n)
		}
	}
	if sent.Load() != 3 || keyed.Load() != 3 {
		t.Errorf("%d requests sent, %d with the caller's key; want 3, each with it", sent.Load(), keyed.Load())
	}
}

// TestTransparentGzip: through an http.Transport that asks for gzip and
// decompresses (its default), the answer and its replay are classified by
// status and come back decompressed.
func TestTransparentGzip(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, `{"id":"ch_1"}`)
	zw.Close()
	var runs atomic.Int32
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.Header.Get("Accept-Encoding") != "gzip" {
			t.Errorf("Accept-Encoding %q; want gzip, from http.Transport", r.Header.Get("Accept-Encoding"))
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", strconv.Itoa(gz.Len()))
		w.WriteHeader(http.StatusCreated)
		w.Write(gz.Bytes())
	})))
	defer srv.Close()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: fastPolicy}
	ctx := idem.WithOperation(context.Background(), "charge")
	for i := range 2 {
		resp, b, err := postRead(t, ctx, tr, srv.URL)
		if err != nil || resp.StatusCode != http.StatusCreated || b != `{"id":"ch_1"}` || !resp.Uncompressed ||
			retry.Replayed(resp) != (i == 1) {
			t.Fatalf("answer %d: %s %q, %v, uncompressed %v, replayed %v; want 201, the body decompressed", i+1, resp.Status, b, err, resp.Uncompressed, retry.Replayed(resp))
		}
	}
	if rec, err := jar.Get(ctx, "charge"); err != nil || rec.State != idem.StateDone || runs.Load() != 1 {
		t.Fatalf("record %+v, %v after %d runs; want done after one", rec, err, runs.Load())
	}
}

// TestSwitchingProtocols: a 101 Switching Protocols answer to a keyed
// request (an upgrade sent as a POST, as some APIs attach a stream) comes
// back as net/http gives it, with a Body that is an io.ReadWriteCloser of
// the upgraded connection, also when Policy.AttemptTimeout wraps the body
// to end the attempt's context with it. The operation is done.
func TestSwitchingProtocols(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, err := io.ReadAll(r.Body); err != nil || string(b) != `{"amount":100}` {
			http.Error(w, "body", http.StatusBadRequest)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		rw.WriteString("echo " + line)
		rw.Flush()
	}))
	defer srv.Close()
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprint("AttemptTimeout ", timeout), func(t *testing.T) {
			p := fastPolicy
			p.AttemptTimeout = timeout
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Jar: jar, Policy: p}
			ctx := idem.WithOperation(context.Background(), "attach")
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "echo")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rw, ok := resp.Body.(io.ReadWriteCloser)
			if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
				t.Fatalf("%s with a Body of type %T; want 101 with an io.ReadWriteCloser, as net/http gives it", resp.Status, resp.Body)
			}
			if _, err := io.WriteString(rw, "ping\n"); err != nil {
				t.Fatal(err)
			}
			if line, err := bufio.NewReader(rw).ReadString('\n'); line != "echo ping\n" {
				t.Fatalf("read %q, %v from the upgraded connection; want \"echo ping\\n\"", line, err)
			}
			if rec, err := jar.Get(ctx, "attach"); err != nil || rec.State != idem.StateDone {
				t.Fatalf("record %+v, %v; want done", rec, err)
			}
		})
	}
}

// TestThroughAForwardProxy: through a forward proxy (http.ProxyURL, with
// credentials) each attempt reaches the server with the key, and the
// proxy's credentials, which http.Transport adds, are not stored.
func TestThroughAForwardProxy(t *testing.T) {
	srv, got := scripted(t, false, http.StatusServiceUnavailable, http.StatusCreated)
	target, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var proxied atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") == "" || r.URL.Host != target.Host {
			http.Error(w, "not proxied", http.StatusBadRequest)
			return
		}
		proxied.Add(1)
		(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }}).ServeHTTP(w, r)
	}))
	defer proxy.Close()
	pu, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.UserPassword("user", "secret")
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: &http.Transport{Proxy: http.ProxyURL(pu)}, Jar: jar, Policy: fastPolicy}
	ctx := idem.WithOperation(context.Background(), "charge")
	resp, _, _ := postRead(t, ctx, tr, srv.URL)
	if g := got(); resp.StatusCode != http.StatusCreated || len(g) != 2 || !sameKey(g) || proxied.Load() != 2 {
		t.Fatalf("%s after %+v, %d through the proxy; want 201 after 2 attempts with one key, both proxied", resp.Status, g, proxied.Load())
	}
	rec, err := jar.Get(ctx, "charge")
	if err != nil || len(rec.Header) != 0 || strings.Contains(rec.URL, "secret") {
		t.Fatalf("record %+v, %v; want no header, no credential", rec, err)
	}
}

// postRead sends a POST of the operation named in ctx through tr and
// returns the answer with its body read and closed.
func postRead(t *testing.T, ctx context.Context, tr http.RoundTripper, url string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestAnswerCutShort: an answer whose body ends before its Content-Length
// is final by its status: the operation is done, and the caller reading
// it gets io.ErrUnexpectedEOF. The same operation called again gets the
// server's replay, whole. The server saved its answer whole; the first one
// is cut on its way (here by a writer outside the Middleware that
// announces more than the answer holds, so that net/http closes the
// connection after it).
func TestAnswerCutShort(t *testing.T) {
	var runs atomic.Int32
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	var cut atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.CompareAndSwap(false, true) {
			w = lengthLiar{w}
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: fastPolicy}
	ctx := idem.WithOperation(context.Background(), "charge")
	for i, want := range []error{io.ErrUnexpectedEOF, nil} {
		resp, b, err := postRead(t, ctx, tr, srv.URL)
		if resp.StatusCode != http.StatusCreated || !errors.Is(err, want) || b != `{"id":"ch_1"}` && want == nil {
			t.Fatalf("call %d: %s %q, %v; want 201, reading it %v", i+1, resp.Status, b, err, want)
		}
		if rec, err := jar.Get(ctx, "charge"); err != nil || rec.State != idem.StateDone {
			t.Fatalf("call %d: record %+v, %v; want done", i+1, rec, err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs; want 1", runs.Load())
	}
}

// lengthLiar announces a Content-Length of 100 whatever the answer holds.
type lengthLiar struct{ http.ResponseWriter }

func (w lengthLiar) WriteHeader(code int) {
	w.Header().Set("Content-Length", "100")
	w.ResponseWriter.WriteHeader(code)
}

// TestHTTP2LostConnectionIsRetried: an HTTP/2 connection that stops
// answering under an attempt is found lost by net/http's health check
// (HTTP2Config.SendPingTimeout: a PING unanswered), which fails the
// attempt with an untyped error. That is a network error: the attempt is
// sent again with the same key, on a new connection, as over HTTP/1.1.
func TestHTTP2LostConnectionIsRetried(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	proxy := stallproxy.New(t, srv.Listener.Addr().String())
	base := srv.Client().Transport.(*http.Transport).Clone()
	base.ForceAttemptHTTP2 = true
	base.HTTP2 = &http.HTTP2Config{SendPingTimeout: 250 * time.Millisecond, PingTimeout: 250 * time.Millisecond}
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: base, Jar: jar, Policy: fastPolicy}
	defer tr.CloseIdleConnections()
	url := "https://" + proxy.Addr() + "/charges"
	post := func(op string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), op), http.MethodPost, url, strings.NewReader(`{"amount":100}`))
		return tr.RoundTrip(req)
	}

	resp, err := post("first") // opens the connection that will stall
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("first call over %s; want HTTP/2", resp.Proto)
	}
	proxy.Stall()

	resp, err = post("second")
	if err != nil {
		t.Fatalf("the call over a lost connection: %v; want it retried on a new one", err)
	}
	resp.Body.Close()
	rec, err := jar.Get(t.Context(), "second")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusCreated || rec.State != idem.StateDone || rec.Attempts != 2 ||
		len(keys) != 2 || keys[1] != rec.Key || proxy.Accepted() != 2 {
		t.Fatalf("%s, %s after %d attempts, server saw keys %q over %d connections; want 201, done after 2 attempts, the second with key %q on a second connection",
			resp.Status, rec.State, rec.Attempts, keys, proxy.Accepted(), rec.Key)
	}
}

// TestTLSAlertFromTheServerIsNotRetried: a server that ends the TLS
// handshake with an alert (it requires a client certificate, or speaks no
// version the client offers) refuses every connection alike, and it
// processed nothing. crypto/tls reports the alert as a *net.OpError
// ("remote error"), a net.Error: it is not taken for a network fault and
// retried. The call stops after one handshake, with a *PendingError that
// holds the alert, and the operation stays pending with one attempt, as
// for a certificate the client refuses. (Over TLS 1.3 a refused client
// certificate is told after the client's side of the handshake, and the
// client may meet the closed connection, a reset, before the alert: that
// is retried, as any reset is; TLS 1.2 is used here.)
func TestTLSAlertFromTheServerIsNotRetried(t *testing.T) {
	for _, tt := range []struct {
		name        string
		server, cli func(*tls.Config)
	}{
		{"client certificate required", func(c *tls.Config) {
			c.ClientAuth, c.MaxVersion = tls.RequireAnyClientCert, tls.VersionTLS12
		}, nil},
		{"no common version", func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }, func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }},
		{"server certificate refused by the client", nil, func(c *tls.Config) { c.RootCAs = x509.NewCertPool() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var hellos, handled atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handled.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			srv.EnableHTTP2 = true
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				hellos.Add(1)
				return nil, nil
			}}
			if tt.server != nil {
				tt.server(srv.TLS)
			}
			srv.StartTLS()
			t.Cleanup(srv.Close)
			base := srv.Client().Transport.(*http.Transport).Clone()
			base.ForceAttemptHTTP2 = true
			if tt.cli != nil {
				tt.cli(base.TLSClientConfig)
			}
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Base: base, Jar: jar, Policy: fastPolicy}
			req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			var pe *idem.PendingError
			if !errors.As(err, &pe) || pe.Attempts != 1 || pe.Err == nil || hellos.Load() != 1 || handled.Load() != 0 {
				t.Fatalf("got %v after %d handshakes, %d requests handled; want a *PendingError after 1 attempt, 1 handshake, nothing handled", err, hellos.Load(), handled.Load())
			}
			if rec, err := jar.Get(t.Context(), "charge"); err != nil || rec.State != idem.StatePending || rec.Attempts != 1 || rec.LastError == "" {
				t.Fatalf("jar holds %+v, %v; want the operation pending after 1 attempt, with its error", rec, err)
			}
		})
	}
}

// TestTLSInternalErrorFromTheServerIsRetried: a server that fails its
// side of the handshake for a reason of its own (its GetConfigForClient,
// or a GetCertificate that cannot load a certificate) sends the alert
// internal_error. It processed nothing, and a new handshake may succeed:
// the attempt is retried under the same key, and the operation is done
// with the answer of the second.
func TestTLSInternalErrorFromTheServerIsRetried(t *testing.T) {
	var hellos, handled atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if hellos.Add(1) == 1 {
			return nil, errors.New("certificate store unavailable")
		}
		return nil, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, Policy: fastPolicy}
	req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("got %v after %d handshakes; want 201 after the second", err, hellos.Load())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || hellos.Load() != 2 || handled.Load() != 1 {
		t.Fatalf("got %s after %d handshakes, %d requests handled; want 201 after 2 handshakes, 1 handled", resp.Status, hellos.Load(), handled.Load())
	}
	if rec, err := jar.Get(t.Context(), "charge"); err != nil || rec.State != idem.StateDone || rec.Attempts != 2 {
		t.Fatalf("jar holds %+v, %v; want the operation done after 2 attempts", rec, err)
	}
}

// chargeDialling sends a named POST to url through a Transport with
// fastPolicy and a MemoryJar, over a base transport that dials with dial.
// It returns the number of dials, the operation's record and RoundTrip's
// error.
func chargeDialling(t *testing.T, url string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (dials int, rec idem.Record, err error) {
	t.Helper()
	var n atomic.Int32
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return dial(ctx, network, addr)
	}}
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: base, Jar: jar, Policy: fastPolicy}
	req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
	}
	rec, jerr := jar.Get(t.Context(), "charge")
	if jerr != nil {
		t.Fatalf("jar: %v", jerr)
	}
	return int(n.Load()), rec, err
}

// TestUnknownHostIsNotRetried: a host name that does not exist fails
// every attempt alike until it is made to exist, which a call's minute
// does not wait for: the call stops after one dial with a *PendingError
// that holds the *net.DNSError, and the operation stays pending for a
// later call. A resolver that failed (a timeout, SERVFAIL) is retried as
// any network fault, up to MaxAttempts.
func TestUnknownHostIsNotRetried(t *testing.T) {
	for _, tt := range []struct {
		name     string
		err      *net.DNSError
		attempts int
	}{
		{"no such host", &net.DNSError{Err: "no such host", Name: "api.idem.example", IsNotFound: true}, 1},
		{"resolver timeout", &net.DNSError{Err: "i/o timeout", Name: "api.idem.example", IsTimeout: true}, fastPolicy.MaxAttempts},
		{"resolver failure", &net.DNSError{Err: "server misbehaving", Name: "api.idem.example", IsTemporary: true}, fastPolicy.MaxAttempts},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dials, rec, err := chargeDialling(t, "http://api.idem.example/v1/charges", func(_ context.Context, network, _ string) (net.Conn, error) {
				return nil, &net.OpError{Op: "dial", Net: network, Err: tt.err}
			})
			var pe *idem.PendingError
			var de *net.DNSError
			if !errors.As(err, &pe) || pe.Attempts != tt.attempts || !errors.As(err, &de) || dials != tt.attempts {
				t.Fatalf("got %v after %d dials; want a *PendingError around a *net.DNSError after %d attempts, as many dials", err, dials, tt.attempts)
			}
			if rec.State != idem.StatePending || rec.Attempts != tt.attempts {
				t.Fatalf("jar holds %+v; want the operation pending after %d attempts", rec, tt.attempts)
			}
		})
	}
}

// h2Serve is the server side of an HTTP/2 connection with prior
// knowledge (no TLS), framed by hand: it refuses the first refuse streams
// with RST_STREAM REFUSED_STREAM, as a server that processed nothing of
// them, and answers every later one 200. With goAway, it ends the
// connection under the first of them instead, as http.Server's Shutdown
// does when its deadline passes: GOAWAY naming the stream as received
// (NO_ERROR), then the connection closed before the stream is answered.
// It returns, with the number of requests (HEADERS frames) it got, when
// the connection is closed.
func h2Serve(conn net.Conn, refuse int, goAway bool) (requests int) {
	// Frames are written by a goroutine of their own, as the client's are
	// read by one: a net.Pipe holds no byte that its other end does not
	// read at once.
	out, written := make(chan []byte, 16), make(chan struct{})
	go func() {
		defer close(written)
		for b := range out {
			if b == nil {
				conn.Close()
			}
			conn.Write(b) // an error: the connection ended, and so does the read
		}
	}()
	defer func() { conn.Close(); close(out); <-written }()
	frame := func(typ, flags byte, stream uint32, payload ...byte) {
		n := len(payload)
		out <- append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}, payload...)
	}
	const (
		typeHeaders, typeRSTStream, typeSettings = 0x1, 0x3, 0x4
		typeGoAway                               = 0x7
		flagAck, flagEndStream, flagEndHeaders   = 0x1, 0x1, 0x4
		refusedStream, status200                 = 0x7, 0x88 // an error code; HPACK's static entry 8, ":status: 200"
	)
	if _, err := io.ReadFull(conn, make([]byte, len(http2Preface))); err != nil {
		return requests
	}
	frame(typeSettings, 0, 0)
	for { // until the client closes the connection
		var h [9]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			return requests
		}
		payload := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
		if _, err := io.ReadFull(conn, payload); err != nil {
			return requests
		}
		stream := (uint32(h[5])<<24 | uint32(h[6])<<16 | uint32(h[7])<<8 | uint32(h[8])) & 0x7fffffff
		switch {
		case h[3] == typeSettings && h[4]&flagAck == 0:
			frame(typeSettings, flagAck, 0)
		case h[3] == typeHeaders:
			requests++
			switch {
			case requests <= refuse && goAway:
				frame(typeGoAway, 0, 0, byte(stream>>24), byte(stream>>16), byte(stream>>8), byte(stream), 0, 0, 0, 0)
				out <- nil // the connection closed once the GOAWAY is written; its reads end
			case requests <= refuse:
				frame(typeRSTStream, 0, stream, 0, 0, 0, refusedStream)
			default:
				frame(typeHeaders, flagEndHeaders|flagEndStream, stream, status200)
			}
		}
	}
}

// h2Pipes returns an HTTP/2 transport (prior knowledge, no TLS) whose
// every connection is a net.Pipe that h2Serve serves, its refuse and
// goAway given by how for the connection's index (0 for the first
// dialled), and served, which closes the connections and returns how many
// there were and the requests they got. Dials come one at a time, as a
// single call makes them.
func h2Pipes(how func(i int) (refuse int, goAway bool)) (*http.Transport, func() (conns, requests int)) {
	var servers []net.Conn
	done := make(chan int, 16)
	base := &http.Transport{Protocols: new(http.Protocols), DialContext: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		refuse, goAway := how(len(servers))
		servers = append(servers, server)
		go func() { done <- h2Serve(server, refuse, goAway) }()
		return socketPipe{client}, nil
	}}
	base.Protocols.SetUnencryptedHTTP2(true)
	return base, func() (conns, requests int) {
		for _, c := range servers {
			c.Close()
			requests += <-done
		}
		return len(servers), requests
	}
}

// socketPipe is the client's end of a net.Pipe that fails a write after
// the server closed its end as a TCP socket does, with EPIPE in a
// *net.OpError, not net.Pipe's own io.ErrClosedPipe, which no network
// gives: a body written while the server closes the connection is then
// the error a real one would be.
type socketPipe struct{ net.Conn }

func (c socketPipe) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if errors.Is(err, io.ErrClosedPipe) {
		err = &net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}}
	}
	return n, err
}

// http2Preface is what an HTTP/2 client sends first (RFC 9113, 3.4).
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// TestHTTP2SendsAnAttemptAgain: net/http's HTTP/2 transport sends a request
// again by itself, with the same key, when the server refuses its stream
// (REFUSED_STREAM: nothing processed), up to 7 times, the second at once
// and the others after 1 s, 2 s, … 32 s (a tenth more at most): the
// server gets up to 8 requests for one attempt that the jar counts, as
// README says. (The clock is synctest's.)
func TestHTTP2SendsAnAttemptAgain(t *testing.T) {
	for _, tt := range []struct {
		refuse, requests int
		status           int
		waits            time.Duration // net/http's, between the requests
	}{
		{refuse: 2, requests: 3, status: http.StatusOK, waits: time.Second},
		{refuse: 100, requests: 8, waits: 63 * time.Second},
	} {
		synctest.Test(t, func(t *testing.T) {
			base, served := h2Pipes(func(int) (int, bool) { return tt.refuse, false })
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}
			req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost, "http://payments.test/v1/charges", strings.NewReader(`{"amount":100}`))
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			took := time.Since(start)
			if resp != nil {
				resp.Body.Close()
			}
			_, requests := served()
			tr.CloseIdleConnections()
			rec, _ := jar.Get(context.Background(), "charge")
			if tt.status != 0 && (err != nil || resp.StatusCode != tt.status) || tt.status == 0 && !errors.Is(err, idem.ErrPending) {
				t.Fatalf("refusing %d streams: %v, %v; want status %d (0: the operation pending)", tt.refuse, resp, err, tt.status)
			}
			if requests != tt.requests || rec.Attempts != 1 || took < tt.waits || took > tt.waits*11/10 {
				t.Fatalf("refusing %d streams: %d requests in %v, %d attempts in the jar; want %d requests for 1 attempt, in %v to %v",
					tt.refuse, requests, took, rec.Attempts, tt.requests, tt.waits, tt.waits*11/10)
			}
		})
	}
}

// TestHTTP2GoAwayRetried: a server that shuts down past its deadline
// (GOAWAY naming the stream as received, then the connection closed
// unanswered) fails the attempt with net/http's "server sent GOAWAY and
// closed the connection", which net/http does not send again itself: the
// Transport retries it as a connection closed under an HTTP/1.1 request,
// with the same key, on a new connection.
func TestHTTP2GoAwayRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, served := h2Pipes(func(i int) (int, bool) {
			if i == 0 {
				return 1, true // the first connection's stream alone
			}
			return 0, false
		})
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Base: base, Jar: jar}
		req, _ := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost, "http://payments.test/v1/charges", strings.NewReader(`{"amount":100}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("got %v; want the second attempt's 200", err)
		}
		resp.Body.Close()
		tr.CloseIdleConnections()
		conns, requests := served()
		rec, _ := jar.Get(context.Background(), "charge")
		if resp.StatusCode != http.StatusOK || conns != 2 || requests != 2 || rec.Attempts != 2 || rec.State != idem.StateDone {
			t.Fatalf("got %s over %d connections, %d requests, the record %s after %d attempts; want 200 over 2, 2 requests, done after 2",
				resp.Status, conns, requests, rec.State, rec.Attempts)
		}
	})
}

// refresher is a RoundTripper in the way of an OAuth2 client's: it adds
// Authorization with its token and, on a 401, refreshes the token and
// sends the request once more, its body from GetBody.
type refresher struct {
	base  http.RoundTripper
	token atomic.Int32
}

func (r *refresher) RoundTrip(req *http.Request) (*http.Response, error) {
	send := func(req *http.Request) (*http.Response, error) {
		out := req.Clone(req.Context())
		out.Header.Set("Authorization", fmt.Sprintf("Bearer t%d", r.token.Load()))
		return r.base.RoundTrip(out)
	}
	again := req.Clone(req.Context())
	resp, err := send(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	resp.Body.Close()
	r.token.Add(1)
	if req.GetBody != nil {
		if again.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	return send(again)
}

// authServer is a server on 127.0.0.1 that answers 401 to a request
// without the token "Bearer t1" and 201 to one with it, and records the
// key and the body of each request.
func authServer(t *testing.T) (*httptest.Server, func() (keys, bodies []string)) {
	t.Helper()
	var mu sync.Mutex
	var keys, bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		keys, bodies = append(keys, r.Header.Get(idem.KeyHeader)), append(bodies, string(b))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer t1" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, func() ([]string, []string) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(keys), slices.Clone(bodies)
	}
}

// TestTransportThatResendsOn401: a transport that refreshes its token on a
// 401 and sends the request again keeps one operation under one key when
// it is the Transport's Base, and when it is outside the Transport and the
// operation is named; outside, an unnamed request's second send is an
// operation of its own, under a new key, and the first, refused, stays
// pending in the jar, which a resume of every pending operation would
// send: the README and the Transport's doc say where such a transport
// goes.
func TestTransportThatResendsOn401(t *testing.T) {
	const body = `{"amount":100}`
	for _, tc := range []struct {
		name        string
		inside      bool
		op          string
		keys        int // distinct keys the server sees
		pendingLeft int // operations left pending in the jar
	}{
		{"as Base", true, "", 1, 0},
		{"outside, named", false, "charge:1", 1, 0},
		{"outside, unnamed", false, "", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := authServer(t)
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Jar: jar, Policy: fastPolicy}
			var rt http.RoundTripper = tr
			if tc.inside {
				tr.Base = &refresher{base: http.DefaultTransport}
			} else {
				rt = &refresher{base: tr}
			}
			ctx := context.Background()
			if tc.op != "" {
				ctx = idem.WithOperation(ctx, tc.op)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := (&http.Client{Transport: rt}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			keys, bodies := got()
			distinct := map[string]bool{}
			for i, k := range keys {
				distinct[k] = true
				if bodies[i] != body {
					t.Errorf("request %d sent the body %q, want %q", i+1, bodies[i], body)
				}
			}
			pending, _ := jar.List(ctx, idem.Filter{State: idem.StatePending})
			if resp.StatusCode != http.StatusCreated || len(keys) != 2 || len(distinct) != tc.keys || len(pending) != tc.pendingLeft {
				t.Fatalf("%s after keys %q, %d pending; want 201 after 2 requests under %d keys, %d pending",
					resp.Status, keys, len(pending), tc.keys, tc.pendingLeft)
			}
		})
	}
}

// TestGetBodyGivesEveryAttemptsBody: with GetBody set, the body of every
// attempt, the first's included, and the one read for the fingerprint
// and the jar come from GetBody; the caller's Body is closed unread, where
// net/http would send it first. A GetBody that gives other bytes on
// another call sends them under the key, the stored body and the
// fingerprint being the first call's.
func TestGetBodyGivesEveryAttemptsBody(t *testing.T) {
	srv, got := scripted(t, false, http.StatusServiceUnavailable, http.StatusCreated)
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, Policy: fastPolicy}
	unread := strings.NewReader(`{"amount":0}`)
	caller := &closeTracker{Reader: unread}
	req, err := http.NewRequest(http.MethodPost, srv.URL, caller)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		return io.NopCloser(strings.NewReader(fmt.Sprintf(`{"amount":%d}`, calls))), nil
	}
	req.ContentLength = int64(len(`{"amount":0}`))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	g := got()
	recs, _ := jar.List(context.Background(), idem.Filter{})
	if len(g) != 2 || g[1].body != `{"amount":3}` || calls != 3 || len(recs) != 1 || string(recs[0].Body) != `{"amount":1}` {
		t.Fatalf("the server got %+v, GetBody called %d times, the jar holds %+v; want the second attempt to send GetBody's third body, the jar its first", g, calls, recs)
	}
	if unread.Len() != len(`{"amount":0}`) || !caller.closed {
		t.Errorf("the caller's Body: %d bytes left, closed %v; want closed unread", unread.Len(), caller.closed)
	}
}

// TestPendingErrorOfAnUnnamedCall: a call sent without a name (neither
// WithOperation nor a key of the caller's) that stops with its outcome
// unknown says that the same call made again unnamed is a new operation
// under a new key, where "resume it under the same name" read as "send it
// again"; a named call's message does not.
func TestPendingErrorOfAnUnnamedCall(t *testing.T) {
	const warning = "made again without a name is a new operation under a new key"
	base := roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, io.ErrUnexpectedEOF })
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		key     string
		unnamed bool
	}{
		{"unnamed", context.Background(), "", true},
		{"WithOperation", idem.WithOperation(context.Background(), "charge:o1"), "", false},
		{"the caller's key", context.Background(), "k1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: fastPolicy}
			req, err := http.NewRequestWithContext(tc.ctx, http.MethodPost, "http://127.0.0.1:1/charges", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			if tc.key != "" {
				req.Header.Set(idem.KeyHeader, tc.key)
			}
			_, err = tr.RoundTrip(req)
			var pe *idem.PendingError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v; want a *PendingError", err)
			}
			if got := strings.Contains(err.Error(), warning); got != tc.unnamed {
				t.Errorf("%q: says a call made again is a new operation: %v, want %v", err, got, tc.unnamed)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", pe.Op)) {
				t.Errorf("%q does not name the operation", err)
			}
		})
	}
}

// TestPendingErrorTimeout: a call through the Transport that stops on a
// timeout is one to net.Error's Timeout and os.IsTimeout, as a call
// through net/http alone is (http.Client's *url.Error asks the error it
// wraps): the caller's deadline during an attempt or during the wait
// between two, and an attempt's own (Policy.AttemptTimeout) on the last
// attempt; a connection reset is not one.
func TestPendingErrorTimeout(t *testing.T) {
	hanging := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	})
	unavailable := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"20"}}, Body: http.NoBody, Request: r}, nil
	})
	reset := roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, syscall.ECONNRESET })
	for _, tc := range []struct {
		name    string
		base    http.RoundTripper
		policy  retry.Policy
		timeout bool
	}{
		{"the deadline during an attempt", hanging, retry.Policy{}, true},
		{"the deadline during a wait", unavailable, retry.Policy{}, true},
		{"the attempt's own timeout", hanging, retry.Policy{MaxAttempts: 1, AttemptTimeout: time.Second}, true},
		{"a reset", reset, retry.Policy{MaxAttempts: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(idem.WithOperation(t.Context(), "charge"), 10*time.Second)
				defer cancel()
				hc := &http.Client{Transport: &idem.Transport{Base: tc.base, Jar: &idem.MemoryJar{}, Policy: tc.policy}}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://payments.test/v1/charges", strings.NewReader(`{}`))
				resp, err := hc.Do(req)
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got %s; want an error", resp.Status)
				}
				var ne net.Error
				if !errors.Is(err, idem.ErrPending) || !errors.As(err, &ne) || ne.Timeout() != tc.timeout || os.IsTimeout(err) != tc.timeout {
					t.Errorf("%v: Timeout %v, os.IsTimeout %v; want pending, a timeout: %v", err, ne != nil && ne.Timeout(), os.IsTimeout(err), tc.timeout)
				}
			})
		})
	}
}

// TestAttemptContextEndsWithTheBody: under Policy.AttemptTimeout, the
// context of the attempt that got the answer ends when its body is
// closed, or read to its end, as net/http stops http.Client.Timeout's
// timer: a caller that reads a body whole and never closes it holds
// nothing until the context it gave ends. An answer without a body keeps
// http.NoBody, which callers compare against, and ends it at once.
func TestAttemptContextEndsWithTheBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   io.ReadCloser
		use    func(io.ReadCloser)
		noBody bool
	}{
		{"NoBody", http.NoBody, func(io.ReadCloser) {}, true},
		{"read to its end", io.NopCloser(strings.NewReader(`{"id":"ch_1"}`)), func(b io.ReadCloser) { io.Copy(io.Discard, b) }, false},
		{"closed unread", io.NopCloser(strings.NewReader(`{"id":"ch_1"}`)), func(b io.ReadCloser) { b.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var attempt context.Context
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				attempt = r.Context()
				return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: tc.body, Request: r}, nil
			})
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: retry.Policy{AttemptTimeout: time.Hour}}
			resp, err := post(t, context.Background(), tr, `{}`)
			if err != nil {
				t.Fatal(err)
			}
			if (resp.Body == http.NoBody) != tc.noBody {
				t.Errorf("Body %T; want http.NoBody: %v", resp.Body, tc.noBody)
			}
			if !tc.noBody && attempt.Err() != nil {
				t.Fatalf("the attempt's context ended before its body was used: %v", attempt.Err())
			}
			tc.use(resp.Body)
			if attempt.Err() == nil {
				t.Errorf("the attempt's context is still live")
			}
		})
	}
}

// failingReader fails every Read with err.
type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

// TestBodySourceFailsWhileSent: a body that GetBody gives (not one of
// memory) and that fails while an attempt sends it stops the call with
// ErrRequestBody, in a *PendingError whose Err is the reader's error, over
// HTTP/1.1 as over HTTP/2: it is not retried, as every attempt reads the
// same source. (Over HTTP/1.1 net/http reports it as a write to the
// connection, a *net.OpError, which a network fault is.) The server got a
// body cut short; the operation stays pending.
func TestBodySourceFailsWhileSent(t *testing.T) {
	diskFault := errors.New("disk on fire")
	// A regular file that cannot be read (opened for writing alone), which
	// reaches Base unwrapped: its *fs.PathError tells it from the network.
	path := filepath.Join(t.TempDir(), "upload.json")
	if err := os.WriteFile(path, []byte(`{"amount":100}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		h2     bool
		source func() (io.ReadCloser, error)
		want   error
	}{
		{false, func() (io.ReadCloser, error) {
			return io.NopCloser(io.MultiReader(strings.NewReader(`{"amo`), failingReader{diskFault})), nil
		}, diskFault},
		{true, func() (io.ReadCloser, error) {
			return io.NopCloser(io.MultiReader(strings.NewReader(`{"amo`), failingReader{diskFault})), nil
		}, diskFault},
		{false, func() (io.ReadCloser, error) { return os.OpenFile(path, os.O_WRONLY, 0) }, syscall.EBADF},
		{true, func() (io.ReadCloser, error) { return os.OpenFile(path, os.O_WRONLY, 0) }, syscall.EBADF},
	} {
		h2 := c.h2
		t.Run(fmt.Sprintf("HTTP/2 %v, %v", h2, c.want), func(t *testing.T) {
			var requests atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				if _, err := io.Copy(io.Discard, r.Body); err != nil {
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			if h2 { // over TLS; HTTP/1.1 in clear, where net/http copies the body with the connection's ReadFrom
				srv.EnableHTTP2 = true
				srv.StartTLS()
			} else {
				srv.Start()
			}
			defer srv.Close()
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, Policy: fastPolicy}
			gets := 0
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
			req.GetBody = func() (io.ReadCloser, error) {
				if gets++; gets == 1 { // the fingerprint's read
					return io.NopCloser(strings.NewReader(`{"amount":100}`)), nil
				}
				return c.source()
			}
			ctx := idem.WithOperation(context.Background(), "charge")
			_, err := tr.RoundTrip(req.WithContext(ctx))
			var pe *idem.PendingError
			if !errors.As(err, &pe) || !errors.Is(err, idem.ErrRequestBody) || !errors.Is(pe.Err, c.want) || pe.Attempts != 1 {
				t.Fatalf("got %v (%d attempts); want a *PendingError of ErrRequestBody, its Err the reader's, after 1 attempt", err, pe.Attempts)
			}
			if rec, _ := jar.Get(ctx, "charge"); rec.State != idem.StatePending || rec.Attempts != 1 || requests.Load() > 1 {
				t.Fatalf("record %s after %d attempts, %d requests at the server; want pending after 1, at most 1", rec.State, rec.Attempts, requests.Load())
			}
		})
	}
}

// TestFileBodyReachesBaseAsItIs: an attempt's body that GetBody gives as
// an *os.File reaches Base as that file, not wrapped, so that net/http can
// send it with sendfile over HTTP/1.1.
func TestFileBodyReachesBaseAsItIs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "upload.json")
	if err := os.WriteFile(path, []byte(`{"amount":100}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var bodies []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		bodies = append(bodies, fmt.Sprintf("%T", r.Body))
		r.Body.Close()
		return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://payments.test/v1/charges", f)
	req.ContentLength = 14
	req.GetBody = func() (io.ReadCloser, error) { return os.Open(path) }
	tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}}
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 1 || bodies[0] != "*os.File" {
		t.Fatalf("Base got bodies of types %v; want one *os.File", bodies)
	}
}
