package testserver_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/testserver"
)

// answer is what a client read of one response.
type answer struct {
	resp *http.Response // nil when the request failed
	body string
	err  error // sending the request or reading the body
}

// post sends a POST with chargeBody and the key to srv; header is name,
// value pairs.
func post(t *testing.T, srv *httptest.Server, key string, header ...string) answer {
	t.Helper()
	return send(t, srv, http.MethodPost, "/", chargeBody, append([]string{"Idempotency-Key", key}, header...)...)
}

// send sends a request to srv and reads its answer; header is name, value
// pairs, each added. A request that fails fails the test.
func send(t *testing.T, srv *httptest.Server, method, path, body string, header ...string) answer {
	t.Helper()
	a := try(t, srv, method, path, body, header...)
	if a.resp == nil {
		t.Fatal(a.err)
	}
	return a
}

// try is send for an answer that may break off before its status.
func try(t *testing.T, srv *httptest.Server, method, path, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp: resp, body: string(b), err: err}
}

// TestHandlerAborts: a handler that panics with http.ErrAbortHandler, as
// httputil.ReverseProxy does when an upstream's body breaks off, aborts its
// answer as without the Middleware: its caller's read fails, where it got
// a whole 500, and the panic is not logged as a failure. The claim is
// released, or the failure saved, as after any other panic.
func TestHandlerAborts(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			f := newFirstFails(t, policy, func() { panic(http.ErrAbortHandler) })
			if a := try(t, f.srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k"); a.err == nil {
				t.Fatalf("first caller: %s %q, read whole; want the answer broken off", a.resp.Status, a.body)
			}
			wantFailureRetried(t, f.mw, post(t, f.srv, "k"), f.runs.Load())
			if l := f.logged.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, "aborted") {
				t.Fatalf("log:\n%s\nwant the abort at level INFO and no error", l)
			}
		})
	}
}

// firstFails is a server whose handler, behind a Middleware that logs to
// logged, answers 201 "charged", but on its first run writes part of its
// answer, then fails.
type firstFails struct {
	srv    *httptest.Server
	mw     *testserver.Middleware
	runs   atomic.Int64
	logged syncBuffer
}

// newFirstFails starts a firstFails whose Middleware has policy and whose
// handler calls fail on its first run.
func newFirstFails(t *testing.T, policy testserver.ErrorPolicy, fail func()) *firstFails {
	f := &firstFails{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		if f.runs.Add(1) == 1 {
			io.WriteString(w, "part of the answer")
			fail()
		}
		io.WriteString(w, "charged")
	})
	f.mw = &testserver.Middleware{Store: new(testserver.MemoryStore), OnError: policy, Logger: slog.New(slog.NewTextHandler(&f.logged, nil))}
	f.srv = httptest.NewServer(f.mw.Wrap(h))
	t.Cleanup(f.srv.Close)
	return f
}

// TestHandlerGoexit: a handler that calls runtime.Goexit (t.FailNow in a
// test's handler) failed, as one that panics: its caller gets the
// handler-failed 500, the call is logged with its stack, and the claim is
// released, or the 500 saved, as OnError says.
func TestHandlerGoexit(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			f := newFirstFails(t, policy, runtime.Goexit)
			a := try(t, f.srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k")
			if a.err != nil || a.resp.StatusCode != http.StatusInternalServerError || !strings.Contains(a.body, testserver.ProblemHandlerFailed) {
				t.Errorf("first caller: %q, error %v; want the handler-failed 500", a.body, a.err)
			}
			if l := f.logged.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "runtime.Goexit") {
				t.Errorf("log:\n%s\nwant the Goexit at level ERROR, with its stack", l)
			}
			wantFailureRetried(t, f.mw, post(t, f.srv, "k"), f.runs.Load())
		})
	}
}

// TestWritePastContentLength: a handler that declares a Content-Length and
// writes more gets http.ErrContentLength for the write that goes past it,
// as from net/http, and the answer is what it declared: the first caller
// gets it whole, and the replay is the same.
func TestWritePastContentLength(t *testing.T) {
	writes := make(chan [2]error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, err1 := io.WriteString(w, "hello")
		_, err2 := io.WriteString(w, " world")
		writes <- [2]error{err1, err2}
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for i := range 2 {
		a := post(t, srv, "k")
		if a.err != nil || a.resp.StatusCode != http.StatusOK || a.body != "hello" {
			t.Fatalf("answer %d: %s %q, read error %v; want 200 %q", i+1, a.resp.Status, a.body, a.err, "hello")
		}
	}
	if errs := <-writes; errs[0] != nil || !errors.Is(errs[1], http.ErrContentLength) {
		t.Fatalf("the handler's writes returned %v; want nil, then http.ErrContentLength", errs)
	}
}

// wantFailureRetried checks the retry of a request whose handler failed on
// its first run and answers 201 "charged" on its second: under ReleaseClaim
// the claim was released and the retry ran the handler again, under
// SaveError it got the saved handler-failed 500.
func wantFailureRetried(t *testing.T, mw *testserver.Middleware, retry answer, runs int64) {
	t.Helper()
	switch s := mw.Stats(); mw.OnError {
	case testserver.ReleaseClaim:
		if retry.resp.StatusCode != http.StatusCreated || retry.body != "charged" || runs != 2 || s.Released != 1 {
			t.Fatalf("retry: %s %q, runs %d, %+v; want a second run answering 201, one claim released", retry.resp.Status, retry.body, runs, s)
		}
	case testserver.SaveError:
		if retry.resp.StatusCode != http.StatusInternalServerError || !strings.Contains(retry.body, testserver.ProblemHandlerFailed) ||
			retry.resp.Header.Get("Idempotent-Replayed") != "true" || runs != 1 {
			t.Fatalf("retry: %s %q, runs %d; want the saved handler-failed 500 replayed, one run", retry.resp.Status, retry.body, runs)
		}
	}
}

// TestBodyShorterThanContentLength: a handler whose body is shorter than
// the Content-Length it set (it wrote less, a write past the length was
// refused, or it wrote nothing) failed: net/http breaks such an answer off.
// Its caller's read fails, and the short body is not saved: the retry runs
// the handler again (ReleaseClaim) or gets the saved handler-failed 500
// (SaveError), never a clean replay of the short body.
func TestBodyShorterThanContentLength(t *testing.T) {
	for _, c := range []struct {
		name, length string
		writes       []string
	}{
		{"short", "100", []string{"short"}},
		{"past the length", "5", []string{"hello world"}},
		{"nothing", "5", nil},
	} {
		for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
			t.Run(c.name+"/"+policy.String(), func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) > 1 {
						w.WriteHeader(http.StatusCreated)
						io.WriteString(w, "charged")
						return
					}
					w.Header().Set("Content-Length", c.length)
					for _, s := range c.writes {
						io.WriteString(w, s)
					}
				})
				mw := &testserver.Middleware{Store: new(testserver.MemoryStore), OnError: policy}
				srv := httptest.NewServer(mw.Wrap(h))
				defer srv.Close()
				if a := try(t, srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k"); a.err == nil {
					t.Fatalf("first caller: %s %q, read whole; want the answer broken off", a.resp.Status, a.body)
				}
				wantFailureRetried(t, mw, post(t, srv, "k"), runs.Load())
			})
		}
	}
}

// TestShortBodyLoggedWithItsLengths: the record of a body shorter than its
// Content-Length names the length the handler declared and the bytes it
// wrote, not those of the handler-failed answer put in its place.
func TestShortBodyLoggedWithItsLengths(t *testing.T) {
	for _, policy := range []testserver.ErrorPolicy{testserver.ReleaseClaim, testserver.SaveError} {
		t.Run(policy.String(), func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "10")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "abc")
			})
			var logged syncBuffer
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), OnError: policy, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
			srv := httptest.NewServer(mw.Wrap(h))
			defer srv.Close()
			if a := try(t, srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "k"); a.err == nil {
				t.Fatalf("first caller: %s %q, read whole; want the answer broken off", a.resp.Status, a.body)
			}
			if got := logged.String(); !strings.Contains(got, "content_length=10 written=3") {
				t.Fatalf("log:\n%s\nwant the short body logged with content_length=10 written=3", got)
			}
		})
	}
}

// TestFlushErrorOfAStreamedAnswer: once the answer outgrew
// MaxSavedResponse and streams, an http.ResponseController's Flush returns
// the error of the connection's flush, as without the Middleware, so that
// a streaming handler stops once its caller left, rather than stream to no
// one until its lease ends (its context outlives the caller). Before it
// streams, a Flush sends nothing and fails nothing.
func TestFlushErrorOfAStreamedAnswer(t *testing.T) {
	buffered := make(chan error, 1)
	failed := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		io.WriteString(w, "small")
		buffered <- rc.Flush()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			io.WriteString(w, strings.Repeat("x", 4096))
			if err := rc.Flush(); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: 64, Logger: slog.New(slog.DiscardHandler)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chargeBody), chargeBody)
	if err := <-buffered; err != nil {
		t.Errorf("Flush of a buffered answer: %v; want nil", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil { // the answer streams
		t.Fatal(err)
	}
	c.Close()
	if err := <-failed; err == nil {
		t.Fatal("Flush of a streamed answer whose caller left: nil for 5 s; want the connection's error")
	}
}

// TestTrailersOfTheFirstAnswer: the first answer carries the trailers the
// handler set, declared (Trailer) or prefixed (http.TrailerPrefix), as
// trailers and not as headers, as net/http sends them, over HTTP/1.1 and
// HTTP/2, whether the answer is buffered or streamed (larger than
// MaxSavedResponse). A replay has none: they are not saved.
func TestTrailersOfTheFirstAnswer(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
		w.Header().Set("X-Sum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Late", "def")
	})
	for _, tt := range []struct {
		name     string
		http2    bool
		maxSaved int64
	}{
		{"HTTP/1.1", false, 0},
		{"HTTP/2", true, 0},
		{"HTTP/1.1 streamed", false, 4},
		{"HTTP/2 streamed", true, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: tt.maxSaved}
			a := post(t, startTLS(t, mw.Wrap(h), tt.http2), "k")
			if a.err != nil || a.resp.StatusCode != http.StatusCreated || a.body != "body of the answer" || (a.resp.ProtoMajor == 2) != tt.http2 {
				t.Fatalf("%s %s %q, read error %v; want 201 and the body", a.resp.Proto, a.resp.Status, a.body, a.err)
			}
			if got := a.resp.Header.Get("X-Sum"); got != "" {
				t.Errorf("header X-Sum: %q; want none, a trailer", got)
			}
			if a.resp.Trailer.Get("X-Sum") != "abc" || a.resp.Trailer.Get("X-Late") != "def" {
				t.Errorf("trailers %v; want X-Sum: abc and X-Late: def", a.resp.Trailer)
			}
		})
	}
}

// TestCloseNotifier: the handler's writer is an http.CloseNotifier, as
// net/http's is (a router's streaming helper asserts it: gin's
// Context.Stream), whose channel receives once the handler's context ends,
// with its lease, not before: a handler that stops on it stops as one that
// honours its context does, not when its caller leaves.
func TestCloseNotifier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		var waited time.Duration
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cn, ok := w.(interface{ CloseNotify() <-chan bool }) // http.CloseNotifier, deprecated
			if !ok {
				t.Error("the handler's writer is not an http.CloseNotifier")
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			start := time.Now()
			<-cn.CloseNotify()
			waited = time.Since(start)
			w.WriteHeader(http.StatusCreated)
		})
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore), LockTimeout: lease, Logger: slog.New(slog.DiscardHandler)}
		w := serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if waited != lease {
			t.Errorf("CloseNotify received after %v; want %v, the lease", waited, lease)
		}
		if w.Code != http.StatusCreated {
			t.Errorf("first answer: %d; want the handler's 201", w.Code)
		}
	})
}

// TestCloseNotifyOneChannel: CloseNotify returns the same channel each
// time, as net/http's does, so that a handler that asks for it in a loop
// (a select on it per event it streams) does not start a goroutine per
// call, each held until the lease ends.
func TestCloseNotifyOneChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const calls = 1000
		var grew int
		var same bool
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cn := w.(interface{ CloseNotify() <-chan bool })
			first := cn.CloseNotify()
			before := runtime.NumGoroutine()
			same = true
			for range calls {
				if cn.CloseNotify() != first {
					same = false
				}
			}
			grew = runtime.NumGoroutine() - before
			w.WriteHeader(http.StatusCreated)
		})
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Logger: slog.New(slog.DiscardHandler)}
		serve(mw.Wrap(h), request("POST", "/", chargeBody, "Idempotency-Key", "k"))
		if !same || grew >= calls/2 {
			t.Errorf("%d calls of CloseNotify: the same channel: %v, %d goroutines more; want the same channel, no goroutine per call", calls, same, grew)
		}
	})
}

// startTLS starts a TLS server of h on 127.0.0.1, speaking HTTP/2 when
// http2 is set, until t ends.
func startTLS(t *testing.T, h http.Handler, http2 bool) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = http2
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// plainAndWrapped posts one keyed request to h served as it is, and one to
// h through a Middleware over a MemoryStore, and returns both answers.
func plainAndWrapped(t *testing.T, h http.Handler, http2 bool) (plain, first answer) {
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	return post(t, startTLS(t, h, http2), "k"), post(t, startTLS(t, mw.Wrap(h), http2), "k")
}

// TestTrailerPrefixedBeforeTheHeader: a trailer named with
// http.TrailerPrefix before WriteHeader, with no Trailer header declaring
// it, reaches the first caller, as without the Middleware: net/http sees
// the prefixed key when the header is written and sends the answer chunked,
// the trailer after it. And the value of a declared trailer set before
// WriteHeader is sent in the header too, as net/http sends it.
func TestTrailerPrefixedBeforeTheHeader(t *testing.T) {
	prefixed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(http.TrailerPrefix+"X-Late", "def")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
	})
	declared := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Sum", "early")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
		w.Header().Set("X-Sum", "abc")
	})
	for _, http2 := range []bool{false, true} {
		for _, h := range []http.Handler{prefixed, declared} {
			want, got := plainAndWrapped(t, h, http2)
			if len(want.resp.Trailer) == 0 {
				t.Fatalf("%s without the Middleware: no trailers", want.resp.Proto)
			}
			if !maps.EqualFunc(got.resp.Trailer, want.resp.Trailer, slices.Equal) || got.body != want.body ||
				got.resp.Header.Get("X-Sum") != want.resp.Header.Get("X-Sum") {
				t.Errorf("%s first answer: trailers %v, header X-Sum %q, body %q; want %v, %q and %q, as without the Middleware",
					got.resp.Proto, got.resp.Trailer, got.resp.Header.Get("X-Sum"), got.body, want.resp.Trailer, want.resp.Header.Get("X-Sum"), want.body)
			}
		}
	}
}

// TestTrailerDeletedAfterTheHeader: a trailer set before WriteHeader,
// declared or named with http.TrailerPrefix, and deleted by the handler
// after it, is not sent as a trailer, as without the Middleware: net/http
// sends the trailers the header holds once the handler returns.
func TestTrailerDeletedAfterTheHeader(t *testing.T) {
	prefixed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(http.TrailerPrefix+"X-Late", "early")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
		w.Header().Del(http.TrailerPrefix + "X-Late")
	})
	declared := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Sum", "early")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
		w.Header().Del("X-Sum")
	})
	for _, http2 := range []bool{false, true} {
		for _, h := range []http.Handler{prefixed, declared} {
			want, got := plainAndWrapped(t, h, http2)
			if !maps.EqualFunc(got.resp.Trailer, want.resp.Trailer, slices.Equal) || got.body != want.body {
				t.Errorf("%s first answer: trailers %q, body %q; want %q and %q, as without the Middleware",
					got.resp.Proto, got.resp.Trailer, got.body, want.resp.Trailer, want.body)
			}
		}
	}
}

// TestTrailerNetHTTPRefuses: a field that net/http refuses to send as a
// trailer (Content-Type, Cache-Control, ...), though the handler declares it
// in Trailer, is sent in the header, as net/http sends it: the first answer
// carries it, as its replay does.
func TestTrailerNetHTTPRefuses(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Content-Type, Cache-Control, X-Sum")
		w.Header().Set("Content-Type", "text/x-mine")
		w.Header().Set("Cache-Control", "private")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body of the answer")
		w.Header().Set("X-Sum", "abc")
	})
	for _, http2 := range []bool{false, true} {
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
		srv, plain := startTLS(t, mw.Wrap(h), http2), startTLS(t, h, http2)
		for _, a := range []struct {
			name string
			answer
		}{{"without the Middleware", post(t, plain, "k")}, {"first", post(t, srv, "k")}, {"replay", post(t, srv, "k")}} {
			if ct, cc := a.resp.Header.Get("Content-Type"), a.resp.Header.Get("Cache-Control"); ct != "text/x-mine" || cc != "private" || a.resp.Trailer.Get("X-Sum") != "abc" && a.name != "replay" {
				t.Errorf("%s %s: Content-Type %q, Cache-Control %q, trailers %v; want text/x-mine, private and X-Sum: abc",
					a.resp.Proto, a.name, ct, cc, a.resp.Trailer)
			}
		}
	}
}

// TestResponseController: a handler's http.ResponseController sets the
// connection's deadlines through the Middleware's writer, as a handler
// that runs long extends its write deadline. One set in the past fails the
// first answer's write; the answer is saved all the same, and the retry
// gets it. It cannot hijack the connection, which would bypass the
// record, nor enable full duplex: both are http.ErrNotSupported.
func TestResponseController(t *testing.T) {
	set := make(chan [4]error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_, _, hijack := rc.Hijack()
		set <- [4]error{rc.SetReadDeadline(time.Now().Add(time.Minute)), rc.SetWriteDeadline(time.Unix(1, 0)),
			hijack, rc.EnableFullDuplex()}
		w.WriteHeader(http.StatusCreated)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(chargeBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k")
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("first answer: %s; want no answer, its write past the deadline the handler set", resp.Status)
	}
	if errs := <-set; errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], http.ErrNotSupported) || !errors.Is(errs[3], http.ErrNotSupported) {
		t.Fatalf("SetReadDeadline, SetWriteDeadline, Hijack, EnableFullDuplex: %v; want nil, nil, ErrNotSupported twice", errs)
	}
	if a := post(t, srv, "k"); a.resp.StatusCode != http.StatusCreated || a.resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %s %v; want the replayed 201", a.resp.Status, a.resp.Header)
	}
}

// TestReplayCarriesWhatItsStatusNeeds: a replay carries the headers its
// status requires (RFC 9110): Allow with a 405, Content-Range with a 206,
// here from http.ServeContent, which honours Range on any method.
func TestReplayCarriesWhatItsStatusNeeds(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/405" {
			w.Header().Set("Allow", "GET")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		http.ServeContent(w, r, "", time.Unix(0, 0), strings.NewReader("0123456789"))
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for _, tt := range []struct {
		path, header, want string
		status             int
	}{
		{"/405", "Allow", "GET", http.StatusMethodNotAllowed},
		{"/206", "Content-Range", "bytes 2-4/10", http.StatusPartialContent},
	} {
		for i := range 2 {
			resp := send(t, srv, http.MethodPost, tt.path, chargeBody, "Idempotency-Key", tt.path, "Range", "bytes=2-4").resp
			if resp.StatusCode != tt.status || resp.Header.Get(tt.header) != tt.want {
				t.Errorf("%s, answer %d: %s, %s %q; want %d with %q", tt.path, i+1, resp.Status, tt.header, resp.Header.Get(tt.header), tt.status, tt.want)
			}
		}
	}
}

// TestUpgradeUnderAKey: a handler that upgrades the connection (a
// WebSocket) cannot hijack it under a key: it answers its error, which
// releases the claim, and nothing of the upgrade is saved.
func TestUpgradeUnderAKey(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if _, ok := w.(http.Hijacker); !ok {
			http.Error(w, "cannot upgrade", http.StatusInternalServerError)
			return
		}
		t.Error("the handler's writer is an http.Hijacker")
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for i := range 2 {
		a := post(t, srv, "k", "Connection", "Upgrade", "Upgrade", "websocket")
		if a.resp.StatusCode != http.StatusInternalServerError || a.resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("answer %d: %s %v; want the handler's 500, not replayed", i+1, a.resp.Status, a.resp.Header)
		}
	}
	if runs.Load() != 2 || mw.Stats().Released != 2 {
		t.Fatalf("%d runs, stats %+v; want 2 runs, each claim released", runs.Load(), mw.Stats())
	}
}

// TestHeadAndOptionsUnderAKey: with HEAD and OPTIONS in Methods, each runs
// once under its key, and the replay has the first answer's status and
// headers, with no body for HEAD, as net/http sends it.
func TestHeadAndOptionsUnderAKey(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Allow", "POST, HEAD, OPTIONS")
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello")
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Methods: []string{"POST", "HEAD", "OPTIONS"}}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for _, method := range []string{http.MethodHead, http.MethodOptions} {
		want := "hello"
		if method == http.MethodHead {
			want = ""
		}
		for i := range 2 {
			a := send(t, srv, method, "/", "", "Idempotency-Key", method)
			resp, b, err := a.resp, a.body, a.err
			if err != nil || resp.StatusCode != http.StatusOK || b != want || resp.Header.Get("Allow") == "" ||
				resp.Header.Get("Content-Type") != "text/plain" || (resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) {
				t.Fatalf("%s, answer %d: %s %v %q, %v; want 200 %q with its headers", method, i+1, resp.Status, resp.Header, b, err, want)
			}
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs; want one per method", runs.Load())
	}
}

// TestHeadLargerThanMaxSavedResponse: the body a HEAD's handler writes is
// never sent (net/http drops it), so however long, it is not too large to
// save: the replay is the first answer, status and headers, not the
// response-too-large marker, and no marker is counted.
func TestHeadLargerThanMaxSavedResponse(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/v1/reports/1")
		w.WriteHeader(http.StatusCreated)
		runs.Add(1)
		for range 10 {
			io.WriteString(w, "<html>0123456789</html>") // past MaxSavedResponse mid-way
		}
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Methods: []string{"HEAD"}, MaxSavedResponse: 50}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for i := range 2 {
		a := send(t, srv, http.MethodHead, "/", "", "Idempotency-Key", "k")
		if a.err != nil || a.resp.StatusCode != http.StatusCreated || a.body != "" || a.resp.Header.Get("Location") != "/v1/reports/1" || a.resp.Header.Get("Content-Length") != "" ||
			a.resp.Header.Get("Content-Type") != "text/html; charset=utf-8" || (a.resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) {
			t.Fatalf("answer %d: %s %v %q, %v; want the handler's 201 with its Location and sniffed type, no body nor length", i+1, a.resp.Status, a.resp.Header, a.body, a.err)
		}
	}
	if st := mw.Stats(); runs.Load() != 1 || st.TooLarge != 0 || st.Replays != 1 {
		t.Fatalf("%d runs, %+v; want one run, one replay, nothing too large", runs.Load(), st)
	}
}

// TestHeadContentLengthReplayed: a HEAD's Content-Length is the length its
// GET would send, which a handler sets without writing the body, or writes
// a body net/http drops; the replay carries the Content-Length the first
// answer carried, whether the handler wrote no body, one past
// MaxSavedResponse (dropped), or one shorter than it said.
func TestHeadContentLengthReplayed(t *testing.T) {
	for _, c := range []struct {
		name  string
		write int // bytes of body the handler writes after its Content-Length of 230
	}{{"no body", 0}, {"body past MaxSavedResponse", 230}, {"body shorter than its length", 5}} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/html")
				w.Header().Set("Content-Length", "230")
				io.WriteString(w, strings.Repeat("x", c.write))
			})
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Methods: []string{"HEAD"}, MaxSavedResponse: 50}
			srv := httptest.NewServer(mw.Wrap(h))
			defer srv.Close()
			for i := range 2 {
				a := send(t, srv, http.MethodHead, "/", "", "Idempotency-Key", "k")
				if a.err != nil || a.resp.StatusCode != http.StatusOK || a.body != "" || a.resp.Header.Get("Content-Length") != "230" ||
					a.resp.Header.Get("Content-Type") != "text/html" || (a.resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) {
					t.Fatalf("answer %d: %s %v %q, %v; want the handler's 200 with its Content-Length, 230, and no body", i+1, a.resp.Status, a.resp.Header, a.body, a.err)
				}
			}
			if runs.Load() != 1 {
				t.Fatalf("%d runs; want one", runs.Load())
			}
		})
	}
}

// TestEncodedAnswerReplayed: an answer the handler compressed itself, with
// its Content-Encoding and Content-Length, is replayed as it was sent: an
// http.Transport that asked for gzip decompresses both.
func TestEncodedAnswerReplayed(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, `{"id":"ch_1"}`)
	zw.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", strconv.Itoa(gz.Len()))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(gz.Bytes())
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for i := range 2 {
		a := post(t, srv, "k")
		if a.err != nil || a.resp.StatusCode != http.StatusCreated || a.body != `{"id":"ch_1"}` || !a.resp.Uncompressed {
			t.Fatalf("answer %d: %s %q, %v, uncompressed %v; want 201, decompressed", i+1, a.resp.Status, a.body, a.err, a.resp.Uncompressed)
		}
	}
}

// TestBodyTheHandlerNeverReads: the Middleware reads the body whole before
// the handler runs, so a handler that never reads it does not change the
// fingerprint (the same key with another body is 422), and the connection
// is reused.
func TestBodyTheHandlerNeverReads(t *testing.T) {
	var runs, conns atomic.Int32
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewUnstartedServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	var codes []int
	for _, body := range []string{strings.Repeat("a", 100<<10), strings.Repeat("a", 100<<10), strings.Repeat("b", 100<<10)} {
		codes = append(codes, send(t, srv, http.MethodPost, "/", body, "Idempotency-Key", "k").resp.StatusCode)
	}
	if !slices.Equal(codes, []int{201, 201, 422}) || runs.Load() != 1 || conns.Load() != 1 {
		t.Fatalf("statuses %v after %d runs, over %d connections; want 201, 201, 422 after one run, over one", codes, runs.Load(), conns.Load())
	}
}

// TestKeySentTwiceOverHTTP2: two Idempotency-Key fields with different
// values in one HTTP/2 request are refused, as over HTTP/1.1.
func TestKeySentTwiceOverHTTP2(t *testing.T) {
	var runs atomic.Int32
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := startTLS(t, mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })), true)
	resp := send(t, srv, http.MethodPost, "/", chargeBody, "Idempotency-Key", "a", "Idempotency-Key", "b").resp
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusBadRequest || runs.Load() != 0 {
		t.Fatalf("%s %s after %d runs; want HTTP/2 400, no run", resp.Proto, resp.Status, runs.Load())
	}
}

// TestHeadersSetBeforeTheMiddleware: the handler's writer holds the headers
// an outer handler set before the Middleware ran, as the one writer of
// net/http would: the handler reads them, may delete them, and the
// Content-Type an outer handler chose is not replaced by a sniffed one,
// on the first answer nor on its replay. A handler that panics leaves
// them as the outer handler set them, its own dropped.
func TestHeadersSetBeforeTheMiddleware(t *testing.T) {
	seen := make(chan string, 2)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- w.Header().Get("X-Request-Id")
		w.Header().Del("X-Frame-Options")
		w.Header().Set("Location", "/orders/1")
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		io.WriteString(w, `{"id":1}`)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Request-Id", "req-1")
			w.Header().Set("X-Frame-Options", "DENY")
			next.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(outer(mw.Wrap(h)))
	defer srv.Close()
	for i, replayed := range []string{"", "true"} {
		a := post(t, srv, "k")
		hdr := a.resp.Header
		if a.resp.StatusCode != http.StatusOK || hdr.Get("Idempotent-Replayed") != replayed || a.body != `{"id":1}` {
			t.Fatalf("answer %d: %s %q, replayed %q; want 200 {\"id\":1}, replayed %q", i+1, a.resp.Status, a.body, hdr.Get("Idempotent-Replayed"), replayed)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("answer %d: Content-Type %q; want application/json, set before the Middleware", i+1, ct)
		}
		if i == 0 && (hdr.Get("X-Frame-Options") != "" || hdr.Get("Location") != "/orders/1") {
			t.Errorf("answer %d: header %v; want X-Frame-Options deleted by the handler, its Location", i+1, hdr)
		}
	}
	if id := <-seen; id != "req-1" {
		t.Errorf("the handler read X-Request-Id %q; want req-1, set before the Middleware", id)
	}
	a := send(t, srv, http.MethodPost, "/panic", chargeBody, "Idempotency-Key", "p")
	<-seen
	if hdr := a.resp.Header; a.resp.StatusCode != http.StatusInternalServerError || hdr.Get("X-Frame-Options") != "DENY" ||
		hdr.Get("X-Request-Id") != "req-1" || hdr.Get("Location") != "" || hdr.Get("Content-Type") != "application/problem+json" {
		t.Errorf("after a panic: %s, header %v; want 500 problem+json with the outer handler's headers and not the handler's", a.resp.Status, hdr)
	}
}

// TestHeaderChangedAfterWriteHeader: net/http sends the header as it was at
// WriteHeader (or the first Write): a change after it is not sent, and the
// type of the body is sniffed when none was set by then. The first answer
// through the Middleware carries the header plain net/http sends for the
// same handler, whether it is buffered or streamed (past
// MaxSavedResponse), and the replay of a buffered one the same.
func TestHeaderChangedAfterWriteHeader(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Language", "en")
		w.Header().Set("X-Early", "1")
		w.WriteHeader(http.StatusCreated)
		w.Header().Del("Content-Language")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/charges/1")
		w.Header().Set("X-Late", "1")
		io.WriteString(w, `{"id":1}`)
	})
	plain := httptest.NewServer(h)
	defer plain.Close()
	want := send(t, plain, http.MethodPost, "/", chargeBody).resp.Header
	if want.Get("Content-Language") != "en" || want.Get("Content-Type") != "text/plain; charset=utf-8" || want.Get("Location") != "" || want.Get("X-Late") != "" {
		t.Fatalf("plain net/http sent %v; want the header as it was at WriteHeader, its type sniffed", want)
	}
	for _, c := range []struct {
		name     string
		maxSaved int64
	}{{"buffered", 0}, {"streamed", 4}} {
		t.Run(c.name, func(t *testing.T) {
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore), MaxSavedResponse: c.maxSaved}
			srv := httptest.NewServer(mw.Wrap(h))
			defer srv.Close()
			for i := range 2 {
				a := post(t, srv, "k")
				if i == 1 && c.maxSaved > 0 {
					break // the replay is the response-too-large marker
				}
				names := []string{"Content-Language", "Content-Type", "Location"} // replayed
				if i == 0 {
					names = append(names, "X-Early", "X-Late")
				}
				if a.resp.StatusCode != http.StatusCreated || a.body != `{"id":1}` {
					t.Fatalf("answer %d: %s %q; want 201 {\"id\":1}", i+1, a.resp.Status, a.body)
				}
				for _, name := range names {
					if got := a.resp.Header.Values(name); !slices.Equal(got, want.Values(name)) {
						t.Errorf("answer %d: %s %q; want %q, as plain net/http sends it", i+1, name, got, want.Values(name))
					}
				}
			}
		})
	}
}

// TestInformationalAnswers: a handler's 103 Early Hints reaches the first
// caller at once, with the Link header set by then, before the final
// answer, as plain net/http sends it; it is not the answer saved, and a
// replay sends the saved final answer only. A 101 Switching Protocols is
// not passed through: without a connection to hijack there is no switch,
// and the handler's final answer is the one sent and replayed.
func TestInformationalAnswers(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		if r.URL.Path == "/switch" {
			w.WriteHeader(http.StatusSwitchingProtocols)
		} else {
			w.WriteHeader(http.StatusEarlyHints)
		}
		w.Header().Set("Location", "/v1/charges/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	// do sends a POST to srv and returns its answer and the 1xx answers
	// before it, as "code Link" lines.
	do := func(srv *httptest.Server, path, key string) (answer, []string) {
		t.Helper()
		var got []string
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, header textproto.MIMEHeader) error {
			got = append(got, strconv.Itoa(code)+" "+header.Get("Link"))
			return nil
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, srv.URL+path, strings.NewReader(chargeBody))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return answer{resp: resp, body: string(b), err: err}, got
	}
	plain := httptest.NewServer(h)
	defer plain.Close()
	if a, hints := do(plain, "/", ""); a.resp.StatusCode != http.StatusCreated || !slices.Equal(hints, []string{"103 </style.css>; rel=preload"}) {
		t.Fatalf("plain net/http: %s after 1xx %q; want 201 after one 103 with its Link", a.resp.Status, hints)
	}
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	for _, c := range []struct {
		path  string
		hints []string // of the first answer
	}{{"/", []string{"103 </style.css>; rel=preload"}}, {"/switch", nil}} {
		for i := range 2 {
			a, hints := do(srv, c.path, c.path)
			want := c.hints
			if i == 1 {
				want = nil
			}
			if a.err != nil || a.resp.StatusCode != http.StatusCreated || a.body != "charged" || a.resp.Header.Get("Location") != "/v1/charges/1" ||
				(a.resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) || !slices.Equal(hints, want) {
				t.Errorf("%s, answer %d: %s %v %q after 1xx %q, %v; want 201 charged with its Location after 1xx %q",
					c.path, i+1, a.resp.Status, a.resp.Header, a.body, hints, a.err, want)
			}
		}
	}
	if st := mw.Stats(); st.Claims != 2 || st.Replays != 2 {
		t.Fatalf("stats %+v; want 2 claims, 2 replays", st)
	}
}

// TestHeaderKeysEqualButForCase: a handler that sets a header under a key
// that is not canonical (w.Header()["content-type"], beside the
// Content-Type the answer gets sniffed, as net/http sniffs one) gets, in
// every replay, the values its first caller got, in that order. Before,
// the replay kept one of the two keys' values, which one depending on the
// order of a map: from one retry to the next, another Content-Type.
func TestHeaderKeysEqualButForCase(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		mw := &testserver.Middleware{Store: store, ReplayHeaders: []string{"Content-Type", "X-Thing"}}
		srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["content-type"] = []string{"application/json"}
			w.Header()["x-thing"] = []string{"b"}
			w.Header()["X-Thing"] = []string{"a"}
			io.WriteString(w, `{"id":"ch_1"}`)
		})))
		defer srv.Close()
		first := post(t, srv, "k")
		want := fmt.Sprint(first.resp.Header["Content-Type"], first.resp.Header["X-Thing"])
		if len(first.resp.Header["Content-Type"]) != 2 || len(first.resp.Header["X-Thing"]) != 2 {
			t.Fatalf("first answer's header %v; want two Content-Types and two X-Things", first.resp.Header)
		}
		for i := range 20 { // a map's order differs from one range to the next
			a := post(t, srv, "k")
			if got := fmt.Sprint(a.resp.Header["Content-Type"], a.resp.Header["X-Thing"]); got != want || a.resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay %d: %s (replayed %q); want the first's %s", i, got, a.resp.Header.Get("Idempotent-Replayed"), want)
			}
		}
	})
}

// TestHandlersOwnContinue: a handler that answers a request with Expect:
// 100-continue with its own 100 Continue, before it reads the body, has
// its client told to go on once, as under plain net/http, where the
// handler's 100 takes the place of the one the server sends when the body
// is first read. The Middleware reads the body, and net/http sends its 100
// Continue, before the handler runs: the handler's own would be a second.
func TestHandlersOwnContinue(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusContinue)
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	})
	// continues sends a POST with Expect: 100-continue to srv, its body
	// once the first 100 Continue came, and returns how many came, and the
	// whole answer.
	continues := func(srv *httptest.Server, key string) (int, string) {
		t.Helper()
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
			key, len(chargeBody))
		const cont = "HTTP/1.1 100 Continue\r\n\r\n"
		got := make([]byte, len(cont))
		if _, err := io.ReadFull(conn, got); err != nil || string(got) != cont {
			t.Fatalf("before the body: %q, %v; want %q", got, err, cont)
		}
		io.WriteString(conn, chargeBody)
		rest, err := io.ReadAll(conn)
		if err != nil {
			t.Fatal(err)
		}
		all := string(got) + string(rest)
		return strings.Count(all, "HTTP/1.1 100 Continue\r\n"), all
	}
	plain := httptest.NewServer(h)
	defer plain.Close()
	if n, all := continues(plain, "k"); n != 1 || !strings.Contains(all, "201 Created") {
		t.Fatalf("plain net/http: %d 100 Continue in %q; want one, then 201", n, all)
	}
	srv := httptest.NewServer((&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h))
	defer srv.Close()
	if n, all := continues(srv, "k"); n != 1 || !strings.Contains(all, "201 Created") || !strings.HasSuffix(all, chargeBody) {
		t.Errorf("through the Middleware: %d 100 Continue in %q; want one, as plain net/http sends, then 201 with the body", n, all)
	}
}

// superfluous answers twice, the second WriteHeader ignored.
func superfluous(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	w.WriteHeader(http.StatusInternalServerError)
	io.WriteString(w, "charged")
}

// TestSuperfluousWriteHeader: a second WriteHeader changes nothing and is
// logged, as net/http logs it, with the handler's line that called it: to
// the Logger when there is one, otherwise the line plain net/http writes
// to the server's ErrorLog.
func TestSuperfluousWriteHeader(t *testing.T) {
	// run serves one POST through h on a server whose ErrorLog it returns.
	run := func(h http.Handler) string {
		t.Helper()
		var buf syncBuffer
		srv := httptest.NewUnstartedServer(h)
		srv.Config.ErrorLog = log.New(&buf, "", 0)
		srv.Start()
		defer srv.Close()
		if a := post(t, srv, "k"); a.resp.StatusCode != http.StatusCreated || a.body != "charged" {
			t.Fatalf("%s %q; want the first WriteHeader's 201, charged", a.resp.Status, a.body)
		}
		return buf.String()
	}
	plain := run(http.HandlerFunc(superfluous))
	if !strings.Contains(plain, "http: superfluous response.WriteHeader call from github.com/idemkit/idem/testserver_test.superfluous (http_test.go:") {
		t.Fatalf("plain net/http logged %q; want its superfluous WriteHeader line, naming the handler", plain)
	}
	t.Run("ErrorLog", func(t *testing.T) {
		if got := run((&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(http.HandlerFunc(superfluous))); got != plain {
			t.Errorf("without a Logger, the server's ErrorLog has %q; want plain net/http's %q", got, plain)
		}
	})
	t.Run("Logger", func(t *testing.T) {
		var logged syncBuffer
		mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Logger: slog.New(slog.NewTextHandler(&logged, nil))}
		if got := run(mw.Wrap(http.HandlerFunc(superfluous))); got != "" {
			t.Errorf("with a Logger, the server's ErrorLog has %q; want nothing", got)
		}
		line := strings.TrimPrefix(plain[strings.Index(plain, " from ")+len(" from "):], "github.com/idemkit/idem/testserver_test.superfluous ")
		line = strings.Trim(strings.TrimSpace(line), "()")
		if got := logged.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "superfluous response.WriteHeader call") ||
			!strings.Contains(got, "testserver_test.superfluous") || !strings.Contains(got, line) || !strings.Contains(got, "key=k") {
			t.Errorf("the Logger has %q; want a warning of the superfluous call, with the key and the handler's %s", got, line)
		}
	})
}

// TestHandlersRequestBody: the handler's request through the Middleware,
// which read its body whole to fingerprint it, has the body and the
// length plain net/http gives it: -1 for a body sent chunked, whose length
// was not declared, and http.NoBody for a request without one.
func TestHandlersRequestBody(t *testing.T) {
	seen := make(chan string, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		seen <- fmt.Sprintf("ContentLength %d, NoBody %v, body %q, %v", r.ContentLength, r.Body == http.NoBody, b, err)
		w.WriteHeader(http.StatusCreated)
	})
	// do sends a POST of body to srv, chunked when length is -1, and
	// returns what the handler saw.
	do := func(srv *httptest.Server, key, body string, length int64) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		if body == "" {
			req.Body = nil
		}
		req.ContentLength = length
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "text/plain")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s; want the handler's 201", resp.Status)
		}
		return <-seen
	}
	plain := httptest.NewServer(h)
	defer plain.Close()
	srv := httptest.NewServer((&testserver.Middleware{Store: new(testserver.MemoryStore)}).Wrap(h))
	defer srv.Close()
	for i, c := range []struct {
		body   string
		length int64
	}{{"abc", -1}, {"abc", 3}, {"", 0}} {
		want := do(plain, fmt.Sprint(i), c.body, c.length)
		if got := do(srv, fmt.Sprint(i), c.body, c.length); got != want {
			t.Errorf("a body %q of length %d: through the Middleware the handler saw %s; want %s, as under plain net/http", c.body, c.length, got, want)
		}
	}
}
