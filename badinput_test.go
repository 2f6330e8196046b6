//go:build unix

package idem_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/nobody"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// The test binary re-executes itself as a helper process: with helperEnv
// set, TestMain runs the helper instead of the tests.
const (
	helperEnv     = "IDEM_TEST_HELPER" // lock or open
	helperPathEnv = "IDEM_TEST_HELPER_PATH"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helper(mode, os.Getenv(helperPathEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper is the child's side:
//
//	lock: hold a write transaction on the SQLite file at path, as another
//	      program sharing the jar would; print "locked"; release it when
//	      standard input closes.
//	open: keyjar.Open the path; print "permission" when the error wraps
//	      fs.ErrPermission, else "opened" or "other: <error>".
func helper(mode, path string) error {
	switch mode {
	case "lock":
		db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
		if err != nil {
			return err
		}
		defer db.Close()
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		defer tx.Rollback()
		fmt.Println("locked")
		_, err = io.Copy(io.Discard, os.Stdin)
		return err
	case "open":
		j, err := keyjar.Open(context.Background(), path, nil)
		switch {
		case err == nil:
			fmt.Println("opened")
			return j.Close()
		case errors.Is(err, fs.ErrPermission):
			fmt.Println("permission:", err)
		default:
			fmt.Println("other:", err)
		}
		return nil
	}
	return fmt.Errorf("unknown helper %q", mode)
}

// startHelper starts the helper mode on path and returns its first line
// and a function that ends it. cred, when not nil, runs it as that user;
// bin is the test binary to run ("" for this one).
func startHelper(t *testing.T, bin, mode, path string, cred *syscall.Credential) (line string, stop func()) {
	t.Helper()
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperPathEnv+"="+path)
	cmd.Stderr = os.Stderr
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %s: %v", mode, err)
		}
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		stop()
		t.Fatalf("helper %s ended without a word: %v", mode, sc.Err())
	}
	return sc.Text(), stop
}

// lockByAnotherProcess holds a write transaction on the SQLite file at
// path from a helper process until the returned function is called.
func lockByAnotherProcess(t *testing.T, path string) (unlock func()) {
	t.Helper()
	line, stop := startHelper(t, "", "lock", path, nil)
	if line != "locked" {
		stop()
		t.Fatalf("lock helper: %s", line)
	}
	return stop
}

// unreachableStore is the server's store behind a switch: when down is
// set, every call fails as a database across the network would.
type unreachableStore struct {
	testserver.Store
	down *atomic.Bool
}

var errStoreDown = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func (s unreachableStore) Claim(ctx context.Context, scope, key, fp string, token testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if s.down.Load() {
		return testserver.Entry{}, false, errStoreDown
	}
	return s.Store.Claim(ctx, scope, key, fp, token, now)
}

func (s unreachableStore) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	if s.down.Load() {
		return false, errStoreDown
	}
	return s.Store.TakeOver(ctx, scope, key, old, new)
}

func (s unreachableStore) Save(ctx context.Context, scope, key string, token testserver.Fence, resp testserver.Response) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Save(ctx, scope, key, token, resp)
}

func (s unreachableStore) Release(ctx context.Context, scope, key string, token testserver.Fence) (bool, error) {
	if s.down.Load() {
		return false, errStoreDown
	}
	return s.Store.Release(ctx, scope, key, token)
}

// stack is the whole path of a call: idem.Transport with a keyjar file,
// over loopback, to testserver.Middleware on a sqlitestore file, in front
// of a handler that counts its runs.
type stack struct {
	jarPath, storePath string
	jar                *keyjar.Jar
	store              *sqlitestore.Store
	down               atomic.Bool
	mw                 *testserver.Middleware
	srv                *httptest.Server
	runs, requests     atomic.Int64
	tr                 *idem.Transport
}

const saveCap = 4 << 10 // the server's MaxSavedResponse

func newStack(t *testing.T) *stack {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	s := &stack{jarPath: filepath.Join(dir, "keys.db"), storePath: filepath.Join(dir, "server.db")}
	var err error
	if s.jar, err = keyjar.Open(ctx, s.jarPath, &keyjar.Options{BusyTimeout: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.jar.Close() })
	if s.store, err = sqlitestore.Open(ctx, s.storePath, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	s.mw = &testserver.Middleware{Store: unreachableStore{s.store, &s.down}, MaxSavedResponse: saveCap}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.runs.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=handler-cookie-value")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
		if r.URL.Path == "/v1/reports" { // an answer larger than the save cap
			w.Write(bytes.Repeat([]byte(" "), 16*saveCap))
		}
	})
	wrapped := s.mw.Wrap(handler)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		wrapped.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	s.tr = &idem.Transport{Base: s.srv.Client().Transport, Jar: s.jar, Policy: retry.Policy{MaxAttempts: 1}, MaxBuffer: maxBuffer}
	// Something to lose: one operation done, and its key saved on the server.
	resp, err := s.send(t, "charge:order-1", "/v1/charges", `{"amount":100}`, nil)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("first charge: %v, %v", resp, err)
	}
	return s
}

// send posts body under the operation op through the stack's Transport,
// reads the answer and closes it.
func (s *stack) send(t *testing.T, op, path, body string, header http.Header) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), op), http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	return readAll(s.tr.RoundTrip(req))
}

// readAll reads and closes the body of resp, if there is one, keeping it
// in resp.Body for the checks.
func readAll(resp *http.Response, err error) (*http.Response, error) {
	if resp != nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil && err == nil {
			err = rerr
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	return resp, err
}

// contents is what the jar and the store hold.
type contents struct {
	jar   map[string]idem.Record
	store map[string]string // scope/key → the row
}

func (s *stack) contents(t *testing.T) contents {
	t.Helper()
	recs, err := s.jar.List(context.Background(), idem.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	c := contents{jar: map[string]idem.Record{}, store: map[string]string{}}
	for _, r := range recs {
		c.jar[r.Op] = r
	}
	rows, err := s.store.DB().Query(`SELECT scope, key, fingerprint, status, response_status, response_header, length(response_body), locked_at, created FROM idempotency_keys`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var scope, key, fp, status string
		var rstatus, rlen sql.NullInt64
		var rheader sql.NullString
		var locked, created int64
		if err := rows.Scan(&scope, &key, &fp, &status, &rstatus, &rheader, &rlen, &locked, &created); err != nil {
			t.Fatal(err)
		}
		c.store[scope+"/"+key] = fmt.Sprint(fp, status, rstatus, rheader, rlen, locked, created)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// patternReader yields n bytes of a repeating pattern without holding
// them, then tail: a large body that costs no memory.
func patternReader(n int64, tail string) io.Reader {
	block := bytes.Repeat([]byte("0123456789abcdef"), 2048)
	return io.MultiReader(io.LimitReader(&cycle{block: block}, n-int64(len(tail))), strings.NewReader(tail))
}

type cycle struct {
	block []byte
	off   int
}

func (c *cycle) Read(p []byte) (int, error) {
	n := copy(p, c.block[c.off:])
	c.off = (c.off + n) % len(c.block)
	return n, nil
}

// allocated returns the bytes the process allocated while f ran: an upper
// bound of how much the heap grew.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

const (
	hugeBody  = 100 << 20 // 100 MB
	maxBuffer = 1 << 20   // the Transport's MaxBuffer in these tests
	// heapBound is what one call with a huge body may allocate in all: a
	// few times MaxBuffer (a buffer grows by doubling; the race detector
	// doubles that again), never in proportion to the body.
	heapBound = 16 * maxBuffer
)

// countingBase is a RoundTripper that reads each attempt's body to the
// end, counting its bytes, and answers 201.
type countingBase struct{ attempts, bytes atomic.Int64 }

func (b *countingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.attempts.Add(1)
	if r.Body != nil {
		n, err := io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		b.bytes.Add(n)
	}
	return &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
}

// TestBadInput sends bad input through the whole stack, one row at a time.
// Each row gets its typed error (or its typed answer), and afterwards the
// jar and the server's store hold exactly what they held before, but for
// the records the row names.
func TestBadInput(t *testing.T) {
	errGetBody := errors.New("body source gone")
	errRead := errors.New("disk read failed")
	keyed := func(values ...string) func(t *testing.T, s *stack) (*http.Response, error) {
		return func(t *testing.T, s *stack) (*http.Response, error) {
			return s.send(t, "charge:bad-key", "/v1/charges", `{"amount":1}`, http.Header{idem.KeyHeader: values})
		}
	}
	toURL := func(url string) func(t *testing.T, s *stack) (*http.Response, error) {
		return func(t *testing.T, s *stack) (*http.Response, error) {
			req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "charge:bad-url"), http.MethodPost, url, strings.NewReader(`{"amount":1}`))
			if err != nil {
				t.Fatal(err)
			}
			return readAll(s.tr.RoundTrip(req))
		}
	}
	edited := func(op string, edit func(*http.Request)) func(t *testing.T, s *stack) (*http.Response, error) {
		return func(t *testing.T, s *stack) (*http.Response, error) {
			ctx := context.Background()
			if op != "" {
				ctx = idem.WithOperation(ctx, op)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader(`{"amount":1}`))
			edit(req)
			return readAll(s.tr.RoundTrip(req))
		}
	}
	withHeader := func(op, name, value string) func(t *testing.T, s *stack) (*http.Response, error) {
		return edited(op, func(r *http.Request) { r.Header[name] = []string{value} })
	}
	rows := []struct {
		name string
		run  func(t *testing.T, s *stack) (*http.Response, error)
		want error // matched with errors.Is; nil: a response comes back
		// Without error: the answer's status and problem type ("" for the
		// handler's own answer).
		status  int
		problem string
		// What the row may add: operations in the jar, keys in the store,
		// runs of the handler. Anything else must be unchanged.
		addsOps  []string
		addsKeys int
		runs     int64
		check    func(t *testing.T, s *stack, resp *http.Response, err error)
	}{
		{name: "key of 0 characters", run: keyed(""), want: idem.ErrInvalidKey},
		{name: "key of 256 characters", run: keyed(strings.Repeat("k", 256)), want: idem.ErrInvalidKey},
		{name: "key of 10 000 characters", run: keyed(strings.Repeat("k", 10000)), want: idem.ErrInvalidKey},
		{name: "non-ASCII key", run: keyed("clé-42"), want: idem.ErrInvalidKey},
		{name: "key with a control character", run: keyed("order\x0142"), want: idem.ErrInvalidKey},
		{name: "key with a line break", run: keyed("order\r\nX-Injected: 1"), want: idem.ErrInvalidKey},
		{name: "key with a space at the end", run: keyed("order-42 "), want: idem.ErrInvalidKey},
		{name: "duplicate key headers", run: keyed("order-42", "order-43"), want: idem.ErrInvalidKey},
		{name: "duplicate identical key headers", run: keyed("order-42", "order-42"), want: idem.ErrInvalidKey},
		{name: "two keys in one header line", run: keyed("order-42, order-43"), want: idem.ErrInvalidKey},
		{name: "quoted key with an escape the server refuses", run: keyed(`"order\x42"`), want: idem.ErrInvalidKey},
		{name: "quoted key without its closing quote", run: keyed(`"order-42`), want: idem.ErrInvalidKey},
		{name: "text after a quoted key", run: keyed(`"order-42"x`), want: idem.ErrInvalidKey},
		{name: "quoted empty key", run: keyed(`""`), want: idem.ErrInvalidKey},
		{name: "quoted key with a space at the start", run: keyed(`" order-42"`), want: idem.ErrInvalidKey},
		{name: "quoted key with a comma", run: keyed(`"order,42"`), status: http.StatusCreated,
			addsOps: []string{"charge:bad-key"}, addsKeys: 1, runs: 1},
		// A server address given without its scheme, or without the // after
		// it: a URL no request can be sent to, whose record would stay
		// pending, and a fixed URL would be a *MismatchError.
		{name: "URL without a scheme", run: toURL("localhost:8080/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL without //", run: toURL("http//localhost:8080/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL with an empty host", run: toURL("http:///v1/charges"), want: idem.ErrInvalidURL},
		// Ports url.Parse takes and no dial does: each attempt would fail
		// alike, and a resume too.
		{name: "URL with port 99999", run: toURL("http://127.0.0.1:99999/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL with port 65536", run: toURL("https://[::1]:65536/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL with port 0", run: toURL("http://127.0.0.1:0/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL of a scheme misspelt", run: toURL("htp://127.0.0.1:8080/v1/charges"), want: idem.ErrInvalidURL},
		{name: "URL of a scheme net/http does not send", run: toURL("ftp://127.0.0.1/v1/charges"), want: idem.ErrInvalidURL},
		// What net/http's Transport refuses before it dials, each attempt
		// alike, and a resume too: refused before anything is stored,
		// named or not.
		{name: "header value with a line break", run: withHeader("charge:bad-header", "X-Note", "a\r\nX-Injected: 1"), want: idem.ErrInvalidHeader},
		{name: "header value with a NUL", run: withHeader("charge:bad-header", "X-Note", "a\x00b"), want: idem.ErrInvalidHeader},
		{name: "header name with a space", run: withHeader("charge:bad-header", "X Note", "a"), want: idem.ErrInvalidHeader},
		{name: "empty header name", run: withHeader("charge:bad-header", "", "a"), want: idem.ErrInvalidHeader},
		{name: "header value with a line break, without a name", run: withHeader("", "X-Note", "a\nb"), want: idem.ErrInvalidHeader},
		{
			name: "trailer name with a colon",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader(`{"amount":1}`))
				req.Trailer = http.Header{"X-Sum:": nil}
				return readAll(s.tr.RoundTrip(req))
			},
			want: idem.ErrInvalidHeader,
		},
		// A method that is not a token, which a Methods entry matches
		// under Unicode case folding (ſ is s), refused unsent over HTTP/1.
		{
			// As a config file may give it: the POST it meant to key would
			// go out unkeyed, unrecorded; the GET fails alike.
			name: "Transport.Methods entry that is not a method",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				defer func(m []string) { s.tr.Methods = m }(s.tr.Methods)
				s.tr.Methods = []string{"PATCH", "POST "}
				body := &closeTracker{Reader: strings.NewReader(`{"amount":1}`)}
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", body)
				if _, err := s.tr.RoundTrip(req); !errors.Is(err, idem.ErrInvalidMethods) || !strings.Contains(err.Error(), `"POST "`) || !body.closed {
					t.Errorf("POST: %v, body closed %v; want ErrInvalidMethods quoting \"POST \", the body closed", err, body.closed)
				}
				req, _ = http.NewRequest(http.MethodGet, s.srv.URL+"/v1/charges", nil)
				return readAll(s.tr.RoundTrip(req))
			},
			want: idem.ErrInvalidMethods,
		},
		{name: "method that is not a token", run: edited("charge:bad-method", func(r *http.Request) { r.Method = "PO\u017fT" }), want: idem.ErrInvalidHeader},
		{
			name: "100 MB body without GetBody: refused",
			run: func(t *testing.T, s *stack) (resp *http.Response, err error) {
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/uploads", io.NopCloser(patternReader(hugeBody, "")))
				if n := allocated(func() { resp, err = s.tr.RoundTrip(req) }); n > heapBound {
					t.Errorf("the call allocated %d MB; want less than %d MB", n>>20, heapBound>>20)
				}
				return resp, err
			},
			want: idem.ErrBodyNotRewindable,
		},
		{
			name: "100 MB body with GetBody: streamed and fingerprinted whole",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				base := &countingBase{}
				tr := &idem.Transport{Base: base, Jar: s.jar, Policy: retry.Policy{MaxAttempts: 1}, MaxBuffer: maxBuffer}
				ctx := idem.WithOperation(context.Background(), "upload:big")
				newReq := func(tail string) *http.Request {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/uploads", patternReader(hugeBody, tail))
					req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(patternReader(hugeBody, tail)), nil }
					req.ContentLength = hugeBody
					return req
				}
				var resp *http.Response
				var err error
				if n := allocated(func() { resp, err = tr.RoundTrip(newReq("end")) }); n > heapBound {
					t.Errorf("the call allocated %d MB; want less than %d MB", n>>20, heapBound>>20)
				}
				if base.bytes.Load() != hugeBody || base.attempts.Load() != 1 {
					t.Errorf("sent %d bytes in %d attempts; want %d in 1", base.bytes.Load(), base.attempts.Load(), hugeBody)
				}
				// The fingerprint covers the bytes past MaxBuffer: the same
				// operation with another last byte is refused unsent.
				_, merr := tr.RoundTrip(newReq("enD"))
				var me *idem.MismatchError
				if !errors.As(merr, &me) || base.attempts.Load() != 1 {
					t.Errorf("the same operation with its last byte changed: %v, %d attempts; want a *MismatchError, nothing sent", merr, base.attempts.Load())
				}
				return resp, err
			},
			status: http.StatusCreated, addsOps: []string{"upload:big"},
			check: func(t *testing.T, s *stack, _ *http.Response, _ error) {
				r, err := s.jar.Get(context.Background(), "upload:big")
				if err != nil || r.BodySize != hugeBody || r.Body != nil || r.State != idem.StateDone {
					t.Errorf("jar record %v, body %d of %d bytes, %s; want the size, no body stored, done", err, len(r.Body), r.BodySize, r.State)
				}
			},
		},
		{
			name: "GetBody fails",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader("{}"))
				req.GetBody = func() (io.ReadCloser, error) { return nil, errGetBody }
				return s.tr.RoundTrip(req)
			},
			want: errGetBody,
		},
		{
			// net/http's own redirects take a nil body from GetBody as none;
			// a request whose body has a length has one to send.
			name: "GetBody gives a nil body",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader("{}"))
				req.GetBody = func() (io.ReadCloser, error) { return nil, nil }
				return s.tr.RoundTrip(req)
			},
			want: idem.ErrRequestBody,
		},
		{
			name: "body read fails",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", io.NopCloser(io.MultiReader(strings.NewReader("{"), iotest.ErrReader(errRead))))
				return s.tr.RoundTrip(req)
			},
			want: errRead,
		},
		{
			name: "nil jar",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				tr := &idem.Transport{Base: s.srv.Client().Transport}
				req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader("{}"))
				return tr.RoundTrip(req)
			},
			want: idem.ErrNilJar,
		},
		{
			name: "jar path in a read-only directory",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				return nil, openInReadOnlyDir(t)
			},
			want: fs.ErrPermission,
		},
		{
			// Opening an existing jar only reads; a new one's schema needs
			// the write lock.
			name: "new jar file locked by another process: Open",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				path := filepath.Join(t.TempDir(), "new.db")
				defer lockByAnotherProcess(t, path)()
				j, err := keyjar.Open(context.Background(), path, &keyjar.Options{BusyTimeout: 50 * time.Millisecond})
				if err == nil {
					j.Close()
				}
				return nil, err
			},
			want: keyjar.ErrLocked,
		},
		{
			name: "jar file locked by another process: RoundTrip",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				defer lockByAnotherProcess(t, s.jarPath)()
				return s.send(t, "charge:order-2", "/v1/charges", `{"amount":200}`, nil)
			},
			want: keyjar.ErrLocked,
			check: func(t *testing.T, _ *stack, _ *http.Response, err error) {
				var je *idem.JarError
				if !errors.As(err, &je) || je.Op != "charge:order-2" {
					t.Errorf("got %v; want a *idem.JarError for the operation", err)
				}
			},
		},
		{
			// SQLite writes on to the file it opened, where no restart
			// finds the key: fail closed.
			name: "jar file removed while open: RoundTrip",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				path := filepath.Join(t.TempDir(), "keys.db")
				j, err := keyjar.Open(context.Background(), path, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer j.Close()
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				tr := &idem.Transport{Base: s.srv.Client().Transport, Jar: j}
				req, _ := http.NewRequestWithContext(idem.WithOperation(context.Background(), "charge:order-2"), http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader("{}"))
				return tr.RoundTrip(req)
			},
			want: keyjar.ErrMoved,
			check: func(t *testing.T, _ *stack, _ *http.Response, err error) {
				var je *idem.JarError
				if !errors.As(err, &je) || je.Op != "charge:order-2" {
					t.Errorf("got %v; want a *idem.JarError for the operation", err)
				}
			},
		},
		{
			name: "corrupt jar",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				b, err := os.ReadFile(s.jarPath)
				if err != nil {
					t.Fatal(err)
				}
				copy(b[16:100], bytes.Repeat([]byte{0xff}, 84)) // page size, format versions, counters
				path := filepath.Join(t.TempDir(), "corrupt.db")
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
				j, err := keyjar.Open(context.Background(), path, nil)
				if err == nil {
					j.Close()
				}
				if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(after, b) {
					t.Errorf("Open changed the corrupt file (%v)", rerr)
				}
				return nil, err
			},
			want: keyjar.ErrCorrupt,
		},
		{
			name: "server's store unreachable",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				s.down.Store(true)
				defer s.down.Store(false)
				return s.send(t, "charge:order-3", "/v1/charges", `{"amount":300}`, nil)
			},
			status: http.StatusServiceUnavailable, problem: testserver.ProblemStoreUnavailable, addsOps: []string{"charge:order-3"},
			check: func(t *testing.T, s *stack, resp *http.Response, _ error) {
				if resp.Header.Get("Retry-After") == "" {
					t.Error("503 without Retry-After")
				}
				// Nothing lost: the operation stays pending, and its retry
				// with the same key runs the handler once.
				r, err := s.jar.Get(context.Background(), "charge:order-3")
				if err != nil || r.State != idem.StatePending {
					t.Fatalf("jar record %+v, %v; want it pending", r, err)
				}
				resp, err = s.send(t, "charge:order-3", "/v1/charges", `{"amount":300}`, nil)
				if err != nil || resp.StatusCode != http.StatusCreated {
					t.Fatalf("retry after the store came back: %v, %v; want 201", resp, err)
				}
			},
			addsKeys: 1, runs: 1,
		},
		{
			name: "response larger than the save cap",
			run: func(t *testing.T, s *stack) (*http.Response, error) {
				return s.send(t, "report:q3", "/v1/reports", `{"quarter":3}`, nil)
			},
			status: http.StatusCreated, addsOps: []string{"report:q3"}, addsKeys: 1, runs: 1,
			check: func(t *testing.T, s *stack, resp *http.Response, _ error) {
				if b, _ := io.ReadAll(resp.Body); len(b) <= 16*saveCap {
					t.Errorf("first caller got %d bytes; want the whole answer", len(b))
				}
				var n int
				if err := s.store.DB().QueryRow(`SELECT max(length(response_body)) FROM idempotency_keys`).Scan(&n); err != nil || n > saveCap {
					t.Errorf("largest saved body %d bytes (%v); want at most the cap, %d", n, err, saveCap)
				}
				// The retry is told, and the report is not made again (runs: 1).
				again, err := s.send(t, "report:q3", "/v1/reports", `{"quarter":3}`, nil)
				if err != nil || problemType(t, again) != testserver.ProblemResponseTooLarge {
					t.Errorf("retry: %v, %v; want the response-too-large marker", again, err)
				}
			},
		},
	}
	s := newStack(t)
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before, runsBefore, reqsBefore := s.contents(t), s.runs.Load(), s.requests.Load()
			resp, err := row.run(t, s)
			switch {
			case row.want != nil:
				if !errors.Is(err, row.want) || resp != nil {
					t.Fatalf("got %v, %v; want no response and an error matching %v", resp, err, row.want)
				}
			case err != nil || resp == nil:
				t.Fatalf("got %v, %v; want a %d answer", resp, err, row.status)
			case resp.StatusCode != row.status:
				t.Fatalf("status %d; want %d", resp.StatusCode, row.status)
			case row.problem != "":
				if got := problemType(t, resp); got != row.problem {
					t.Fatalf("problem %q; want %q", got, row.problem)
				}
			}
			if row.want != nil && s.requests.Load() != reqsBefore {
				t.Errorf("%d requests reached the server; want none", s.requests.Load()-reqsBefore)
			}
			if row.check != nil {
				row.check(t, s, resp, err)
			}
			after := s.contents(t)
			for _, op := range row.addsOps {
				if _, ok := after.jar[op]; !ok {
					t.Errorf("jar lacks %q", op)
				}
				delete(after.jar, op)
			}
			if !reflect.DeepEqual(after.jar, before.jar) {
				t.Errorf("jar changed:\n got %v\nwant %v", after.jar, before.jar)
			}
			if len(after.store) != len(before.store)+row.addsKeys {
				t.Errorf("store holds %d keys; want %d", len(after.store), len(before.store)+row.addsKeys)
			}
			for k, v := range before.store {
				if after.store[k] != v {
					t.Errorf("store entry %s changed: %q; was %q", k, after.store[k], v)
				}
			}
			if got := s.runs.Load() - runsBefore; got != row.runs {
				t.Errorf("handler ran %d times; want %d", got, row.runs)
			}
		})
	}
}

// openInReadOnlyDir opens a new jar and an existing one in a directory the
// process may not write, and returns the second error, after checking that
// both wrap fs.ErrPermission and that the existing jar was not changed.
// Permissions do not stop root: as root, the Opens run in a helper process
// as the user nobody, which reports whether its error wraps
// fs.ErrPermission.
func openInReadOnlyDir(t *testing.T) error {
	ctx := context.Background()
	top := t.TempDir()
	dir := filepath.Join(top, "ro")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(dir, "keys.db")
	j, err := keyjar.Open(ctx, existing, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, idem.Record{Op: "op", Key: "k", State: idem.StatePending, Created: time.Now(), Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(existing)
	if err != nil {
		t.Fatal(err)
	}
	open := func(path string) error {
		j, err := keyjar.Open(ctx, path, nil)
		if err == nil {
			j.Close()
		}
		return err
	}
	if os.Geteuid() == 0 {
		open = openAsNobody(t, top, existing)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o755)
	if err := open(filepath.Join(dir, "new.db")); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Open of a new jar in a read-only directory: %v; want fs.ErrPermission", err)
	}
	err = open(existing)
	if after, rerr := os.ReadFile(existing); rerr != nil || !bytes.Equal(after, before) {
		t.Errorf("the refused Open changed the existing jar (%v)", rerr)
	}
	if _, serr := os.Stat(filepath.Join(dir, "new.db")); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a refused Open left new.db behind: %v", serr)
	}
	return err
}

// openAsNobody copies the test binary where the user nobody can run it,
// gives nobody the jar, and returns an open function that runs keyjar.Open
// in a helper process as nobody. Its error wraps fs.ErrPermission when the
// helper said its error did.
func openAsNobody(t *testing.T, top, jar string) func(path string) error {
	bin := nobody.Binary(t, top, "idem.test")
	if err := os.Chown(jar, nobody.ID, nobody.ID); err != nil {
		t.Fatal(err)
	}
	return func(path string) error {
		line, stop := startHelper(t, bin, "open", path, nobody.Attr().Credential)
		stop()
		if strings.HasPrefix(line, "permission:") {
			return fmt.Errorf("as nobody: %s: %w", line, fs.ErrPermission)
		}
		return fmt.Errorf("as nobody: %s", line)
	}
}

// problemType returns the type of an application/problem+json answer, or
// "" for any other.
func problemType(t *testing.T, resp *http.Response) string {
	t.Helper()
	if resp.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var p testserver.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("problem %q: %v", b, err)
	}
	return p.Type
}
