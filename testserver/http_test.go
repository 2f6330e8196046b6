package testserver_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
)

// answer is what a client read of one response.
type answer struct {
	resp *http.Response
	body string
	err  error // reading the body
}

// post sends a POST with chargeBody and the key to srv; header is name,
// value pairs.
func post(t *testing.T, srv *httptest.Server, key string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(chargeBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp: resp, body: string(b), err: err}
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
			srv := httptest.NewUnstartedServer(mw.Wrap(h))
			srv.EnableHTTP2 = tt.http2
			srv.StartTLS()
			defer srv.Close()
			a := post(t, srv, "k")
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

// TestResponseControllerDeadlines: a handler's http.ResponseController
// sets the connection's deadlines through the Middleware's writer, as a
// handler that runs long extends its write deadline. One set in the past
// fails the first answer's write; the answer is saved all the same, and
// the retry gets it.
func TestResponseControllerDeadlines(t *testing.T) {
	set := make(chan [2]error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		set <- [2]error{rc.SetReadDeadline(time.Now().Add(time.Minute)), rc.SetWriteDeadline(time.Unix(1, 0))}
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
	if errs := <-set; errs[0] != nil || errs[1] != nil {
		t.Fatalf("SetReadDeadline, SetWriteDeadline: %v; want both nil", errs)
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
			req, err := http.NewRequest(http.MethodPost, srv.URL+tt.path, strings.NewReader(chargeBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", tt.path)
			req.Header.Set("Range", "bytes=2-4")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get(tt.header) != tt.want {
				t.Errorf("%s, answer %d: %s, %s %q; want %d with %q", tt.path, i+1, resp.Status, tt.header, resp.Header.Get(tt.header), tt.status, tt.want)
			}
		}
	}
}
