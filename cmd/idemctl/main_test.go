package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

const secret = "Bearer sk_test_idemctl_SECRET"

// asIdemctl, set in its environment, makes the test binary idemctl: it
// runs the command line it was given, as main does, signals included
// (TestReadWithoutWriteAccess, TestResumeAllStoppedBySignal).
const asIdemctl = "IDEMCTL_TEST_AS_IDEMCTL"

func TestMain(m *testing.M) {
	if os.Getenv(asIdemctl) != "" {
		main()
	}
	pgtest.Main(m)
}

// server is a payments stand-in behind the idempotency middleware that
// records the credential and key of each request.
type server struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
	keys  []string
}

func newServer(t *testing.T) *server {
	s := &server{}
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.keys = append(s.keys, r.Header.Get(idem.KeyHeader))
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// seed creates a jar file holding the operations fill makes and returns
// its path.
func seed(t *testing.T, srv *server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.db")
	seedFile(t, srv, path)
	return path
}

// seedFile creates the jar file at path holding the operations fill makes.
func seedFile(t *testing.T, srv *server, path string) {
	t.Helper()
	j, err := keyjar.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, srv, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

// seedPostgres creates a jar in a fresh PostgreSQL database holding the
// operations fill makes and returns the database's URL.
// jarWith returns the path of a new SQLite jar holding recs, each written
// by Begin, as a program writes it.
func jarWith(t *testing.T, recs ...idem.Record) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, _, err := j.Begin(context.Background(), r); err != nil {
			j.Close()
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func seedPostgres(t *testing.T, srv *server) string {
	t.Helper()
	dsn := pgtest.DB(t)
	j, err := pgjar.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, srv, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// jarKinds are the jars idemctl opens, each with its seed.
var jarKinds = []struct {
	name string
	seed func(*testing.T, *server) string
}{
	{"file", seed},
	{"postgres", seedPostgres},
}

// eachJar runs f on a seeded jar of each kind, named as --jar takes it.
func eachJar(t *testing.T, f func(t *testing.T, srv *server, jar string)) {
	for _, k := range jarKinds {
		t.Run(k.name, func(t *testing.T) {
			srv := newServer(t)
			f(t, srv, k.seed(t, srv))
		})
	}
}

// fill puts in j two pending operations (charge:p1 and charge:p2, sent
// once to srv while it was unreachable, with the secret credentials, which
// Options.Header added: the jar knows nothing of them) and one operation in
// each other state, last updated two days ago.
func fill(t *testing.T, srv *server, j client.Jar) {
	t.Helper()
	ctx := context.Background()
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(ctx, "", &client.Options{Jar: j, Base: refused, Policy: retry.Policy{MaxAttempts: 1},
		Header: func(r *http.Request) error {
			r.Header.Set("Authorization", secret)
			r.Header.Set("X-Api-Key", secret)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"charge:p1", "charge:p2"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"order_id":"`+op+`","amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		if _, err := c.Do(ctx, op, req); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("seeding %s: %v; want pending", op, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	for _, st := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateReconcile, idem.StateAbandoned} {
		r := idem.Record{Op: "charge:" + string(st), Key: "key-" + string(st), Fingerprint: "fp", State: st,
			Method: "POST", URL: srv.URL + "/v1/charges", Created: old, Updated: old, Attempts: 1, LastStatus: 201}
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// idemctl runs the command and returns its exit status, stdout and stderr.
func idemctl(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// wantError checks a failure: the exit status and one line on stderr that
// says want, and no stack trace.
func wantError(t *testing.T, code int, stderr string, wantCode int, want string) {
	t.Helper()
	if code != wantCode || !strings.Contains(stderr, want) || strings.Count(stderr, "\n") != 1 ||
		strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
		t.Fatalf("exit %d, stderr %q; want exit %d and one line saying %q", code, stderr, wantCode, want)
	}
}

// jarState returns op's record in the jar that spec names.
func jarState(t *testing.T, spec, op string) (idem.Record, error) {
	t.Helper()
	j, closeJar, err := openJar(context.Background(), spec, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closeJar()
	return j.Get(context.Background(), op)
}

func TestList(t *testing.T) { eachJar(t, testList) }

func testList(t *testing.T, _ *server, path string) {
	code, out, errOut := idemctl("--jar", path, "list")
	if code != 0 || errOut != "" {
		t.Fatalf("list: exit %d, %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "OP") {
		t.Fatalf("list printed %d lines; want a header and 6 operations:\n%s", len(lines), out)
	}
	// Created is when the key was stored, before the first send, which a
	// kill may have prevented; Attempts counts each before its send.
	// KEY STORED read as a column of keys.
	if !strings.Contains(lines[0], " STORED ") || strings.Contains(lines[0], "KEY") || strings.Contains(lines[0], "SENT") {
		t.Fatalf("header %q; want the record's time named STORED, nothing named key or sent", lines[0])
	}
	// Oldest first: the four seeded two days ago, then the two pending ones.
	if !strings.HasPrefix(lines[5], "charge:p1") || !strings.Contains(lines[5], "pending") || !strings.Contains(lines[5], "connection refused") {
		t.Fatalf("line %q; want charge:p1, pending, with its last error", lines[5])
	}

	code, out, _ = idemctl("list", "--status", "pending", "--jar", path)
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, "charge:p2") || strings.Contains(out, "charge:done") {
		t.Fatalf("list --status pending: exit %d:\n%s\nwant the header and the 2 pending operations", code, out)
	}
	// None in a state: "no operations" read as an empty jar.
	if code, _, errOut := idemctl("--jar", path, "forget", "charge:abandoned"); code != 0 {
		t.Fatalf("forget charge:abandoned: exit %d, %s", code, errOut)
	}
	code, out, errOut = idemctl("--jar", path, "list", "--status", "abandoned")
	if code != 0 || errOut != "" || out != "no abandoned operations\n" {
		t.Fatalf("list --status abandoned with none: exit %d, stdout %q, stderr %q; want \"no abandoned operations\"", code, out, errOut)
	}
	code, _, errOut = idemctl("--jar", path, "list", "--status", "bogus")
	wantError(t, code, errOut, 2, `unknown --status "bogus"`)
}

// TestLastAnswerThenError: an operation whose last answer was a 503 and
// whose later attempt got none (a refused connection) is listed and shown
// as "503 Service Unavailable, then" the error. Before, it read "503:
// dial tcp …", as if the 503 had come with that error.
func TestLastAnswerThenError(t *testing.T) {
	r := idem.Record{Op: "charge:1", Key: "k1", Method: "POST", URL: "http://127.0.0.1:1/v1/charges",
		Created: time.Now(), Attempts: 3, LastStatus: 503, LastError: "dial tcp 127.0.0.1:1: connect: connection refused"}
	path := jarWith(t, r)
	const want = "503 Service Unavailable, then dial tcp 127.0.0.1:1: connect: connection refused"
	code, out, errOut := idemctl("--jar", path, "show", "charge:1")
	if code != 0 || !strings.Contains(out, "last:         "+want+"\n") {
		t.Errorf("show: exit %d, %s\n%s\nwant last: %s", code, errOut, out, want)
	}
	code, out, errOut = idemctl("--jar", path, "list")
	if code != 0 || !strings.Contains(out, "503 Service Unavailable, then dial tcp") {
		t.Errorf("list: exit %d, %s\n%s\nwant %q", code, errOut, out, want[:38])
	}
}

func TestShow(t *testing.T) { eachJar(t, testShow) }

func testShow(t *testing.T, srv *server, path string) {
	rec, _ := jarState(t, path, "charge:p1")
	code, out, errOut := idemctl("--jar", path, "show", "charge:p1")
	if code != 0 || errOut != "" {
		t.Fatalf("show: exit %d, %s", code, errOut)
	}
	if strings.Contains(out, "sent:") {
		t.Fatalf("show names a field sent; Created is when the key was stored:\n%s", out)
	}
	for _, want := range []string{"key:", rec.Key, "key stored:", "state:", "pending", "POST " + srv.URL + "/v1/charges",
		"Content-Type: application/json", `{"order_id":"charge:p1","amount":100}`, "connection refused", "lease:", "free",
		// fill's program added credentials with client.Options.Header.
		"header:", "credentials its program added to each attempt, as client.Options.Header does (not stored)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, secret) || strings.Contains(out, "X-Api-Key") {
		t.Fatalf("show printed a credential:\n%s", out)
	}
	code, byKey, errOut := idemctl("--jar", path, "show", rec.Key)
	if code != 0 || errOut != "" || byKey != out {
		t.Fatalf("show by key %s: exit %d, %s\n%s\nwant the same as by name:\n%s", rec.Key, code, errOut, byKey, out)
	}
	code, _, errOut = idemctl("--jar", path, "show", "charge:nope")
	wantError(t, code, errOut, 1, `no operation named "charge:nope" and none with that key`)
	code, _, errOut = idemctl("--jar", path, "show")
	wantError(t, code, errOut, 2, "exactly one operation")
}

func TestResume(t *testing.T) { eachJar(t, testResume) }

func testResume(t *testing.T, srv *server, path string) {
	rec, _ := jarState(t, path, "charge:p1")

	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created, key "+rec.Key) || errOut != "" {
		t.Fatalf("resume: exit %d, %q, %q; want 201 with the stored key", code, out, errOut)
	}
	if len(srv.keys) != 1 || srv.keys[0] != rec.Key || srv.auths[0] != secret {
		t.Fatalf("server got keys %q with Authorization %q; want the stored key with the --header credential", srv.keys, srv.auths)
	}
	if r, _ := jarState(t, path, "charge:p1"); r.State != idem.StateDone {
		t.Fatalf("after resume: %s; want done", r.State)
	}

	// The credential from the environment; --all resumes what is left,
	// with its own key whatever the headers say.
	p2, _ := jarState(t, path, "charge:p2")
	t.Setenv("IDEM_HEADER", "Authorization: "+secret+"\nX-Trace: 1\nIdempotency-Key: not-the-operations\n")
	code, out, errOut = idemctl("--jar", path, "resume", "--all", "--host", srv.URL)
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "charge:p2: 201 Created") || srv.auths[1] != secret {
		t.Fatalf("resume --all: exit %d, %q, %q, auth %q; want charge:p2 sent with the credential", code, out, errOut, srv.auths)
	}
	if srv.keys[1] != p2.Key {
		t.Fatalf("resume --all sent charge:p2 with key %q; want its stored key %q", srv.keys[1], p2.Key)
	}
	code, out, _ = idemctl("--jar", path, "resume", "--all", "--host", srv.URL)
	if code != 0 || out != "nothing pending\n" {
		t.Fatalf("resume --all with nothing pending: exit %d, %q", code, out)
	}

	code, _, errOut = idemctl("--jar", path, "resume", "charge:done", "--host", srv.URL)
	wantError(t, code, errOut, 1, "charge:done")
	for _, args := range [][]string{{"resume"}, {"resume", "charge:p1", "--all"}, {"resume", "a", "b"}, {"resume", "a", "--header", "no colon"}} {
		code, _, errOut = idemctl(append([]string{"--jar", path}, args...)...)
		wantError(t, code, errOut, 2, "")
	}
	t.Setenv("IDEM_HEADER", "garbage")
	code, _, errOut = idemctl("--jar", path, "resume", "--all")
	wantError(t, code, errOut, 2, "IDEM_HEADER")
	// A credential written without its colon is refused without being
	// shown: the error line goes to terminals and logs.
	code, _, errOut = idemctl("--jar", path, "resume", "a", "--header", "Authorization "+secret)
	wantError(t, code, errOut, 2, "--header")
	if strings.Contains(errOut, "sk_test") {
		t.Errorf("--header error shows the credential: %q", errOut)
	}
	t.Setenv("IDEM_HEADER", "X-Trace: 1\nAuthorization "+secret)
	code, _, errOut = idemctl("--jar", path, "resume", "--all")
	wantError(t, code, errOut, 2, "IDEM_HEADER")
	if strings.Contains(errOut, "sk_test") {
		t.Errorf("IDEM_HEADER error shows the credential: %q", errOut)
	}
	if len(srv.keys) != 2 {
		t.Fatalf("server got %d requests; want 2", len(srv.keys))
	}
}

// TestResumeOfAHeaderThatCannotBeSent: a header whose name is not a token
// (a space around it too, as in "Authorization : v") or whose value holds
// a control character, which net/http refuses to send, is a usage error,
// as one without its colon: the credential not
// shown, nothing sent, and the operation's attempts and last outcome in
// the jar as they were, not an attempt that never left.
func TestResumeOfAHeaderThatCannotBeSent(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	before, _ := jarState(t, path, "charge:p1")
	for _, line := range []string{"Authorization(1): " + secret, "Authorization: " + secret + "\x01", "Authorization: " + secret + "\rX: y", "X-Trace\x7f: 1",
		"Authorization : " + secret, " Authorization: " + secret, "Authorization\t: " + secret} {
		code, _, errOut := idemctl("--jar", path, "resume", "charge:p1", "--header", line)
		wantError(t, code, errOut, 2, "--header")
		t.Setenv("IDEM_HEADER", line)
		code, _, errOut2 := idemctl("--jar", path, "resume", "--all")
		wantError(t, code, errOut2, 2, "IDEM_HEADER")
		t.Setenv("IDEM_HEADER", "")
		if strings.Contains(errOut+errOut2, "sk_test") {
			t.Errorf("the errors show the credential: %q, %q", errOut, errOut2)
		}
	}
	if len(srv.keys) != 0 {
		t.Fatalf("server got %d requests; want none", len(srv.keys))
	}
	after, _ := jarState(t, path, "charge:p1")
	if after.Attempts != before.Attempts || after.LastError != before.LastError {
		t.Errorf("after the refused resumes, charge:p1 has %d attempts, last error %q; want %d and %q, as before",
			after.Attempts, after.LastError, before.Attempts, before.LastError)
	}
}

// TestIdemHeaderBlankLine: an IDEM_HEADER line is blank, and skipped,
// only when nothing is left of it once the spaces, tabs, CRs and LFs
// around it are taken off, as net/textproto trims a line; a line of a
// no-break space, a NEL or another space of Unicode's is refused as
// --header refuses it, a usage error that sends nothing.
func TestIdemHeaderBlankLine(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	for _, line := range []string{"\u00a0", "\u0085", "\v", "\f", "\u2003", "\u3000", " \u00a0\t"} {
		code, _, errOut := idemctl("--jar", path, "resume", "charge:p1", "--header", line)
		wantError(t, code, errOut, 2, "--header")
		t.Setenv("IDEM_HEADER", "Authorization: "+secret+"\n"+line+"\n")
		code, _, errOut = idemctl("--jar", path, "resume", "--all")
		wantError(t, code, errOut, 2, "IDEM_HEADER: line 2")
	}
	if len(srv.keys) != 0 {
		t.Fatalf("server got %d requests; want none", len(srv.keys))
	}
	// Lines of spaces, tabs and CRs (a file with CRLF line ends) are blank.
	t.Setenv("IDEM_HEADER", "\r\nAuthorization: "+secret+"\r\n \t\r\n\n")
	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--host", srv.URL)
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created") || len(srv.auths) != 1 || srv.auths[0] != secret {
		t.Fatalf("resume with blank IDEM_HEADER lines: exit %d, %q, %q, auth %q; want it sent with the credential", code, out, errOut, srv.auths)
	}
}

// TestResumeWithoutCredentials: a pending operation whose record keeps no
// credential is not sent without one given (--header, IDEM_HEADER), nor
// with headers that hold none, unless --without-credentials; a done
// operation, which nothing would send, gets no word of credentials.
func TestResumeWithoutCredentials(t *testing.T) { eachJar(t, testResumeWithoutCredentials) }

func testResumeWithoutCredentials(t *testing.T, srv *server, path string) {
	const refusal = "nothing sent: "
	code, _, errOut := idemctl("--jar", path, "resume", "charge:done")
	if code != 1 || strings.Contains(errOut, "keeps none") {
		t.Fatalf("resume of a done operation: exit %d, %q; want 1 and no word of credentials: nothing would be sent", code, errOut)
	}
	// The jar records no credential of charge:p1's first send: a program
	// may have added one that left no name (client.Options.Header).
	// A header that is not a credential (a trace id) sends none either.
	for _, args := range [][]string{{"resume", "charge:p1"}, {"resume", "--all"}, {"resume", "charge:p1", "--header", "X-Request-Source: recovery", "--host", srv.URL}} {
		want := "no header given"
		if len(args) > 2 {
			want = "the headers given (--header, IDEM_HEADER) hold no credential"
		}
		code, out, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		if code != 1 || out != "" || !strings.HasPrefix(errOut, "idemctl: charge:p1: "+refusal+want) ||
			strings.Count(errOut, "client.Options.Header") != 1 || strings.Count(errOut, "--without-credentials") != 1 {
			t.Fatalf("%s without a header: exit %d, %q, %q; want 1 and a line for each pending operation saying nothing was sent, the first saying why and how to send it", args, code, out, errOut)
		}
		if n := strings.Count(errOut, ": "+refusal); n != strings.Count(errOut, "\n") || (args[1] == "--all") != (n > 1) {
			t.Fatalf("%s without a header: stderr %q; want a line for each pending operation", args, errOut)
		}
	}
	if len(srv.keys) != 0 {
		t.Fatalf("server got %d requests; want none", len(srv.keys))
	}
	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--without-credentials")
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created") || errOut != "" {
		t.Fatalf("resume --without-credentials: exit %d, %q, %q; want it sent", code, out, errOut)
	}
	if len(srv.auths) != 1 || srv.auths[0] != "" {
		t.Fatalf("server got Authorization %q; want none", srv.auths)
	}
}

// pendingInMemory returns a memory jar holding charge:p1, a POST of a JSON
// body to url left pending by a first send whose connection was refused.
func pendingInMemory(t *testing.T, url string) *idem.MemoryJar {
	t.Helper()
	ctx := context.Background()
	jar := &idem.MemoryJar{}
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(ctx, "", &client.Options{Jar: jar, Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PostJSON(ctx, "charge:p1", url, map[string]int{"amount": 100}, nil); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("seeding charge:p1: %v; want pending", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return jar
}

// TestResumeOfAnOperationFinishedMeanwhile: resume waits for the lease of
// another process still sending the operation, which finishes it
// meanwhile. Nothing is sent (without --header, the server would take it
// for a new request and run it again): a line says that resume waits.
// Done with a 2xx answer, the operation is what resume would have made
// it: resume prints that answer and succeeds, as a cron job that resumes
// what a crashed run left needs. Failed, resume says so and fails.
func TestResumeOfAnOperationFinishedMeanwhile(t *testing.T) {
	srv := newServer(t)
	for _, c := range []struct {
		name   string
		change idem.Change // what the other process records
		stdout string      // want, %s the key; "" for a failure naming the state
	}{
		{"done", idem.Change{State: idem.StateDone, LastStatus: 201},
			"charge:p1: 201 Created, key %s, by another process meanwhile; nothing was sent\n"},
		{"failed", idem.Change{State: idem.StateFailed, LastStatus: 422}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				jar := pendingInMemory(t, srv.URL+"/v1/charges")
				// Another process sends it, and gets its answer two seconds later.
				rec, err := jar.Acquire(ctx, "charge:p1", "other", time.Now(), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					time.Sleep(2 * time.Second)
					ch := c.change
					ch.Now, ch.Release = time.Now(), true
					if _, err := jar.Update(ctx, "charge:p1", "other", ch); err != nil {
						t.Error(err)
					}
				}()

				var stdout, stderr bytes.Buffer
				s := &session{jar: jar, path: "keys.db", lockTimeout: time.Second, stdout: &stdout, stderr: &stderr}
				set := flag.NewFlagSet("resume", flag.ContinueOnError)
				resumeFlags(set)
				if err := set.Parse([]string{"--without-credentials"}); err != nil {
					t.Fatal(err)
				}
				err = resume(ctx, s, set, []string{"charge:p1"})
				t.Logf("stderr: %s", stderr.String())
				waiting, line, _ := strings.Cut(stderr.String(), "\n")
				if !strings.Contains(waiting, "waiting for it to be given back") {
					t.Errorf("stderr's first line %q; want it to say resume waits for the lease", waiting)
				}
				if c.stdout != "" {
					if want := fmt.Sprintf(c.stdout, rec.Key); err != nil || stdout.String() != want || line != "" {
						t.Fatalf("resume: %v, stdout %q, stderr %q; want success, stdout %q after the wait's line", err, stdout.String(), stderr.String(), want)
					}
					return
				}
				if !errors.Is(err, errFailed) || stdout.Len() != 0 || strings.Count(line, "\n") != 1 || !strings.HasPrefix(line, "idemctl: charge:p1: ") ||
					!strings.Contains(line, "is "+string(c.change.State)) || !strings.Contains(line, "nothing was sent") {
					t.Fatalf("resume: %v, stdout %q, stderr %q; want it failed, a line saying charge:p1 is %s and nothing was sent after the wait's",
						err, stdout.String(), stderr.String(), c.change.State)
				}
			})
		})
	}
	if len(srv.keys) != 0 {
		t.Fatalf("the server got %d requests; want none", len(srv.keys))
	}
}

// TestResumeSaysItWaits: resume of an operation that another process is
// still sending waits for that process's lease, up to a minute by
// default, and of one whose server asked for a later next attempt
// (Retry-After) waits for that time, up to 30 s; before it waits, a line
// says so and until when, rather than leave the shell silent. Then the
// operation is sent.
func TestResumeSaysItWaits(t *testing.T) {
	srv := newServer(t)
	for _, c := range []struct {
		name string
		set  func(jar *idem.MemoryJar, until time.Time) // how the operation is left to wait for until
		want string                                     // the line, before the time
	}{
		{
			name: "lease",
			set: func(jar *idem.MemoryJar, until time.Time) {
				if _, err := jar.Acquire(context.Background(), "charge:p1", "other", time.Now(), time.Until(until)); err != nil {
					t.Fatal(err)
				}
			},
			want: "idemctl: charge:p1: another process holds its lease, until %s: waiting for it to be given back (Ctrl-C to stop: it stays pending)\n",
		},
		{
			name: "next attempt",
			set: func(jar *idem.MemoryJar, until time.Time) {
				ctx := context.Background()
				if _, err := jar.Acquire(ctx, "charge:p1", "other", time.Now(), time.Minute); err != nil {
					t.Fatal(err)
				}
				if _, err := jar.Update(ctx, "charge:p1", "other", idem.Change{Now: time.Now(), LastStatus: 503, NextAttempt: until, Release: true}); err != nil {
					t.Fatal(err)
				}
			},
			want: "idemctl: charge:p1: the server asked for its next attempt at %s: waiting for it (Ctrl-C to stop: it stays pending)\n",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				jar := pendingInMemory(t, srv.URL+"/v1/charges")
				until := time.Now().Add(20 * time.Second)
				c.set(jar, until)
				var stdout, stderr bytes.Buffer
				s := &session{jar: jar, path: "keys.db", lockTimeout: time.Second, stdout: &stdout, stderr: &stderr}
				set := flag.NewFlagSet("resume", flag.ContinueOnError)
				resumeFlags(set)
				if err := set.Parse([]string{"--header", "Authorization: Bearer t"}); err != nil {
					t.Fatal(err)
				}
				if err := resume(context.Background(), s, set, []string{"charge:p1"}); err != nil {
					t.Fatalf("resume: %v; stderr %q", err, stderr.String())
				}
				if want := fmt.Sprintf(c.want, stamp(until)); stderr.String() != want {
					t.Errorf("stderr %q; want %q", stderr.String(), want)
				}
				if !strings.HasPrefix(stdout.String(), "charge:p1: 201 Created") || !time.Now().Equal(until) {
					t.Errorf("stdout %q at %v; want charge:p1 sent and created at %v", stdout.String(), time.Now(), until)
				}
			})
		})
	}
	if len(srv.keys) != 2 {
		t.Fatalf("the server got %d requests; want one for each case", len(srv.keys))
	}
}

// pendingInFile creates a jar file holding op, a request of method with a
// JSON body to url, left pending by a first send whose connection was
// refused, and returns its path. The client that sent it keys method (its
// Options.Methods); maxStoredBody is its Options.MaxStoredBody.
func pendingInFile(t *testing.T, method, op, url string, maxStoredBody int64) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(ctx, path, &client.Options{Base: refused, Methods: []string{method}, MaxStoredBody: maxStoredBody,
		Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if _, err := c.Do(ctx, op, req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("seeding %s: %v; want pending", op, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestResumeOfABodyNotStored: the jar did not store the body of a pending
// operation (larger than the program's MaxStoredBody). idemctl cannot send
// it and says so, with what the operator can do: not a Go method to call.
func TestResumeOfABodyNotStored(t *testing.T) {
	srv := newServer(t)
	path := pendingInFile(t, http.MethodPost, "upload:big", srv.URL+"/v1/uploads", -1)

	const want = "the program that sent it"
	code, out, _ := idemctl("--jar", path, "show", "upload:big")
	if code != 0 || !strings.Contains(out, "not stored") || !strings.Contains(out, want) {
		t.Fatalf("show: exit %d:\n%s\nwant the body not stored, and %q", code, out, want)
	}
	code, _, errOut := idemctl("--jar", path, "resume", "upload:big")
	wantError(t, code, errOut, 1, want)
	if strings.Contains(errOut, "ResumeWithBody") {
		t.Errorf("resume: %q; want no Go method named to an operator", errOut)
	}
	if len(srv.keys) != 0 {
		t.Fatalf("the server got %d requests; want none", len(srv.keys))
	}
	if r, _ := jarState(t, path, "upload:big"); r.State != idem.StatePending {
		t.Fatalf("after resume: %s; want it still pending", r.State)
	}
}

// TestResumeRefusedWith422: the API refuses a resumed charge with its own
// 422 (the order was charged under another key). The line says that the
// server refused the request with 422 and what the API said, not that the
// key was first sent with another request: it was not.
func TestResumeRefusedWith422(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		testserver.WriteProblem(w, testserver.Problem{Type: "about:blank", Title: "Order already charged", Status: http.StatusUnprocessableEntity}, 0)
	}))
	t.Cleanup(srv.Close)
	path := pendingInFile(t, http.MethodPost, "charge:o1", srv.URL+"/v1/charges", 0)
	code, _, errOut := idemctl("--jar", path, "resume", "charge:o1", "--header", "Authorization: "+secret, "--host", srv.URL)
	wantError(t, code, errOut, 1, "refused the request with 422")
	for _, want := range []string{"a request it will not process", "Order already charged"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("resume: %q; want it to say %q", errOut, want)
		}
	}
	if strings.Contains(errOut, "first sent with a different") {
		t.Errorf("resume: %q says the key was first sent with another request", errOut)
	}
	if r, _ := jarState(t, path, "charge:o1"); r.State != idem.StateFailed {
		t.Fatalf("after resume: %s; want failed", r.State)
	}
}

// TestResumeOfAnyMethod: a program whose Methods key PUT and DELETE left
// one of each pending. resume sends the PUT by name and the DELETE with
// --all, each with its stored key, and both end done. A GET is not keyed
// for that: the 303 that answers the PUT is followed by a GET without a
// key, as the program would have followed it.
func TestResumeOfAnyMethod(t *testing.T) {
	var (
		mu   sync.Mutex
		sent []string // method, path and key of each request
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent = append(sent, r.Method+" "+r.URL.Path+" "+r.Header.Get(idem.KeyHeader))
		mu.Unlock()
		switch r.Method {
		case http.MethodPut:
			http.Redirect(w, r, r.URL.Path, http.StatusSeeOther)
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(srv.Close)
	putJar := pendingInFile(t, http.MethodPut, "put:a", srv.URL+"/v1/things/a", 0)
	deleteJar := pendingInFile(t, http.MethodDelete, "delete:b", srv.URL+"/v1/things/b", 0)
	put, _ := jarState(t, putJar, "put:a")
	del, _ := jarState(t, deleteJar, "delete:b")

	code, out, errOut := idemctl("--jar", putJar, "resume", "put:a", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || out != "put:a: 200 OK, key "+put.Key+"\n" || errOut != "" {
		t.Fatalf("resume put:a: exit %d, %q, %q; want 200 OK (the redirect followed) with the stored key", code, out, errOut)
	}
	code, out, errOut = idemctl("--jar", deleteJar, "resume", "--all", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || out != "delete:b: 204 No Content, key "+del.Key+"\n" || errOut != "" {
		t.Fatalf("resume --all: exit %d, %q, %q; want delete:b sent with the stored key", code, out, errOut)
	}
	want := []string{"PUT /v1/things/a " + put.Key, "GET /v1/things/a ", "DELETE /v1/things/b " + del.Key}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sent, want) {
		t.Fatalf("the server got %q; want %q", sent, want)
	}
	for path, op := range map[string]string{putJar: "put:a", deleteJar: "delete:b"} {
		if r, err := jarState(t, path, op); err != nil || r.State != idem.StateDone {
			t.Errorf("after resume, %s is %s (%v); want done", op, r.State, err)
		}
	}
}

func TestAbandon(t *testing.T) { eachJar(t, testAbandon) }

func testAbandon(t *testing.T, _ *server, path string) {
	code, _, errOut := idemctl("--jar", path, "abandon", "charge:reconcile")
	wantError(t, code, errOut, 2, "--reason")
	code, out, errOut := idemctl("--jar", path, "abandon", "charge:reconcile", "--reason", "ledger shows no charge")
	if code != 0 || !strings.Contains(out, "abandoned") {
		t.Fatalf("abandon: exit %d, %q, %q", code, out, errOut)
	}
	if r, _ := jarState(t, path, "charge:reconcile"); r.State != idem.StateAbandoned || r.Note != "ledger shows no charge" {
		t.Fatalf("after abandon: %s %q; want abandoned with the reason", r.State, r.Note)
	}
	code, _, errOut = idemctl("--jar", path, "abandon", "charge:done", "--reason", "x")
	wantError(t, code, errOut, 1, "known")
	code, _, errOut = idemctl("--jar", path, "abandon", "charge:nope", "--reason", "x")
	wantError(t, code, errOut, 1, `no operation named "charge:nope" in `)
}

func TestForget(t *testing.T) { eachJar(t, testForget) }

func testForget(t *testing.T, _ *server, path string) {
	code, _, errOut := idemctl("--jar", path, "forget", "charge:p1")
	wantError(t, code, errOut, 1, "pending")
	if _, err := jarState(t, path, "charge:p1"); err != nil {
		t.Fatalf("a refused forget deleted the operation: %v", err)
	}
	code, out, _ := idemctl("--jar", path, "forget", "charge:done")
	if code != 0 || out != "charge:done: forgotten\n" {
		t.Fatalf("forget: exit %d, %q", code, out)
	}
	if _, err := jarState(t, path, "charge:done"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("after forget: %v; want not found", err)
	}
	code, _, errOut = idemctl("--jar", path, "forget", "charge:done")
	wantError(t, code, errOut, 1, `no operation named "charge:done" in `)
	code, _, errOut = idemctl("--jar", path, "resume", "charge:done")
	wantError(t, code, errOut, 1, `no operation named "charge:done" in `)
}

func TestPrune(t *testing.T) { eachJar(t, testPrune) }

func testPrune(t *testing.T, _ *server, path string) {
	// A day count that multiplies past what a Duration holds must not
	// wrap into a positive age.
	for _, bad := range []string{"", "soon", "-5h", "0s", "xd", "0d", "-1d", "-106752d", "-208449342806584d"} {
		code, _, errOut := idemctl("--jar", path, "prune", "--older-than", bad)
		wantError(t, code, errOut, 2, "--older-than")
	}
	code, out, _ := idemctl("--jar", path, "prune", "--older-than", "3d")
	if code != 0 || !strings.HasPrefix(out, "pruned 0 ") {
		t.Fatalf("prune 3d: exit %d, %q; want nothing pruned", code, out)
	}
	code, out, _ = idemctl("--jar", path, "prune", "--older-than", "24h")
	if code != 0 || !strings.HasPrefix(out, "pruned 3 ") {
		t.Fatalf("prune 24h: exit %d, %q; want done, failed and abandoned pruned", code, out)
	}
	_, out, _ = idemctl("--jar", path, "list")
	for _, op := range []string{"charge:p1", "charge:p2", "charge:reconcile"} {
		if !strings.Contains(out, op) {
			t.Fatalf("prune removed %s:\n%s", op, out)
		}
	}
}

func TestExportJSON(t *testing.T) { eachJar(t, testExportJSON) }

func testExportJSON(t *testing.T, _ *server, path string) {
	code, out, errOut := idemctl("--jar", path, "export", "--json")
	if code != 0 {
		t.Fatalf("export: exit %d, %s", code, errOut)
	}
	var recs []exported
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("export is not JSON: %v\n%s", err, out)
	}
	if len(recs) != 6 || recs[4].Op != "charge:p1" || recs[4].State != idem.StatePending || recs[4].Body == nil ||
		*recs[4].Body != `{"order_id":"charge:p1","amount":100}` || recs[4].Header.Get("Content-Type") != "application/json" {
		t.Fatalf("export: %+v; want 6 records, charge:p1 pending with its body and headers", recs)
	}
	if strings.Contains(out, secret) {
		t.Fatal("export printed a credential")
	}
	code, _, errOut = idemctl("--jar", path, "export", "--json=false")
	wantError(t, code, errOut, 2, "JSON only")
}

// lockJar holds a write transaction on the jar file through another
// connection, as another process writing to it would: BEGIN IMMEDIATE and
// a note on every operation, not committed. exclusive (locking_mode
// EXCLUSIVE) also shuts out readers.
func lockJar(t *testing.T, path string, exclusive bool) {
	t.Helper()
	params := "?_txlock=immediate"
	if exclusive {
		params = "?_txlock=exclusive&_pragma=locking_mode(EXCLUSIVE)"
	}
	db, err := sql.Open("sqlite", "file:"+path+params)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("UPDATE operations SET note = ?", uncommitted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(); db.Close() })
}

// TestLockTimeout: --lock-timeout, 2s when it is not given, is how long a
// jar file's statements wait for a lock (keyjar's BusyTimeout), and how
// long a PostgreSQL jar's statements may run (pgjar's QueryTimeout).
func TestLockTimeout(t *testing.T) {
	realKeyjar, realPgjar := openKeyjar, openPgjar
	t.Cleanup(func() { openKeyjar, openPgjar = realKeyjar, realPgjar })
	var got time.Duration
	stop := errors.New("not opened")
	openKeyjar = func(_ context.Context, _ string, opts *keyjar.Options) (*keyjar.Jar, error) {
		got = opts.BusyTimeout
		return nil, stop
	}
	openPgjar = func(_ context.Context, _ string, opts *pgjar.Options) (*pgjar.Jar, error) {
		got = opts.QueryTimeout
		return nil, stop
	}
	const pgURL = "postgres://ops@127.0.0.1:1/payments"
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"--jar", "keys.db", "list"}, 2 * time.Second},
		{[]string{"--jar", "keys.db", "--lock-timeout", "50ms", "list"}, 50 * time.Millisecond},
		{[]string{"--jar", pgURL, "list"}, 2 * time.Second},
		{[]string{"--jar", pgURL, "list", "--lock-timeout", "3s"}, 3 * time.Second},
		{[]string{"--jar", pgURL, "--lock-timeout", "596h31m23.647s", "list"}, math.MaxInt32 * time.Millisecond},
		{[]string{"--jar", "keys.db", "--lock-timeout", "600h", "list"}, 600 * time.Hour},
	} {
		got = 0
		code, _, errOut := idemctl(tt.args...)
		wantError(t, code, errOut, 1, "not opened")
		if got != tt.want {
			t.Errorf("idemctl %q opened the jar with a timeout of %v; want %v", tt.args, got, tt.want)
		}
	}
	// Above PostgreSQL's longest statement_timeout: a usage error naming
	// the flag, not pgjar's QueryTimeout, and nothing opened.
	got = 0
	code, _, errOut := idemctl("--jar", pgURL, "--lock-timeout", "596h31m23.648s", "list")
	wantError(t, code, errOut, 2, "--lock-timeout 596h31m23.648s is above 596h31m23.647s")
	if got != 0 || strings.Contains(errOut, "QueryTimeout") {
		t.Errorf("stderr %q, the jar opened with a timeout of %v; want no open, no QueryTimeout", errOut, got)
	}
}

// TestReadCommandsOpenReadOnly: list, show and export open a jar file for
// reading alone (keyjar.Options.ReadOnly), and the commands that write open
// it as before; each with MustExist.
func TestReadCommandsOpenReadOnly(t *testing.T) {
	real := openKeyjar
	t.Cleanup(func() { openKeyjar = real })
	var got *keyjar.Options
	stop := errors.New("not opened")
	openKeyjar = func(_ context.Context, _ string, opts *keyjar.Options) (*keyjar.Jar, error) {
		got = opts
		return nil, stop
	}
	for _, c := range []struct {
		args     []string
		readOnly bool
	}{
		{[]string{"list"}, true},
		{[]string{"show", "charge:p1"}, true},
		{[]string{"export"}, true},
		{[]string{"resume", "charge:p1"}, false},
		{[]string{"resume", "--all"}, false},
		{[]string{"abandon", "charge:p1", "--reason", "no charge"}, false},
		{[]string{"forget", "charge:p1"}, false},
		{[]string{"prune", "--older-than", "720h"}, false},
	} {
		got = nil
		code, _, errOut := idemctl(append([]string{"--jar", "keys.db"}, c.args...)...)
		wantError(t, code, errOut, 1, "not opened")
		if got == nil || got.ReadOnly != c.readOnly || !got.MustExist {
			t.Errorf("%s opened the jar with %+v; want ReadOnly %v and MustExist", c.args[0], got, c.readOnly)
		}
	}
}

// uncommitted is the note lockJar writes and never commits.
const uncommitted = "uncommitted note"

// TestJarRemovedBeforeItIsOpened: the jar file is removed just before
// idemctl opens it (by another operator, as after any check that it
// exists). idemctl says there is no such jar and creates none: an empty
// new jar would read as "no operations".
func TestJarRemovedBeforeItIsOpened(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	real := openKeyjar
	t.Cleanup(func() { openKeyjar = real })
	var openErr error
	openKeyjar = func(ctx context.Context, path string, opts *keyjar.Options) (*keyjar.Jar, error) {
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
		j, err := real(ctx, path, opts)
		openErr = err
		return j, err
	}
	code, out, errOut := idemctl("--jar", path, "list")
	t.Logf("exit %d, stdout %q, stderr %q", code, out, errOut)
	wantError(t, code, errOut, 1, path+": no such jar file")
	if !errors.Is(openErr, fs.ErrNotExist) {
		t.Errorf("the open: %v; want an error matching fs.ErrNotExist", openErr)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("idemctl created a jar file in place of the removed one: %v", err)
	}
}

func TestJarErrors(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt.db")
	if err := os.WriteFile(corrupt, bytes.Repeat([]byte("not a jar "), 500), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idemctl("--jar", filepath.Join(dir, "missing.db"), "list")
	wantError(t, code, errOut, 1, "no such jar file")
	if _, err := os.Stat(filepath.Join(dir, "missing.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("idemctl created the missing jar: %v", err)
	}
	code, _, errOut = idemctl("--jar", corrupt, "list")
	wantError(t, code, errOut, 1, "not a key jar or is corrupt: "+corrupt+" is not a SQLite database")
	// The server's database, given for the jar: the error says which it is.
	store, err := sqlitestore.Open(context.Background(), filepath.Join(dir, "idemserver.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = idemctl("--jar", filepath.Join(dir, "idemserver.db"), "list")
	wantError(t, code, errOut, 1, "not a key jar or is corrupt: the reference server's database")
	code, _, errOut = idemctl("--jar", dir, "show", "x")
	wantError(t, code, errOut, 1, "is a directory")
	// An empty file would become a new jar; idemctl never creates one.
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = idemctl("--jar", empty, "list")
	wantError(t, code, errOut, 1, "is empty")
	if fi, err := os.Stat(empty); err != nil || fi.Size() != 0 {
		t.Fatalf("idemctl changed the empty file: %v, %v", fi, err)
	}
	t.Setenv("IDEM_JAR", "")
	code, _, errOut = idemctl("list")
	wantError(t, code, errOut, 2, "--jar")
	code, _, errOut = idemctl("--jar", corrupt)
	wantError(t, code, errOut, 2, "no command")
	code, _, errOut = idemctl("--jar", corrupt, "frob")
	wantError(t, code, errOut, 2, "unknown command")
	for _, args := range [][]string{{"--lock-timeout", "5", "list"}, {"list", "--lock-timeout", "5"}} {
		code, _, errOut = idemctl(append([]string{"--jar", corrupt}, args...)...)
		wantError(t, code, errOut, 2, `invalid value "5" for flag -lock-timeout: missing unit in duration`)
	}
	code, out, _ := idemctl("help")
	if code != 0 || !strings.Contains(out, "usage: idemctl") {
		t.Fatalf("help: exit %d, %q", code, out)
	}
}

// TestUsageNamesHeaderEnv: the usage, the only help idemctl prints, names
// IDEM_HEADER beside --header, the way to give resume a credential that
// neither the process list nor a shell's history shows.
func TestUsageNamesHeaderEnv(t *testing.T) {
	code, out, _ := idemctl("help")
	if code != 0 || !strings.Contains(out, "$IDEM_HEADER") {
		t.Fatalf("help: exit %d, no $IDEM_HEADER in the usage:\n%s", code, out)
	}
}

// TestUsageErrorBeforeTheJar: a command line that a command cannot take is
// a usage error, exit status 2, whatever the jar's state: it is refused
// before the jar is opened, so that a jar that is missing (exit status 1)
// does not hide it, and nothing is opened.
func TestUsageErrorBeforeTheJar(t *testing.T) {
	real := openJarFn
	t.Cleanup(func() { openJarFn = real })
	opened := false
	openJarFn = func(ctx context.Context, spec string, lockTimeout time.Duration, readOnly bool) (client.Jar, func() error, error) {
		opened = true
		return real(ctx, spec, lockTimeout, readOnly)
	}
	missing := filepath.Join(t.TempDir(), "missing.db")
	for _, c := range []struct {
		args       []string
		idemHeader string
		want       string
	}{
		{[]string{"list", "extra"}, "", "list takes no arguments"},
		{[]string{"list", "--status", "bogus"}, "", `unknown --status "bogus"`},
		{[]string{"show"}, "", "show needs exactly one operation name"},
		{[]string{"show", "a", "b"}, "", "show needs exactly one operation name"},
		{[]string{"resume"}, "", "resume needs one operation name or --all"},
		{[]string{"resume", "a", "--all"}, "", "resume needs one operation name or --all"},
		{[]string{"resume", "a", "--attempt-timeout", "0s"}, "", "--attempt-timeout 0s"},
		{[]string{"resume", "a", "--header", "no colon"}, "", "--header"},
		{[]string{"resume", "--all"}, "garbage", "IDEM_HEADER: line 1"},
		{[]string{"abandon"}, "", "abandon needs exactly one operation name"},
		{[]string{"abandon", "a"}, "", "abandon needs --reason"},
		{[]string{"forget", "a", "b"}, "", "forget needs exactly one operation name"},
		{[]string{"prune"}, "", "prune needs --older-than"},
		{[]string{"prune", "--older-than", "soon"}, "", `--older-than "soon"`},
		{[]string{"prune", "extra", "--older-than", "1h"}, "", "prune takes no arguments"},
		{[]string{"export", "extra"}, "", "export takes no arguments"},
		{[]string{"export", "--json=false"}, "", "JSON only"},
	} {
		t.Setenv("IDEM_HEADER", c.idemHeader)
		opened = false
		code, _, errOut := idemctl(append([]string{"--jar", missing}, c.args...)...)
		wantError(t, code, errOut, 2, c.want)
		if opened {
			t.Errorf("%q: the jar was opened before the usage error", c.args)
		}
	}
}

// TestUsageErrorLine: a usage error is told on one line of stderr, the
// command's name before it and where to find the usage after it, made one
// line and escaped as every error is (a flag's name is the user's, as
// typed), and exits 2.
func TestUsageErrorLine(t *testing.T) {
	jar := filepath.Join(t.TempDir(), "missing.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--jar", jar, "frob"}, `idemctl: unknown command "frob" (idemctl help for usage)` + "\n"},
		{[]string{"--jar", jar, "list", "--a\x1b[2J\n\tb"}, `idemctl: flag provided but not defined: -a\x1b[2J b (idemctl help for usage)` + "\n"},
	} {
		code, out, errOut := idemctl(c.args...)
		if code != 2 || out != "" || errOut != c.want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and stderr %q", c.args, code, out, errOut, c.want)
		}
	}
}

func TestLockedJar(t *testing.T) {
	srv := newServer(t)
	t.Run("exclusive lock: nothing can be read", func(t *testing.T) {
		path := seed(t, srv)
		lockJar(t, path, true)
		code, _, errOut := idemctl("--jar", path, "--lock-timeout", "50ms", "list")
		wantError(t, code, errOut, 1, "is locked by another process")
	})
	t.Run("write lock held by another process", func(t *testing.T) {
		path := seed(t, srv)
		lockJar(t, path, false)
		// Reading needs no lock: list, show and export read what is
		// committed, at once.
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"list"}, "charge:p1"},
			{[]string{"show", "charge:p1"}, "pending"},
			{[]string{"export"}, `"op": "charge:p1"`},
		} {
			code, out, errOut := idemctl(append([]string{"--jar", path, "--lock-timeout", "50ms"}, c.args...)...)
			if code != 0 || errOut != "" || !strings.Contains(out, c.want) || strings.Contains(out, uncommitted) {
				t.Errorf("%s while another process writes: exit %d, stderr %q, stdout %q; want exit 0 and %q, without the uncommitted note",
					c.args[0], code, errOut, out, c.want)
			}
		}
		// Writing waits for the other writer, up to --lock-timeout.
		for _, args := range [][]string{{"abandon", "charge:p1", "--reason", "x"}, {"prune", "--older-than", "1h"}} {
			code, _, errOut := idemctl(append([]string{"--jar", path, "--lock-timeout", "50ms"}, args...)...)
			wantError(t, code, errOut, 1, "is locked by another process")
		}
		code, out, _ := idemctl("--jar", path, "--lock-timeout", "50ms", "list")
		if code != 0 || strings.Count(out, "\n") != 7 || !strings.Contains(out, "abandoned") {
			t.Errorf("list after the failed writes: exit %d, %q; want the six operations as they were", code, out)
		}
	})
}

func TestJarFromEnvironment(t *testing.T) { eachJar(t, testJarFromEnvironment) }

func testJarFromEnvironment(t *testing.T, _ *server, path string) {
	t.Setenv("IDEM_JAR", path)
	if code, out, errOut := idemctl("show", "charge:p2"); code != 0 || !strings.Contains(out, "charge:p2") {
		t.Fatalf("IDEM_JAR: exit %d, %q %q", code, out, errOut)
	}
}

// The built program: errors are one line and exit status 1, never a stack trace.
func TestBinary(t *testing.T) {
	bin := buildIdemctl(t)
	path := seed(t, newServer(t))
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "--jar", path, "list", "--status", "pending")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "charge:p1") {
		t.Fatalf("list: %v, %q, %q", err, stdout.String(), stderr.String())
	}
	corrupt := filepath.Join(t.TempDir(), "bad.db")
	os.WriteFile(corrupt, []byte("SQLite format 3\x00 but not really"), 0o600)
	for _, p := range []string{corrupt, filepath.Join(t.TempDir(), "missing.db")} {
		stderr.Reset()
		cmd = exec.Command(bin, "--jar", p, "list")
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v; want exit status 1", p, err)
		}
		wantError(t, ee.ExitCode(), stderr.String(), 1, "idemctl: "+p)
	}
}

// buildIdemctl builds idemctl in a temporary directory and returns the
// binary's path.
func buildIdemctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idemctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestResumeAttemptTimeout: the built idemctl resumes an operation on a
// server that reads the request and never answers. With --attempt-timeout
// 200ms it ends on its own, with exit status 1 and one line saying that
// the outcome is unknown. Every attempt carried the stored key, and was
// given up with its connection closed: the server's handlers all return.
// The operation is still pending under its key, and a later resume, once
// the server answers, sends that key and settles it.
func TestResumeAttemptTimeout(t *testing.T) {
	bin := buildIdemctl(t)
	var (
		mu     sync.Mutex
		keys   []string // the key of each request
		answer bool     // the server answers: 201
	)
	ended := make(chan struct{}, 16) // a handler that did not answer returned
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		answering := answer
		mu.Unlock()
		if answering {
			w.WriteHeader(http.StatusCreated)
			return
		}
		select {
		case <-r.Context().Done(): // the client closed the connection
		case <-stop:
		}
		select {
		case ended <- struct{}{}:
		default: // more requests than idemctl sends: the test fails on their count
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // before srv.Close, which waits for the handlers
	path := pendingInFile(t, http.MethodPost, "charge:o1", srv.URL+"/v1/charges", 0)
	before, _ := jarState(t, path, "charge:o1")

	// A bound on the test alone: idemctl is killed if it still runs then.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--jar", path, "resume", "charge:o1", "--attempt-timeout", "200ms", "--header", "Authorization: "+secret, "--host", srv.URL)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("resume --attempt-timeout 200ms still ran after a minute; stderr %q", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("resume: %v, stdout %q, stderr %q; want exit status 1", err, stdout.String(), stderr.String())
	}
	wantError(t, ee.ExitCode(), stderr.String(), 1, "outcome unknown")
	for _, want := range []string{"idemctl: charge:o1: ", before.Key, "timed out after 200ms"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q; want it to say %q", stderr.String(), want)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q; want nothing", stdout.String())
	}

	mu.Lock()
	sent := slices.Clone(keys)
	mu.Unlock()
	maxAttempts := (retry.Policy{}).Defaults().MaxAttempts
	if len(sent) == 0 || len(sent) > maxAttempts {
		t.Fatalf("the server got %d requests; want 1 to %d", len(sent), maxAttempts)
	}
	for i, k := range sent {
		if k != before.Key {
			t.Fatalf("attempt %d carried key %q; want the stored key %q", i+1, k, before.Key)
		}
	}
	for range sent {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a handler still waits for its answer to be read: idemctl left its connection open")
		}
	}
	r, err := jarState(t, path, "charge:o1")
	if err != nil || r.State != idem.StatePending || r.Key != before.Key || r.Attempts != before.Attempts+len(sent) {
		t.Fatalf("after the timeouts: %s, key %q, %d attempts (%v); want pending under key %q with %d attempts",
			r.State, r.Key, r.Attempts, err, before.Key, before.Attempts+len(sent))
	}

	mu.Lock()
	answer = true
	mu.Unlock()
	code, out, errOut := idemctl("--jar", path, "resume", "charge:o1", "--attempt-timeout", "200ms", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || out != "charge:o1: 201 Created, key "+before.Key+"\n" || errOut != "" {
		t.Fatalf("resume once the server answers: exit %d, %q, %q; want 201 Created with the stored key", code, out, errOut)
	}
	mu.Lock()
	last := keys[len(keys)-1]
	mu.Unlock()
	if last != before.Key {
		t.Fatalf("the later resume sent key %q; want the stored key %q", last, before.Key)
	}
	if r, err := jarState(t, path, "charge:o1"); err != nil || r.State != idem.StateDone {
		t.Fatalf("after the later resume: %s (%v); want done", r.State, err)
	}
}

// TestResumeAttemptTimeoutDefault: without --attempt-timeout, an attempt
// that the server never answers is given up after a minute, the default.
// resume then fails, saying the outcome is unknown, after that one
// attempt (the retry policy's MaxElapsed, a minute too, starts no wait
// after it), with the operation pending under its key and nothing left
// running.
func TestResumeAttemptTimeoutDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		jar := pendingInMemory(t, "http://payments.example/v1/charges")
		before, _ := jar.Get(ctx, "charge:p1")

		real := resumeBase
		defer func() { resumeBase = real }()
		var keys []string // one attempt at a time: no lock
		resumeBase = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			keys = append(keys, r.Header.Get(idem.KeyHeader))
			<-r.Context().Done() // no answer, ever
			return nil, r.Context().Err()
		})
		var stdout, stderr bytes.Buffer
		s := &session{jar: jar, path: "keys.db", lockTimeout: time.Second, stdout: &stdout, stderr: &stderr}
		set := flag.NewFlagSet("resume", flag.ContinueOnError)
		resumeFlags(set)
		if err := set.Parse([]string{"--header", "Authorization: " + secret}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := resume(ctx, s, set, []string{"charge:p1"})
		took := time.Since(start)
		line := stderr.String()
		if !errors.Is(err, errFailed) || strings.Count(line, "\n") != 1 || !strings.Contains(line, "outcome unknown") ||
			!strings.Contains(line, "timed out after 1m0s") {
			t.Fatalf("resume: %v, stderr %q; want it failed, one line saying the attempt timed out after 1m0s and the outcome is unknown", err, line)
		}
		if took < time.Minute || took >= 2*time.Minute {
			t.Fatalf("resume took %v; want a minute, one attempt's default timeout", took)
		}
		if len(keys) != 1 || keys[0] != before.Key {
			t.Fatalf("sent keys %q; want one attempt with the stored key %q", keys, before.Key)
		}
		if r, err := jar.Get(ctx, "charge:p1"); err != nil || r.State != idem.StatePending || r.Key != before.Key {
			t.Fatalf("after resume: %s, key %q (%v); want pending under key %q", r.State, r.Key, err, before.Key)
		}
	})
}

// TestResumeAttemptTimeoutRefused: an --attempt-timeout that is not a
// positive duration of at most the retry horizon is a usage error, and
// nothing is sent: the operation's attempts are as they were.
func TestResumeAttemptTimeoutRefused(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	before, _ := jarState(t, path, "charge:p1")
	const outOfRange = ": want a positive duration of at most 24h0m0s"
	for v, want := range map[string]string{
		"0":        "--attempt-timeout 0s" + outOfRange,
		"-1s":      "--attempt-timeout -1s" + outOfRange,
		"24h0m1s":  "--attempt-timeout 24h0m1s" + outOfRange,
		"9000h":    "--attempt-timeout 9000h0m0s" + outOfRange,
		"5":        `invalid value "5" for flag -attempt-timeout: missing unit`,
		"1 minute": `invalid value "1 minute" for flag -attempt-timeout`,
	} {
		code, _, errOut := idemctl("--jar", path, "resume", "charge:p1", "--attempt-timeout", v, "--header", "Authorization: "+secret)
		wantError(t, code, errOut, 2, want)
	}
	if len(srv.keys) != 0 {
		t.Fatalf("the server got %d requests; want none", len(srv.keys))
	}
	if r, _ := jarState(t, path, "charge:p1"); r.State != idem.StatePending || r.Attempts != before.Attempts {
		t.Fatalf("after the refusals: %s with %d attempts; want pending with %d", r.State, r.Attempts, before.Attempts)
	}
	// The longest is taken.
	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--attempt-timeout", "24h", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created, key "+before.Key) {
		t.Fatalf("resume --attempt-timeout 24h: exit %d, %q, %q; want 201 Created", code, out, errOut)
	}
}

// TestResumeShortHorizonAlone: a --horizon shorter than the default
// --attempt-timeout (a minute), given alone, is no usage error: the attempt
// timeout not given is the horizon then. Given, it is held to the horizon.
func TestResumeShortHorizonAlone(t *testing.T) {
	parse := func(args ...string) (retry.Policy, error) {
		set := flag.NewFlagSet("resume", flag.ContinueOnError)
		resumeFlags(set)
		if err := set.Parse(args); err != nil {
			t.Fatal(err)
		}
		return resumePolicy(set)
	}
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"--horizon", "30s"}, 30 * time.Second},
		{[]string{"--horizon", "1ms"}, time.Millisecond},
		{[]string{"--horizon", "2h"}, time.Minute},
		{nil, time.Minute},
		{[]string{"--horizon", "30s", "--attempt-timeout", "10s"}, 10 * time.Second},
	} {
		p, err := parse(c.args...)
		if err != nil || p.AttemptTimeout != c.want {
			t.Errorf("resume %q: attempt timeout %v, %v; want %v", c.args, p.AttemptTimeout, err, c.want)
		}
	}
	var ue *cliflag.UsageError
	if _, err := parse("--horizon", "30s", "--attempt-timeout", "1m"); !errors.As(err, &ue) {
		t.Errorf("resume --horizon 30s --attempt-timeout 1m: %v; want a usage error", err)
	}
}

// TestResumeHorizon: --horizon is the retry horizon of the program that
// sent the operations. Under the default, 24 h, an operation first sent 30
// hours ago is not sent but marked for reconciliation; under --horizon 48h,
// the horizon of a program whose server keeps keys longer, it is sent
// with its stored key. A horizon that is not positive, or shorter than
// --attempt-timeout, is a usage error, and nothing is sent.
func TestResumeHorizon(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	ctx := context.Background()
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]idem.Record{}
	for _, op := range []string{"charge:p1", "charge:p2"} {
		r, err := j.Get(ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Forget(ctx, op); err != nil {
			t.Fatal(err)
		}
		r.Created = time.Now().Add(-30 * time.Hour)
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
		old[op] = r
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"--horizon", "0s"}, {"--horizon", "-1h"}, {"--horizon", "1h", "--attempt-timeout", "2h"},
	} {
		code, _, errOut := idemctl(append([]string{"--jar", path, "resume", "charge:p1", "--header", "Authorization: " + secret}, args...)...)
		wantError(t, code, errOut, 2, args[len(args)-1])
	}
	if len(srv.keys) != 0 {
		t.Fatalf("the server got %d requests after usage errors; want none", len(srv.keys))
	}

	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--horizon", "48h", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created, key "+old["charge:p1"].Key) {
		t.Fatalf("resume --horizon 48h of an operation first sent 30h ago: exit %d, %q, %q; want 201 with its key", code, out, errOut)
	}
	code, out, errOut = idemctl("--jar", path, "resume", "charge:p2", "--header", "Authorization: "+secret, "--host", srv.URL)
	wantError(t, code, errOut, 1, "more than 24h0m0s ago: not retried")
	if len(srv.keys) != 1 {
		t.Fatalf("the server got %d requests; want 1, charge:p1's (stdout %q)", len(srv.keys), out)
	}
	if r, _ := jarState(t, path, "charge:p2"); r.State != idem.StateReconcile {
		t.Fatalf("charge:p2 past the default horizon: %s; want reconcile", r.State)
	}
}

// TestPasswordNeverPrinted: a PostgreSQL URL's password, in the userinfo or
// in the query (pgx takes both), is not in idemctl's messages.
func TestPasswordNeverPrinted(t *testing.T) {
	addr := refusetest.Addr(t) // connecting is refused at once
	const pw = "s3cretPW"
	for _, dsn := range []string{
		"postgres://ops:" + pw + "@" + addr + "/payments?sslmode=disable&connect_timeout=5",
		"postgres://ops@" + addr + "/payments?password=" + pw + "&sslmode=disable&connect_timeout=5",
	} {
		code, _, stderr := idemctl("--jar", dsn, "list")
		if code != 1 || strings.Contains(stderr, pw) || !strings.Contains(stderr, addr) {
			t.Errorf("exit %d, stderr %q; want exit 1 naming the database, without the password", code, stderr)
		}
	}
}

// TestBehindPgBouncer: a PgBouncer that takes none of the startup
// parameters pgjar sets refuses the session, and idemctl says what to do
// about it after PgBouncer's refusal, without the password.
func TestBehindPgBouncer(t *testing.T) {
	addr, sessions := refusetest.PgBouncer(t)
	code, _, stderr := idemctl("--jar", "postgres://ops:s3cretPW@"+addr+"/jars?connect_timeout=5", "list")
	want := "postgres://ops:xxxxx@" + addr + "/jars?connect_timeout=5: FATAL: unsupported startup parameter: default_transaction_isolation (SQLSTATE 08P01); " +
		"behind a PgBouncer? list the startup parameters idem sets (default_transaction_isolation, statement_timeout, synchronous_commit) in its ignore_startup_parameters"
	if code != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "s3cretPW") {
		t.Errorf("exit %d, stderr %q; want exit 1 and %q, without the password", code, stderr, want)
	}
	if n := sessions(); n != 1 {
		t.Errorf("idemctl sent %d startup messages; want 1", n)
	}
}

// TestURLPasswordOfEarlierRecordsNotPrinted: versions that stored a URL's
// userinfo kept its password in the record's URL, and in its LastError
// when an error quoted the URL. list, show and export print them masked
// (user:xxxxx@); the jar keeps them, and a resume sends the URL as it is,
// its userinfo as Basic credentials.
func TestURLPasswordOfEarlierRecordsNotPrinted(t *testing.T) {
	const pw = "s3cretPW"
	srv := newServer(t)
	withUser := "http://ops:" + pw + "@" + strings.TrimPrefix(srv.URL, "http://") + "/v1/charges"
	fp := sha256.Sum256([]byte("POST\n" + withUser + "\n{}")) // as those versions fingerprinted it
	now := time.Now()
	path := jarWith(t, idem.Record{Op: "charge:o1", Key: "key-1", Fingerprint: hex.EncodeToString(fp[:]),
		State: idem.StatePending, Method: "POST", URL: withUser, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{}`), BodySize: 2, Created: now, Updated: now, Attempts: 1, LastError: `Post "` + withUser + `": EOF`})
	for _, cmd := range []string{"list", "show", "export"} {
		args := []string{"--jar", path, cmd}
		if cmd == "show" {
			args = append(args, "charge:o1")
		}
		code, out, errOut := idemctl(args...)
		if code != 0 || strings.Contains(out+errOut, pw) || !strings.Contains(out, "ops:xxxxx@") {
			t.Errorf("idemctl %s: exit %d, stderr %q, stdout:\n%s\nwant the URL and the last error with the password masked, ops:xxxxx@", cmd, code, errOut, out)
		}
	}
	if r, _ := jarState(t, path, "charge:o1"); r.URL != withUser {
		t.Fatalf("the jar holds the URL %q; want it as it was, %q", r.URL, withUser)
	}
	code, out, errOut := idemctl("--jar", path, "resume", "charge:o1")
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+pw))
	if code != 0 || !strings.Contains(out, "201 Created") || len(srv.auths) != 1 || srv.auths[0] != basic || srv.keys[0] != "key-1" {
		t.Fatalf("resume: exit %d, stdout %q, stderr %q, sent %q with keys %q; want the URL's userinfo sent as Basic credentials, under key-1",
			code, out, errOut, srv.auths, srv.keys)
	}
}

// TestSecretHeadersOfEarlierRecordsNotPrinted: versions whose SecretHeader
// named fewer headers stored some that it names now (an exchange's
// CB-ACCESS-PASSPHRASE, an X-Api-Key). show and export print their values
// masked, xxxxx (export's header_base64 too, which a value that is not
// UTF-8 would fill); the jar keeps them, and a resume sends them as the
// first send did (see Record.NewRequest).
func TestSecretHeadersOfEarlierRecordsNotPrinted(t *testing.T) {
	const pass, apiKey = "s3cretPASS", "s3cretKEY\xff"
	var mu sync.Mutex
	var sent []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent = append(sent, r.Header.Get("Cb-Access-Passphrase"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	u := srv.URL + "/v1/orders"
	fp := sha256.Sum256([]byte("POST\n" + u + "\n{}"))
	now := time.Now()
	h := http.Header{"Content-Type": {"application/json"}, "Cb-Access-Passphrase": {pass}, "X-Api-Key": {apiKey}}
	path := jarWith(t, idem.Record{Op: "order:o1", Key: "key-1", Fingerprint: hex.EncodeToString(fp[:]),
		State: idem.StatePending, Method: "POST", URL: u, Header: h, Body: []byte(`{}`), BodySize: 2, Created: now, Updated: now})
	// The jar drops them now: the record is written as those versions did.
	stored, err := hdrjson.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec("UPDATE operations SET header = ? WHERE op = ?", string(stored), "order:o1")
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	leaks := func(out string) bool {
		for _, s := range []string{"s3cret", base64.StdEncoding.EncodeToString([]byte(pass)), base64.StdEncoding.EncodeToString([]byte(apiKey))} {
			if strings.Contains(out, s) {
				return true
			}
		}
		return false
	}
	code, out, errOut := idemctl("--jar", path, "show", "order:o1")
	if code != 0 || leaks(out+errOut) || !strings.Contains(out, "Cb-Access-Passphrase: xxxxx") || !strings.Contains(out, "X-Api-Key: xxxxx") ||
		!strings.Contains(out, "Content-Type: application/json") {
		t.Errorf("show: exit %d, stderr %q, stdout:\n%s\nwant the secret headers' values masked, xxxxx, the others as they are", code, errOut, out)
	}
	code, out, errOut = idemctl("--jar", path, "export")
	var recs []map[string]any
	if err := json.Unmarshal([]byte(out), &recs); code != 0 || err != nil || len(recs) != 1 {
		t.Fatalf("export: exit %d, %v, stderr %q, stdout:\n%s", code, err, errOut, out)
	}
	want := map[string]any{"Content-Type": []any{"application/json"}, "Cb-Access-Passphrase": []any{"xxxxx"}, "X-Api-Key": []any{"xxxxx"}}
	if leaks(out) || fmt.Sprint(recs[0]["header"]) != fmt.Sprint(want) || recs[0]["header_base64"] != nil {
		t.Errorf("export:\n%s\nwant the header %v, no header_base64", out, want)
	}
	if r, _ := jarState(t, path, "order:o1"); r.Header.Get("Cb-Access-Passphrase") != pass {
		t.Fatalf("the jar holds the header %v; want it as it was", r.Header)
	}
	code, out, errOut = idemctl("--jar", path, "resume", "order:o1")
	mu.Lock()
	defer mu.Unlock()
	if code != 0 || !slices.Equal(sent, []string{pass}) {
		t.Errorf("resume: exit %d, stdout %q, stderr %q, sent the passphrases %q; want the stored one sent", code, out, errOut, sent)
	}
}

// TestResumeErrorPasswordNotPrinted: the error of a resume whose transport
// quotes a URL with its password (net/http's, for a malformed HTTPS_PROXY)
// is printed with the password masked (user:xxxxx@), as the jar keeps it.
func TestResumeErrorPasswordNotPrinted(t *testing.T) {
	const pw = "s3cretPW"
	path := pendingInFile(t, http.MethodPost, "charge:o1", "http://payments.example/v1/charges", 0)
	real := resumeBase
	defer func() { resumeBase = real }()
	proxy := "http://ops:" + pw + "%zz@proxy.internal:3128"
	resumeBase = roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, fmt.Errorf(`invalid proxy address %q: parse %q: invalid URL escape "%%zz"`, proxy, proxy)
	})
	for _, args := range [][]string{{"resume", "charge:o1"}, {"resume", "--all"}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, append(args, "--header", "Authorization: "+secret, "--host", "http://payments.example")...)...)
		if code != 1 || strings.Contains(out+errOut, pw) || !strings.Contains(errOut, "ops:xxxxx@") {
			t.Errorf("idemctl %q: exit %d, stdout %q, stderr %q; want exit 1, the proxy's password masked, ops:xxxxx@", args, code, out, errOut)
		}
	}
}

// A database's URL given where an argument of another kind goes (--jar
// forgotten: as the command, or after one that takes none) is refused as
// a usage error that quotes it without its password, and a key=value
// connection string not at all.
func TestStrayPasswordNeverPrinted(t *testing.T) {
	const pw = "s3cretPW"
	path := filepath.Join(t.TempDir(), "keys.db")
	for _, arg := range []string{
		"postgres://ops:" + pw + "@db.internal/payments",
		"postgresql://ops@db.internal/payments?password=" + pw,
		"host=db.internal user=ops password=" + pw,
	} {
		for _, args := range [][]string{{arg, "list"}, {"--jar", path, "list", arg}, {"--jar", path, "export", arg},
			{"--jar", path, "prune", "--older-than", "1h", arg}} {
			code, _, stderr := idemctl(args...)
			if code != 2 || strings.Contains(stderr, pw) {
				t.Errorf("idemctl %q: exit %d, stderr %q; want a usage error without the password", args, code, stderr)
			}
		}
	}
}

// A database's URL or connection string given to a flag or an argument
// that refuses it (the value of --jar given to the flag before it, --jar
// forgotten) is not printed with its password: not by the flag package's
// error, nor by idemctl's own.
func TestRejectedValuePasswordNeverPrinted(t *testing.T) {
	const pw = "s3cretPW"
	path := seed(t, newServer(t))
	for _, v := range []string{"postgres://ops:" + pw + "@db.internal/payments", "postgresql://ops@db.internal/payments?password=" + pw,
		"host=db.internal user=ops password=" + pw} {
		for _, args := range [][]string{{"--lock-timeout", v, "list"}, {"--lock-timeout=" + v, "list"}, {"list", "--lock-timeout", v},
			{"list", "--status", v}, {"export", "--json=" + v}, {"resume", "--all", "--attempt-timeout", v}, {"resume", "--all", "--horizon", v},
			{"resume", "--all=" + v}, {"prune", "--older-than", v}, {"abandon", v}, {"show", v}, {"forget", v}, {"list", "---jar=" + v}} {
			args = append([]string{"--jar", path}, args...)
			code, out, stderr := idemctl(args...)
			if code == 0 || strings.Contains(out+stderr, pw) {
				t.Errorf("idemctl %q: exit %d, stdout %q, stderr %q; want an error without the password", args, code, out, stderr)
			}
		}
	}
}

// Opening a PostgreSQL jar can run out of --lock-timeout on the client's
// side first (pgjar waits twice QueryTimeout, then returns an error
// wrapping context.DeadlineExceeded, as on a loaded machine): the message
// is the same as for the server's statement_timeout. Running out of the
// whole connection's time says that instead.
func TestExplainOpenDeadline(t *testing.T) {
	jarErr := fmt.Errorf("pgjar: migrate: %w", context.DeadlineExceeded)
	err := explainOpen(context.Background(), "the PostgreSQL database", 100*time.Millisecond, jarErr)
	if want := "the PostgreSQL database: a statement ran out of --lock-timeout (100ms)"; !strings.Contains(err.Error(), want) {
		t.Errorf("explainOpen = %q; want it to say %q", err, want)
	}
	done, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-done.Done()
	err = explainOpen(done, "the PostgreSQL database", 100*time.Millisecond, jarErr)
	if want := fmt.Sprintf("no answer within %v", connectTimeout); !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "--lock-timeout") {
		t.Errorf("explainOpen after the connection's own deadline = %q; want it to say %q", err, want)
	}
}

// Once the jar is open, a jar's error that wraps context.DeadlineExceeded
// (pgjar gave a statement up after twice --lock-timeout) says that it ran
// out of --lock-timeout, as while it opens; a resumed request's error that
// wraps one (a *idem.PendingError) is the request's, given as it is.
func TestExplainDeadline(t *testing.T) {
	err := explain("keys", 100*time.Millisecond, fmt.Errorf("pgjar: list: timeout: %w", context.DeadlineExceeded))
	if want := "keys: a statement ran out of --lock-timeout (100ms)"; !strings.Contains(err.Error(), want) {
		t.Errorf("explain = %q; want it to say %q", err, want)
	}
	pending := &idem.PendingError{Op: "charge:p1", Key: "key-1", Attempts: 1, Err: fmt.Errorf("proxy: %w", context.DeadlineExceeded)}
	if err := explain("keys", 100*time.Millisecond, pending); err != pending {
		t.Errorf("explain of a request's error = %q; want it as it is", err)
	}
}

// A jar file idemctl may not open says what each command needs: list,
// show and export to read the file and its -wal and -shm files, the others
// to write them and their directory.
func TestExplainPermission(t *testing.T) {
	jarErr := fmt.Errorf("keyjar: open /srv/keys.db: %w", fs.ErrPermission)
	err := explain("keys.db", time.Second, jarErr)
	for _, want := range []string{"keys.db: permission denied", "list, show and export read", "-wal and -shm", "write", "directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("explain = %q; want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "even to list it") {
		t.Errorf("explain = %q; list opens the jar for reading alone", err)
	}
}

// TestListCreatesMissingWALFiles: a jar whose -wal and -shm files are
// missing (last closed by a keyjar that removed them), which SQLite cannot
// read without creating them, is listed all the same by a user who may
// write its directory: opened for writing once, as before read-only opens,
// which creates them.
func TestListCreatesMissingWALFiles(t *testing.T) {
	path := seed(t, newServer(t))
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := idemctl("--jar", path, "list")
	if code != 0 || errOut != "" || !strings.Contains(out, "charge:p1") {
		t.Fatalf("list of a jar without its -wal and -shm files: exit %d, stderr %q, stdout %q; want it listed", code, errOut, out)
	}
	if got := dirNames(t, filepath.Dir(path)); !slices.Equal(got, []string{"keys.db", "keys.db-shm", "keys.db-wal"}) {
		t.Errorf("after list, the directory holds %q; want the jar with its -wal and -shm files", got)
	}
}

// TestReadOfADamagedJarWithoutWALFiles: a jar without its -wal and -shm
// files whose first page is damaged (as in a copy taken while the file was
// written) is said to be damaged by list, show and export, as by the
// commands that write: the open for writing that would create the two
// files fails on the damage, not on a permission that this user lacks.
func TestReadOfADamagedJarWithoutWALFiles(t *testing.T) {
	path := seed(t, newServer(t))
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	// The first page's b-tree header follows the 100-byte file header,
	// which stays intact: 0 is no page type.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0}, 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list"}, {"show", "charge:p1"}, {"export"}, {"forget", "charge:done"}} {
		code, _, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		wantError(t, code, errOut, 1, path+" is not a key jar or is corrupt")
		if strings.Contains(errOut, "may not create them") {
			t.Errorf("%s of a damaged jar: %q; want the damage, not a permission", args[0], errOut)
		}
	}
}

// dirNames returns the names in dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// TestResumeAllKeepsCredentialsToOneHost: the headers given to resume go
// with every request it sends. --all over a jar whose pending operations
// go to more than one host is refused when headers are given, before
// anything is sent: one API's credential must not reach another.
func TestResumeAllKeepsCredentialsToOneHost(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	other := newServer(t)
	sendUnanswered(t, path, func(c *client.Client) {
		if _, err := c.PostJSON(context.Background(), "hook:h1", other.URL+"/v1/hooks", map[string]int{"n": 1}, nil); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("seeding hook:h1: %v; want pending", err)
		}
	})

	code, _, errOut := idemctl("--jar", path, "resume", "--all", "--header", "Authorization: "+secret, "--host", srv.URL)
	wantError(t, code, errOut, 2, "2 hosts")
	if strings.Contains(errOut, "sk_test") {
		t.Errorf("the error shows the credential: %q", errOut)
	}
	if len(srv.keys) != 0 || len(other.keys) != 0 {
		t.Fatalf("sent %d and %d requests; want none", len(srv.keys), len(other.keys))
	}
	// One operation at a time, each with its own API's credential.
	code, out, errOut := idemctl("--jar", path, "resume", "hook:h1", "--header", "Authorization: Bearer other", "--host", other.URL)
	if code != 0 || !strings.Contains(out, "hook:h1: 201 Created") || len(other.auths) != 1 || other.auths[0] != "Bearer other" {
		t.Fatalf("resume hook:h1: exit %d, %q, %q, auths %q", code, out, errOut, other.auths)
	}
	code, out, errOut = idemctl("--jar", path, "resume", "--all", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || strings.Count(out, "201 Created") != 2 || len(srv.auths) != 2 || srv.auths[1] != secret {
		t.Fatalf("resume --all once one host is left: exit %d, %q, %q, auths %q", code, out, errOut, srv.auths)
	}
}

// TestResumeSendsHeadersOnlyToTheNamedHost: the jar says where each
// operation goes, and whoever can write it can point one at another host.
// Headers given to resume (--header or IDEM_HEADER) need --host, the
// scheme and host they are for; an operation that goes elsewhere is
// refused with a usage error, the credential neither sent nor shown.
func TestResumeSendsHeadersOnlyToTheNamedHost(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	refused := []struct {
		args []string
		want string
	}{
		{[]string{"charge:p1"}, "--host"},
		{[]string{"charge:p1", "--host", "https://api.example.com"}, "goes to " + srv.URL},
		{[]string{"charge:p1", "--host", strings.Replace(srv.URL, "http:", "https:", 1)}, "goes to " + srv.URL},
		{[]string{"--all", "--host", "https://api.example.com"}, srv.URL},
		{[]string{"charge:p1", "--host", "127.0.0.1"}, "--host"},
		{[]string{"charge:p1", "--host", srv.URL + "/v1/charges"}, "--host"},
		{[]string{"charge:p1", "--host", "ftp://" + srv.Listener.Addr().String()}, "--host"},
		{[]string{"charge:p1", "--host", "http://user:pw@" + srv.Listener.Addr().String()}, "--host"},
		{[]string{"charge:p1", "--host", srv.URL + "?a=1"}, "--host"},
	}
	for _, c := range refused {
		code, _, errOut := idemctl(append([]string{"--jar", path, "resume", "--header", "Authorization: " + secret}, c.args...)...)
		wantError(t, code, errOut, 2, c.want)
		if strings.Contains(errOut, "sk_test") || strings.Contains(errOut, ":pw@") {
			t.Errorf("resume %q: the error shows a credential: %q", c.args, errOut)
		}
	}
	t.Setenv("IDEM_HEADER", "Authorization: "+secret)
	code, _, errOut := idemctl("--jar", path, "resume", "charge:p1")
	wantError(t, code, errOut, 2, "--host")
	if len(srv.keys) != 0 {
		t.Fatalf("sent %d requests; want none", len(srv.keys))
	}
	// The host of the operation, in any case.
	code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--host", strings.ToUpper(srv.URL)+"/")
	if code != 0 || !strings.Contains(out, "charge:p1: 201 Created") || len(srv.auths) != 1 || srv.auths[0] != secret {
		t.Fatalf("resume --host %s: exit %d, %q, %q, auths %q; want it sent with the credential", srv.URL, code, out, errOut, srv.auths)
	}
}

// TestHeadersAddedOnlyForTheHost: the headers go on a request only when it
// goes to --host's scheme and host, its Host included, which a record
// rewritten in the jar after resume read it may not.
func TestHeadersAddedOnlyForTheHost(t *testing.T) {
	h := http.Header{"Authorization": {secret}}
	for _, c := range []struct {
		url, reqHost, host string
		added              bool
	}{
		{"https://api.example.com/v1/charges", "", "https://api.example.com", true},
		{"https://API.example.com/v1/charges", "", "https://api.example.com", true},
		{"https://api.example.com/v1/charges", "", "", true},
		{"https://evil.example/v1/charges", "", "https://api.example.com", false},
		{"http://api.example.com/v1/charges", "", "https://api.example.com", false},
		{"https://api.example.com:8443/v1/charges", "", "https://api.example.com", false},
		// The credential goes where the URL points: a Host names a
		// virtual host there, not another address.
		{"https://10.0.0.1/v1/charges", "api.example.com", "https://10.0.0.1", true},
		{"https://10.0.0.1/v1/charges", "api.example.com", "https://api.example.com", false},
		{"https://evil.example/v1/charges", "api.example.com", "https://api.example.com", false},
		{"https://api.example.com/v1/charges", "evil.example", "https://api.example.com", true},
		// A scheme's default port is its host's, written or not.
		{"https://api.example.com:443/v1/charges", "", "https://api.example.com", true},
		{"https://api.example.com/v1/charges", "", "https://api.example.com:443", true},
		{"http://api.example.com:80/v1/charges", "", "HTTP://api.example.com", true},
		{"http://api.example.com:443/v1/charges", "", "https://api.example.com", false},
		{"https://api.example.com:80/v1/charges", "", "http://api.example.com:80", false},
	} {
		if c.host != "" {
			var ok bool
			if c.host, ok = origin(c.host); !ok {
				t.Fatalf("origin refuses --host %q", c.host)
			}
		}
		r, err := http.NewRequest(http.MethodPost, c.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.reqHost != "" {
			r.Host = c.reqHost
		}
		err = addHeaders(r, h, c.host)
		if got := r.Header.Get("Authorization") == secret; got != c.added || (err == nil) != c.added {
			t.Errorf("%s (Host %q) for --host %q: added %v, error %v; want added %v", c.url, c.reqHost, c.host, got, err, c.added)
		}
		if err != nil && strings.Contains(err.Error(), "sk_test") {
			t.Errorf("the error shows the credential: %v", err)
		}
	}
}

// TestResumeSendsHeadersToTheURLsHost: a record's Host names a virtual
// host at its URL's address, but the request, and the credential with it,
// goes to that address. A record whose URL points elsewhere under the
// Host of --host (a jar rewritten) is refused, nothing sent; one sent to
// an address under a Host is resumed with the address as --host.
func TestResumeSendsHeadersToTheURLsHost(t *testing.T) {
	srv, evil := newServer(t), newServer(t)
	path := filepath.Join(t.TempDir(), "keys.db")
	sendUnanswered(t, path, func(c *client.Client) {
		req, _ := http.NewRequest(http.MethodPost, evil.URL+"/v1/charges", strings.NewReader(`{"n":1}`))
		req.Host = srv.Listener.Addr().String()
		if _, err := c.Do(context.Background(), "op:rewritten", req); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("seeding: %v; want pending", err)
		}
	})
	for _, c := range []struct{ arg, want string }{
		{"op:rewritten", "goes to " + evil.URL},
		{"--all", "go to " + evil.URL},
	} {
		code, _, errOut := idemctl("--jar", path, "resume", c.arg, "--header", "Authorization: "+secret, "--host", srv.URL)
		wantError(t, code, errOut, 2, c.want)
		if len(evil.auths)+len(srv.auths) != 0 {
			t.Fatalf("resume %s: sent %q to the URL's host, %q to --host's; want nothing sent", c.arg, evil.auths, srv.auths)
		}
	}
	code, out, errOut := idemctl("--jar", path, "resume", "op:rewritten", "--header", "Authorization: "+secret, "--host", evil.URL)
	if code != 0 || !strings.Contains(out, "201 Created") || len(evil.auths) != 1 {
		t.Fatalf("resume --host %s: exit %d, %q, %q, auths %q; want it sent there", evil.URL, code, out, errOut, evil.auths)
	}
}

// TestResumeAllKeepsCredentialsToOneVirtualHost: two operations sent to
// one address under two Hosts (virtual hosts reached by address) go to two
// hosts, each with its own credential: resume --all with headers refuses
// them, as it refuses two addresses, and sends nothing, --host naming
// their address or one of the Hosts.
func TestResumeAllKeepsCredentialsToOneVirtualHost(t *testing.T) {
	srv := newServer(t)
	path := filepath.Join(t.TempDir(), "keys.db")
	sendUnanswered(t, path, func(c *client.Client) {
		for _, host := range []string{"payments.example", "hooks.example"} {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"n":1}`))
			req.Host = host
			if _, err := c.Do(context.Background(), "op:"+host, req); !errors.Is(err, idem.ErrPending) {
				t.Fatalf("seeding op:%s: %v; want pending", host, err)
			}
		}
	})

	for _, host := range []string{srv.URL, "http://payments.example"} {
		code, _, errOut := idemctl("--jar", path, "resume", "--all", "--header", "Authorization: "+secret, "--host", host)
		wantError(t, code, errOut, 2, "2 hosts")
		if !strings.Contains(errOut, "hooks.example") || !strings.Contains(errOut, "payments.example") {
			t.Errorf("--host %s: the error does not name both hosts: %q", host, errOut)
		}
		if len(srv.keys) != 0 {
			t.Fatalf("--host %s: sent %d requests; want none", host, len(srv.keys))
		}
	}
}

// TestResumeAllKeepsCredentialsToOneScheme: operations sent to one host
// over https and over plain http go to two origins: resume --all with
// headers refuses them, sending nothing, as it refuses two hosts, so that
// a credential given for the https API does not cross the network in the
// clear.
func TestResumeAllKeepsCredentialsToOneScheme(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	sendUnanswered(t, path, func(c *client.Client) {
		for _, scheme := range []string{"https", "http"} {
			if _, err := c.PostJSON(context.Background(), "op:"+scheme, scheme+"://api.example/v1/charges", map[string]int{"n": 1}, nil); !errors.Is(err, idem.ErrPending) {
				t.Fatalf("seeding op:%s: %v; want pending", scheme, err)
			}
		}
	})
	real := resumeBase
	defer func() { resumeBase = real }()
	var sent []string
	resumeBase = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r.URL.String())
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	code, _, errOut := idemctl("--jar", path, "resume", "--all", "--header", "Authorization: "+secret, "--host", "https://api.example")
	if code != 2 || !strings.Contains(errOut, "2 hosts") || !strings.Contains(errOut, "http://api.example") || len(sent) != 0 {
		t.Fatalf("exit %d, stderr %q, sent %q; want a usage error naming both origins, nothing sent", code, errOut, sent)
	}
}

// sendUnanswered opens the jar file at path (created if missing) and calls
// send with a Client over it whose every attempt fails to connect, once:
// the calls send makes stay pending.
func sendUnanswered(t *testing.T, path string, send func(*client.Client)) {
	t.Helper()
	j, err := keyjar.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(context.Background(), "", &client.Options{Jar: j, Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	send(c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

// wrapOpenedJar makes the jar idemctl works with, until t ends, what wrap
// makes of the jar it opens and of its close.
func wrapOpenedJar(t *testing.T, wrap func(j client.Jar, closeJar func() error) (client.Jar, func() error)) {
	real := openJarFn
	t.Cleanup(func() { openJarFn = real })
	openJarFn = func(ctx context.Context, spec string, lockTimeout time.Duration, readOnly bool) (client.Jar, func() error, error) {
		j, closeJar, err := real(ctx, spec, lockTimeout, readOnly)
		if err != nil {
			return nil, nil, err
		}
		j, closeJar = wrap(j, closeJar)
		return j, closeJar, nil
	}
}

// TestCloseErrorFailsTheCommand: closing the jar writes what a command left
// deferred and syncs it; when that fails, the command fails, with the
// close's error, rather than exit 0 on changes that may not be kept.
func TestCloseErrorFailsTheCommand(t *testing.T) {
	eachJar(t, func(t *testing.T, _ *server, path string) {
		wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
			return j, func() error { return errors.Join(closeJar(), errors.New("sync of the jar failed")) }
		})
		code, _, errOut := idemctl("--jar", path, "abandon", "charge:reconcile", "--reason", "ledger shows no charge")
		wantError(t, code, errOut, 1, "sync of the jar failed")
		// A command that failed first reports its own error.
		code, _, errOut = idemctl("--jar", path, "abandon", "charge:nope", "--reason", "x")
		wantError(t, code, errOut, 1, `no operation named "charge:nope" in `)
	})
}

// TestDroppedOutcomeSaysPending: a resume whose outcome the jar could not
// write (its Close returns idem.ErrDropped) fails, saying that the answer
// it printed may not be recorded and the operation then stays pending.
func TestDroppedOutcomeSaysPending(t *testing.T) {
	eachJar(t, func(t *testing.T, srv *server, path string) {
		wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
			return j, func() error {
				return errors.Join(closeJar(), fmt.Errorf("%w: 1 since the jar was opened", idem.ErrDropped))
			}
		})
		code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--header", "Authorization: "+secret, "--host", srv.URL)
		if !strings.Contains(out, "charge:p1: 201 Created") {
			t.Errorf("resume: stdout %q; want the answer", out)
		}
		wantError(t, code, errOut, 1, "deferred changes were dropped: 1 since the jar was opened; an answer printed above may not be recorded: its operation then stays pending")
	})
}

// TestDroppedReleaseWithNothingPrinted: a resume that printed no answer
// (the server unreachable: the operation stays pending) and whose Close
// dropped a deferred change (the lease's release) does not speak of an
// answer printed above: it says the operation stays as the jar recorded
// it.
func TestDroppedReleaseWithNothingPrinted(t *testing.T) {
	eachJar(t, func(t *testing.T, srv *server, path string) {
		wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
			return j, func() error {
				return errors.Join(closeJar(), fmt.Errorf("%w: 1 since the jar was opened", idem.ErrDropped))
			}
		})
		srv.Close()
		code, out, errOut := idemctl("--jar", path, "resume", "charge:p1", "--header", "Authorization: "+secret, "--host", srv.URL,
			"--horizon", "1s", "--attempt-timeout", "500ms")
		if code != 1 || out != "" || strings.Contains(errOut, "printed above") || !strings.Contains(errOut, "still pending") ||
			!strings.Contains(errOut, "deferred changes were dropped: 1 since the jar was opened; the operation stays as the jar last recorded it") {
			t.Errorf("resume: exit %d, stdout %q, stderr %q; want exit 1, nothing printed, the call's error and the dropped change said, no answer printed above spoken of",
				code, out, errOut)
		}
	})
}

// TestDroppedOutcomeSaidAfterFailures: resume --all of which one operation
// failed (a 422, said on its own line) and whose Close dropped the outcome
// of another, printed as a 201, says that too: the command's failures do
// not hide the close's error.
func TestDroppedOutcomeSaidAfterFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	now := time.Now()
	var recs []idem.Record
	for i, p := range []string{"/ok", "/bad"} {
		fp := sha256.Sum256([]byte("POST\n" + srv.URL + p + "\n{}"))
		recs = append(recs, idem.Record{Op: "charge" + p, Key: fmt.Sprint("key-", i), Fingerprint: hex.EncodeToString(fp[:]),
			State: idem.StatePending, Method: "POST", URL: srv.URL + p, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{}`), BodySize: 2, Created: now.Add(time.Duration(i) * time.Second), Updated: now})
	}
	path := jarWith(t, recs...)
	wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
		return j, func() error {
			return errors.Join(closeJar(), fmt.Errorf("%w: 1 since the jar was opened", idem.ErrDropped))
		}
	})
	code, out, errOut := idemctl("--jar", path, "resume", "--all", "--without-credentials")
	if code != 1 || !strings.Contains(out, "charge/ok: 201 Created") || !strings.Contains(errOut, "charge/bad: ") ||
		!strings.Contains(errOut, "an answer printed above may not be recorded") {
		t.Errorf("resume --all: exit %d, stdout %q, stderr %q; want exit 1, the 201, the 422's failure and the dropped outcome said", code, out, errOut)
	}
}

// controls returns the control characters of s but newlines, its bidi
// format characters, and its bytes that are not UTF-8 (which a terminal
// may take for C1 controls).
func controls(s string) []string {
	var found []string
	for i, r := range s {
		if _, size := utf8.DecodeRuneInString(s[i:]); r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == utf8.RuneError && size == 1) {
			found = append(found, fmt.Sprintf("%q", s[i:i+size]))
		}
	}
	return found
}

// TestTerminalEscapesNotPrinted: what a server answers and what a program
// stored reach the operator's terminal with their control characters
// escaped, never as they are: an answer's status and body that resume
// prints, and a stored URL (a query the program built by hand) that show
// prints. A terminal would run them as escape sequences (clear the screen,
// set its title or clipboard, hide the lines before), and reorder what it
// shows at a bidi format character (U+202E).
func TestTerminalEscapesNotPrinted(t *testing.T) {
	const esc = "\x1b]0;owned\a\x1b[2J\u009b31m\xff\u202e\u2066"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/refused" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, "refused "+esc)
			return
		}
		// A status line of the server's own words.
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprint(buf, "HTTP/1.1 201 Created "+esc+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		buf.Flush()
	}))
	t.Cleanup(srv.Close)

	for _, c := range []struct{ path, stream string }{{"/v1/refused", "stderr"}, {"/v1/created", "stdout"}} {
		path := pendingInFile(t, http.MethodPost, "charge:o1", srv.URL+c.path, 0)
		_, out, errOut := idemctl("--jar", path, "resume", "charge:o1", "--header", "Authorization: "+secret, "--host", srv.URL)
		printed := map[string]string{"stdout": out, "stderr": errOut}[c.stream]
		if !strings.Contains(printed, `\x1b[2J`) || !strings.Contains(printed, `\u202e\u2066`) {
			t.Errorf("resume of %s: %s %q; want the server's words, escaped", c.path, c.stream, printed)
		}
		if found := controls(out + errOut); len(found) > 0 {
			t.Errorf("resume of %s printed control characters %v: stdout %q, stderr %q", c.path, found, out, errOut)
		}
	}

	now := time.Now()
	path := jarWith(t, idem.Record{Op: "search:1", Key: "key-1", Fingerprint: "fp", State: idem.StatePending,
		Method: "POST", URL: srv.URL + "/v1/search?q=" + esc, Created: now, Updated: now})
	code, out, errOut := idemctl("--jar", path, "show", "search:1")
	if code != 0 || !strings.Contains(out, `/v1/search?q=\x1b]0;owned\a\x1b[2J\u009b31m\xff\u202e\u2066`) {
		t.Fatalf("show: exit %d, stderr %q, stdout:\n%s\nwant the URL, escaped", code, errOut, out)
	}
	if found := controls(out + errOut); len(found) > 0 {
		t.Errorf("show printed control characters %v:\n%s", found, out)
	}
}

// TestEscapedNameTellsOperationsApart: an operation named with a real ESC
// and one named with the six characters a\x1bb are printed differently by
// list and show (the first as a quoted Go string literal), so the name an
// operator copies from list is the operation it names: abandon of the
// literal one leaves the other pending.
func TestEscapedNameTellsOperationsApart(t *testing.T) {
	now := time.Now()
	rec := func(op string, i int) idem.Record {
		return idem.Record{Op: op, Key: fmt.Sprint("key-", i), Fingerprint: "fp", State: idem.StatePending,
			Method: "POST", URL: "http://127.0.0.1/v1/charges", Created: now.Add(time.Duration(i) * time.Second), Updated: now}
	}
	path := jarWith(t, rec(`a\x1bb`, 1), rec("a\x1bb", 2))
	code, out, errOut := idemctl("--jar", path, "list")
	if code != 0 {
		t.Fatalf("list: exit %d, %s", code, errOut)
	}
	names := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		names[strings.Fields(l)[0]] = true
	}
	if want := map[string]bool{`a\x1bb`: true, `"a\x1bb"`: true}; !maps.Equal(names, want) {
		t.Errorf("list printed the names %v; want %v:\n%s", slices.Collect(maps.Keys(names)), slices.Collect(maps.Keys(want)), out)
	}
	for op, want := range map[string]string{`a\x1bb`: `a\x1bb`, "a\x1bb": `"a\x1bb"`} {
		_, out, errOut := idemctl("--jar", path, "show", op)
		if f := strings.Fields(out); len(f) < 2 || f[0] != "op:" || f[1] != want {
			t.Errorf("show %q: stdout %q, stderr %q; want op: %s", op, out, errOut, want)
		}
	}
	if code, out, errOut := idemctl("--jar", path, "abandon", `a\x1bb`, "--reason", "checked the ledger"); code != 0 {
		t.Fatalf("abandon: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for op, want := range map[string]idem.State{`a\x1bb`: idem.StateAbandoned, "a\x1bb": idem.StatePending} {
		if r, err := jarState(t, path, op); err != nil || r.State != want {
			t.Errorf("after abandon of the literal name, %q is %s (%v); want %s", op, r.State, err, want)
		}
	}
}

// TestInvisibleNameTellsOperationsApart: names that differ only by a
// character a terminal shows as nothing (a zero-width space) or by a
// trailing space are printed differently by list and show, the one that
// has it quoted, as a literal that reads back as the name.
func TestInvisibleNameTellsOperationsApart(t *testing.T) {
	now := time.Now()
	names := []string{"zw:zero", "zw:\u200bzero", "pay:1", "pay:1 "}
	var recs []idem.Record
	for i, op := range names {
		recs = append(recs, idem.Record{Op: op, Key: fmt.Sprint("key-", i), Fingerprint: "fp", State: idem.StatePending,
			Method: "POST", URL: "http://127.0.0.1/v1/charges", Created: now.Add(time.Duration(i) * time.Second), Updated: now})
	}
	path := jarWith(t, recs...)
	code, out, errOut := idemctl("--jar", path, "list")
	if code != 0 {
		t.Fatalf("list: exit %d, %s", code, errOut)
	}
	var printed []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		printed = append(printed, strings.TrimRight(l[:strings.Index(l, "  pending")], " "))
	}
	want := []string{"zw:zero", `"zw:\u200bzero"`, "pay:1", `"pay:1 "`}
	if !slices.Equal(printed, want) {
		t.Errorf("list printed the names %q; want %q:\n%s", printed, want, out)
	}
	for i, op := range names {
		_, out, errOut := idemctl("--jar", path, "show", op)
		if !strings.HasPrefix(out, "op:") || strings.TrimSpace(strings.SplitN(out, "\n", 2)[0][len("op:"):]) != want[i] {
			t.Errorf("show %q: stdout %q, stderr %q; want op: %s", op, out, errOut, want[i])
		}
		if back, err := strconv.Unquote(want[i]); err == nil && back != op {
			t.Errorf("%s reads back as %q; want %q", want[i], back, op)
		}
	}
}

// TestShowEscapesEveryField: show and list print a record's key,
// fingerprint and lease holder escaped, as they do its name and URL: a
// program (or a damaged row) may have stored control characters in any
// of them, and a terminal would run them. (Such a state is none of idem's:
// see TestUnknownState.)
func TestShowEscapesEveryField(t *testing.T) {
	const key = "k\x1b]0;owned\a\x1b[2J"
	now := time.Now()
	path := jarWith(t, idem.Record{Op: "charge:1", Key: key, Fingerprint: "fp", State: idem.StatePending,
		Method: "POST", URL: "http://127.0.0.1/v1/charges", Created: now, Updated: now,
		Holder: "h\x1b[5m/1/x.1", LeaseUntil: now.Add(time.Hour)})
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec("UPDATE operations SET fingerprint = 'f\x1b[31m'")
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"show", "charge:1"}, {"show", key}, {"list"}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		if found := controls(out + errOut); len(found) > 0 {
			t.Errorf("%q: exit %d, printed control characters %v: stdout %q, stderr %q", args, code, found, out, errOut)
		}
		if args[0] == "show" {
			for _, want := range []string{`"k\x1b]0;owned\a\x1b[2J"`, `"f\x1b[31m"`, `"h\x1b[5m/1/x.1"`} {
				if !strings.Contains(out, want) {
					t.Errorf("%q: stdout %q; want %s", args, out, want)
				}
			}
		}
	}
}

// cancelOnWrite is a stdout that cancels its context on the first write, as
// a Ctrl-C while a command prints does, and keeps what it was given.
type cancelOnWrite struct {
	cancel context.CancelFunc
	bytes.Buffer
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.Buffer.Write(p)
}

// TestInterruptedWhilePrinting: a list or an export interrupted while it
// prints (its context cancelled, as SIGINT does) stops printing the
// records and fails, rather than printing the whole jar first.
func TestInterruptedWhilePrinting(t *testing.T) {
	const n = 200
	now := time.Now()
	recs := make([]idem.Record, n)
	for i := range recs {
		recs[i] = idem.Record{Op: fmt.Sprintf("charge:%03d", i), Key: fmt.Sprintf("key-%03d", i), Fingerprint: "fp", State: idem.StateDone,
			Method: "POST", URL: "http://127.0.0.1/v1/charges", Created: now, Updated: now, Attempts: 1, LastStatus: 201}
	}
	path := jarWith(t, recs...)
	for _, args := range [][]string{{"list"}, {"list", "--status", "done"}, {"export", "--json"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stdout := &cancelOnWrite{cancel: cancel}
			var stderr bytes.Buffer
			code := runContext(ctx, append([]string{"--jar", path}, args...), stdout, &stderr)
			printed := strings.Count(stdout.String(), "charge:")
			if code != 1 || !strings.Contains(stderr.String(), "interrupted") || printed >= n/2 {
				t.Fatalf("interrupted at its first write: exit %d, stderr %q, %d of %d operations printed; want exit 1, interrupted, and the printing stopped",
					code, stderr.String(), printed, n)
			}
		})
	}
}

// TestResumeAllInterrupted: resume --all interrupted (its context
// cancelled, as SIGINT does) after it resumed one operation stops there:
// one line says how many it did not resume, which stay pending under their
// keys, instead of an error for each.
func TestResumeAllInterrupted(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	before, err := jarState(t, path, "charge:p2")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := &cancelOnWrite{cancel: cancel} // at the line of the first operation resumed
	var stderr bytes.Buffer
	code := runContext(ctx, []string{"--jar", path, "resume", "--all", "--header", "Authorization: " + secret, "--host", srv.URL}, stdout, &stderr)
	if code != 1 || !strings.HasPrefix(stdout.String(), "charge:p1: 201") || stderr.String() != "idemctl: interrupted: 1 operation(s) not resumed, still pending\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1, charge:p1 resumed and one line saying 1 was not", code, stdout.String(), stderr.String())
	}
	after, err := jarState(t, path, "charge:p2")
	if err != nil || after.State != idem.StatePending || after.Key != before.Key || after.Attempts != before.Attempts {
		t.Fatalf("charge:p2 after the interrupted resume: %+v, %v; want it pending, untouched, under key %s", after, err, before.Key)
	}
}

// TestResumeAllInterruptedWhileSending: resume --all interrupted while the
// server holds its first operation's request cuts that attempt off: the
// operation stays pending under its key, and the line that says how many
// stay pending counts it with those not reached.
func TestResumeAllInterruptedWhileSending(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testResumeAllStoppedWhileSending(t, cancel, func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := runContext(ctx, args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	})
}

// testResumeAllStoppedWhileSending runs resume --all with idemctl, which
// stop stops (as SIGINT does) while the server holds the first request.
func testResumeAllStoppedWhileSending(t *testing.T, stop func(), idemctl func(args ...string) (int, string, string)) {
	srv := &server{}
	srv.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server sees the client go
		stop()                      // SIGINT while this request is in flight
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	path := seed(t, srv)
	var keys []string
	for _, op := range []string{"charge:p1", "charge:p2"} {
		r, err := jarState(t, path, op)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Key)
	}
	code, stdout, stderr := idemctl("--jar", path, "resume", "--all", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 1 || stdout != "" || !strings.HasSuffix(stderr, "idemctl: interrupted: 2 operation(s) not resumed, still pending\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and a last line saying that both stay pending", code, stdout, stderr)
	}
	for i, op := range []string{"charge:p1", "charge:p2"} {
		r, err := jarState(t, path, op)
		if err != nil || r.State != idem.StatePending || r.Key != keys[i] {
			t.Fatalf("%s after the interrupted resume: %+v, %v; want it pending under key %s", op, r, err, keys[i])
		}
	}
}

// prunedPerBatch is a jar whose Prune deletes one record per batch, as
// keyjar and pgjar delete up to a thousand, and runs between after each
// batch: a Ctrl-C, or another process's lock, on which the next batch, on
// the jar itself, fails.
type prunedPerBatch struct {
	client.Jar
	between func()
}

func (j prunedPerBatch) Prune(ctx context.Context, before time.Time, _ int) (int, error) {
	total := 0
	for range 10 { // fill makes three prunable operations
		n, err := j.Jar.Prune(ctx, before, 1)
		total += n
		j.between()
		if err != nil || n == 0 {
			return total, err
		}
	}
	return total, nil
}

// TestPruneInterrupted: a prune interrupted (its context cancelled, as
// SIGINT does) after its first batch fails, with one line that says how
// many operations it had deleted, and the jar keeps the others.
func TestPruneInterrupted(t *testing.T) {
	eachJar(t, func(t *testing.T, _ *server, path string) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
			return prunedPerBatch{Jar: j, between: cancel}, closeJar
		})
		var stdout, stderr bytes.Buffer
		code := runContext(ctx, []string{"--jar", path, "prune", "--older-than", "24h"}, &stdout, &stderr)
		wantError(t, code, stderr.String(), 1, "interrupted: pruned 1 operation(s)")
		if stdout.Len() != 0 {
			t.Fatalf("stdout %q; want nothing: the prune did not end", stdout.String())
		}
		wantOnePruned(t, path)
	})
}

// wantOnePruned checks that the jar at path holds 2 of the 3 operations
// that fill makes prunable, and the others: a prune deleted its first
// batch of one (prunedPerBatch), and no other.
func wantOnePruned(t *testing.T, path string) {
	t.Helper()
	_, out, _ := idemctl("--jar", path, "list")
	left := 0
	for _, op := range []string{"charge:done", "charge:failed", "charge:abandoned"} {
		if strings.Contains(out, op) {
			left++
		}
	}
	if left != 2 || !strings.Contains(out, "charge:p1") || !strings.Contains(out, "charge:reconcile") {
		t.Fatalf("after the prune, the jar holds:\n%s\nwant 2 of the 3 prunable operations, and the others", out)
	}
}

// TestPruneFailsPartWay: a prune that fails after its first batch, on a
// lock that another process took meanwhile (a write transaction on a jar
// file; a lock on a PostgreSQL jar's table, until --lock-timeout), fails
// with one line that gives the error and how many operations it had
// deleted, and the jar keeps the others.
func TestPruneFailsPartWay(t *testing.T) {
	eachJar(t, func(t *testing.T, _ *server, path string) {
		pg := strings.HasPrefix(path, "postgres")
		locked, release := false, func() {}
		lock := func() {
			if locked {
				return
			}
			locked = true
			if !pg {
				lockJar(t, path, false) // released as the test ends: list reads what is committed
				return
			}
			tx, err := pgtest.Connect(t, path).Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(t.Context(), `LOCK TABLE idem_operations IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			release = func() { tx.Rollback(context.Background()) }
		}
		wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
			return prunedPerBatch{Jar: j, between: lock}, closeJar
		})
		// Long enough for the statements that open a PostgreSQL jar, on a
		// loaded machine.
		code, out, errOut := idemctl("--jar", path, "--lock-timeout", "1s", "prune", "--older-than", "24h")
		release()
		want := map[bool]string{false: "is locked by another process", true: "ran out of --lock-timeout (1s)"}[pg]
		wantError(t, code, errOut, 1, want)
		if !strings.Contains(errOut, "deleted 1 operation(s) before it failed") {
			t.Errorf("stderr %q; want it to say that 1 operation was deleted before the prune failed", errOut)
		}
		if out != "" {
			t.Errorf("stdout %q; want nothing: the prune did not end", out)
		}
		wantOnePruned(t, path)
	})
}

// refused is a base transport whose every attempt fails to connect: a call
// through it stays pending.
var refused = roundTripFunc(func(*http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
})

// listRecorder is a jar that records the Filter of each List, and calls
// before, if set, with the number of the List (from 0) before it runs.
type listRecorder struct {
	client.Jar
	mu      sync.Mutex
	filters []idem.Filter
	before  func(n int)
}

func (j *listRecorder) List(ctx context.Context, f idem.Filter) ([]idem.Record, error) {
	j.mu.Lock()
	n := len(j.filters)
	j.filters = append(j.filters, f)
	j.mu.Unlock()
	if j.before != nil {
		j.before(n)
	}
	return j.Jar.List(ctx, f)
}

// lists returns the Filters of the Lists so far, and forgets them.
func (j *listRecorder) lists() []idem.Filter {
	j.mu.Lock()
	defer j.mu.Unlock()
	f := j.filters
	j.filters = nil
	return f
}

// recordLists makes every jar idemctl opens until t ends a listRecorder,
// which it returns.
func recordLists(t *testing.T) *listRecorder {
	rec := &listRecorder{}
	wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
		rec.Jar = j
		return rec, closeJar
	})
	return rec
}

// setPageSize makes pageSize n until t ends.
func setPageSize(t *testing.T, n int) {
	real := pageSize
	t.Cleanup(func() { pageSize = real })
	pageSize = n
}

// wantPages fails t unless each List of filters read one page of limit
// operations after the one before: the first from the start, the next after
// the last operation of the one before (want, the names in List's order,
// where a page began), and there were pages of them.
func wantPages(t *testing.T, what string, filters []idem.Filter, limit, pages int, want []string) {
	t.Helper()
	if len(filters) != pages {
		t.Errorf("%s: %d Lists; want %d, pages of %d", what, len(filters), pages, limit)
	}
	for i, f := range filters {
		if f.Limit != limit || (i == 0) != f.After.IsZero() || (i > 0 && i*limit <= len(want) && f.After.Op != want[i*limit-1]) {
			t.Fatalf("%s: List %d of %d: %+v; want a page of %d after the last of the page before", what, i, len(filters), f, limit)
		}
	}
}

// TestListAndExportInPages: list and export of a jar of 2500 operations
// read it in pages of 1000, each after the last operation of the one
// before, never the whole jar at once; they print every operation once,
// in List's order, although three share each Created time; export prints
// what a json.Encoder indenting by two spaces writes for the whole array.
func TestListAndExportInPages(t *testing.T) {
	const n = 2500
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour)
	recs := make([]idem.Record, n)
	for i := range recs {
		op := fmt.Sprintf("charge:%d", i*7919%n) // names in another order than times
		recs[i] = idem.Record{Op: op, Key: "key-" + op, Fingerprint: "fp", State: idem.StateDone, Method: "POST",
			URL: "http://127.0.0.1/v1/charges", Header: map[string][]string{"Content-Type": {"application/json"}},
			Body: []byte(`{"amount":1}`), BodySize: 12, Created: base.Add(time.Duration(i/3) * time.Millisecond), Updated: base,
			Attempts: 1, LastStatus: 201}
		switch i % 4 {
		case 0:
			recs[i].State, recs[i].LastStatus, recs[i].LastError = idem.StatePending, 0, "connection refused"
		case 1:
			recs[i].Body, recs[i].Header = []byte{0xff, 0xfe}, nil
			recs[i].BodySize = 2
		}
	}
	var wg sync.WaitGroup
	for g := range 8 { // concurrent, for the jar's group commit
		wg.Go(func() {
			for i := g; i < n; i += 8 {
				if _, _, err := j.Begin(ctx, recs[i]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(recs, func(a, b idem.Record) int { return a.Cursor().Compare(b.Cursor()) })
	var all, pending []string
	for _, r := range recs {
		all = append(all, r.Op)
		if r.State == idem.StatePending {
			pending = append(pending, r.Op)
		}
	}
	rec := recordLists(t)

	for _, c := range []struct {
		args []string
		want []string
	}{{[]string{"list"}, all}, {[]string{"list", "--status", "pending"}, pending}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, c.args...)...)
		if code != 0 || errOut != "" {
			t.Fatalf("%s: exit %d, %s", c.args, code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		var ops []string
		for _, line := range lines[1:] {
			ops = append(ops, strings.Fields(line)[0])
		}
		if !strings.HasPrefix(lines[0], "OP ") || !slices.Equal(ops, c.want) {
			t.Fatalf("%s printed %d lines, %d operations; want a header and %d operations, in List's order", c.args, len(lines), len(ops), len(c.want))
		}
		wantPages(t, strings.Join(c.args, " "), rec.lists(), pageSize, len(c.want)/pageSize+1, c.want)
	}

	code, out, errOut := idemctl("--jar", path, "export", "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("export: exit %d, %s", code, errOut)
	}
	wantPages(t, "export", rec.lists(), pageSize, n/pageSize+1, all)
	var exp []exported
	if err := json.Unmarshal([]byte(out), &exp); err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, e := range exp {
		ops = append(ops, e.Op)
	}
	if !slices.Equal(ops, all) {
		t.Fatalf("export holds %d operations; want the %d in List's order", len(ops), n)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(exp); err != nil {
		t.Fatal(err)
	}
	if buf.String() != out {
		t.Fatalf("export is not what json.Encoder writes for the array; it begins:\n%.300s", out)
	}
}

// TestResumeAllInPages: resume --all reads the pending operations in pages
// (of 2 here), twice: first their hosts and methods, then to resume them,
// up to the last the first walk read. An operation pending since, after
// that one, is left for the next resume; one before it, to another host
// than the one the headers were checked for, is not sent.
func TestResumeAllInPages(t *testing.T) {
	eachJar(t, func(t *testing.T, srv *server, spec string) {
		ctx := context.Background()
		setPageSize(t, 2)
		j, closeJar, err := openJar(ctx, spec, time.Second, false)
		if err != nil {
			t.Fatal(err)
		}
		begin := func(op, url string, created time.Time) { // never sent: its fingerprint is not its request's
			t.Helper()
			r := idem.Record{Op: op, Key: "key-" + op, Fingerprint: "fp", State: idem.StatePending, Method: "POST", URL: url,
				Created: created, Updated: created, Attempts: 1}
			if _, _, err := j.Begin(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		// After fill's charge:p1 and charge:p2, sent as they were.
		c, err := client.New(ctx, "", &client.Options{Jar: j, Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"charge:q1", "charge:q2", "charge:q3"} {
			if _, err := c.PostJSON(ctx, op, srv.URL+"/v1/charges", map[string]int{"amount": 1}, nil); !errors.Is(err, idem.ErrPending) {
				t.Fatalf("seeding %s: %v; want pending", op, err)
			}
			// Get waits for the release the call deferred: idemctl, another
			// process, would otherwise find the lease still held.
			if _, err := j.Get(ctx, op); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		rec := recordLists(t)
		rec.before = func(n int) {
			if n == 3 { // the second walk's first List, after pages of 2, 2 and 1
				begin("charge:late", srv.URL+"/v1/charges", time.Now().Add(time.Minute))
				begin("hook:early", "http://hooks.example/v1/hooks", now.Add(-time.Hour))
			}
		}
		code, out, errOut := idemctl("--jar", spec, "resume", "--all", "--header", "Authorization: "+secret, "--host", srv.URL)
		var resumed []string
		for line := range strings.Lines(out) {
			if op, _, ok := strings.Cut(line, ": 201 Created"); ok {
				resumed = append(resumed, op)
			}
		}
		want := []string{"charge:p1", "charge:p2", "charge:q1", "charge:q2", "charge:q3"}
		if code != 1 || !slices.Equal(resumed, want) || len(srv.keys) != len(want) ||
			errOut != "idemctl: hook:early: not sent: it goes to http://hooks.example, not to "+srv.URL+" (--host), which the headers are for; resume it by name with its own host's --host and headers\n" {
			t.Fatalf("resume --all: exit %d, resumed %v, %d requests, stderr %q; want exit 1, %v resumed, and hook:early not sent",
				code, resumed, len(srv.keys), errOut, want)
		}
		filters := rec.lists()
		wantPages(t, "the first walk", filters[:3], 2, 3, want)
		wantPages(t, "the second walk", filters[3:], 2, 4, append([]string{"hook:early"}, want...))
		for _, op := range []string{"charge:late", "hook:early"} {
			if r, err := j.Get(ctx, op); err != nil || r.State != idem.StatePending || r.Attempts != 1 {
				t.Errorf("%s after resume --all: %+v, %v; want it pending, not sent", op, r, err)
			}
		}
		if err := closeJar(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestJarThatDoesNotPage: a jar whose List ignores After (one of a
// program's own, written before it) would give list, export and resume
// --all its first page for ever: they stop at the second, and say why.
func TestJarThatDoesNotPage(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	setPageSize(t, 2)
	wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
		return pageIgnored{j}, closeJar
	})
	for _, args := range [][]string{{"list"}, {"export"}, {"resume", "--all"}} {
		code, _, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		wantError(t, code, errOut, 1, "idemctl: this jar (main.pageIgnored): it cannot be read in pages")
	}
	if len(srv.keys) != 0 {
		t.Fatalf("resume --all sent %d requests; want none", len(srv.keys))
	}
}

// pageIgnored is a jar whose List ignores Filter.After.
type pageIgnored struct{ client.Jar }

func (j pageIgnored) List(ctx context.Context, f idem.Filter) ([]idem.Record, error) {
	f.After = idem.Cursor{}
	return j.Jar.List(ctx, f)
}

// TestURLWithAtInPathPrintedAsItIs: a stored URL that parses is shown
// with only its userinfo's password masked, as url.URL.Redacted writes it.
// MaskPasswords, made for free text, takes the port of a URL with an '@'
// in its path for the start of a password, and show and export
// printed "api:xxxxx@b" for a request that holds no password at all.
func TestURLWithAtInPathPrintedAsItIs(t *testing.T) {
	const plain = "https://api.example.com:8443/users/a@b"
	const withUser = "https://ops:s3cretPW@api.example.com:8443/users/a@b"
	now := time.Now()
	var recs []idem.Record
	for i, u := range []string{plain, withUser} {
		fp := sha256.Sum256([]byte(u))
		recs = append(recs, idem.Record{Op: fmt.Sprintf("charge:o%d", i), Key: fmt.Sprintf("key-%d", i),
			Fingerprint: hex.EncodeToString(fp[:]), State: idem.StatePending, Method: "POST", URL: u,
			Created: now, Updated: now})
	}
	path := jarWith(t, recs...)
	for _, cmd := range [][]string{{"show", "charge:o0"}, {"show", "charge:o1"}, {"export"}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, cmd...)...)
		want := plain
		if cmd[0] == "show" && cmd[1] == "charge:o1" {
			want = "https://ops:xxxxx@api.example.com:8443/users/a@b"
		}
		if code != 0 || !strings.Contains(out, want) || strings.Contains(out, "s3cretPW") {
			t.Errorf("idemctl %s: exit %d, stderr %q, stdout:\n%s\nwant %q printed as it is", cmd, code, errOut, out, want)
		}
	}
}

// TestURLQuerySecretsMasked: show and export print the values of a stored
// URL's query parameters that name a secret (a password, as a PostgreSQL
// URL's password= and sslpassword=, an API key, a token) as xxxxx, in the
// URL and where its last error quotes it (list too), as they print its
// userinfo's password; the other parameters as they are.
func TestURLQuerySecretsMasked(t *testing.T) {
	const u = "https://ops:PW1@api.example.com/v1/charges?api_key=SECRET2&password=SECRET3&sslpassword=SECRET4&access_token=SECRET5&order=o1"
	const want = "https://ops:xxxxx@api.example.com/v1/charges?api_key=xxxxx&password=xxxxx&sslpassword=xxxxx&access_token=xxxxx&order=o1"
	now := time.Now()
	fp := sha256.Sum256([]byte(u))
	path := jarWith(t, idem.Record{Op: "charge:o1", Key: "key-1", Fingerprint: hex.EncodeToString(fp[:]), State: idem.StatePending,
		Method: "POST", URL: u, Created: now, Updated: now, Attempts: 1, LastError: `Post "` + u + `": EOF`})
	for _, cmd := range [][]string{{"show", "charge:o1"}, {"export"}, {"list"}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, cmd...)...)
		if code != 0 || strings.Contains(out, "PW1") || strings.Contains(out, "SECRET") {
			t.Errorf("idemctl %s: exit %d, stderr %q, stdout:\n%s\nwant every secret of the URL masked", cmd, code, errOut, out)
		}
		printed := want
		if cmd[0] == "export" {
			printed = strings.ReplaceAll(want, "&", `\u0026`) // as encoding/json writes it
		}
		if n := strings.Count(out, printed); cmd[0] != "list" && n != 2 { // list cuts the last error short
			t.Errorf("idemctl %s: stdout:\n%s\nwant %q, in the URL and in the last error", cmd, out, printed)
		}
	}
}

// TestListPrintsLongNamesWhole: two operations whose names share their
// first 70 runes are listed each under its whole name, which show and
// abandon take back: a name cut at a width would print both alike.
func TestListPrintsLongNamesWhole(t *testing.T) {
	now := time.Now()
	prefix := "charge:" + strings.Repeat("é", 63) // 70 runes
	rec := func(op string, i int) idem.Record {
		return idem.Record{Op: op, Key: fmt.Sprint("key-", i), Fingerprint: "fp", State: idem.StatePending,
			Method: "POST", URL: "http://127.0.0.1/v1/charges", Created: now.Add(time.Duration(i) * time.Second), Updated: now}
	}
	a, b := prefix+":order-1", prefix+":order-2"
	path := jarWith(t, rec(a, 1), rec(b, 2))
	code, out, errOut := idemctl("--jar", path, "list")
	if code != 0 || errOut != "" {
		t.Fatalf("list: exit %d, stderr %q", code, errOut)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		names = append(names, strings.Fields(l)[0])
	}
	if want := []string{a, b}; !slices.Equal(names, want) {
		t.Fatalf("list printed the names %q; want %q:\n%s", names, want, out)
	}
	if code, out, errOut := idemctl("--jar", path, "abandon", names[0], "--reason", "checked the ledger"); code != 0 {
		t.Fatalf("abandon of the name list printed: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for op, want := range map[string]idem.State{a: idem.StateAbandoned, b: idem.StatePending} {
		if r, err := jarState(t, path, op); err != nil || r.State != want {
			t.Errorf("after abandon of %q, %q is %s (%v); want %s", names[0], op, r.State, err, want)
		}
	}
}

// TestWriteCommandsDoNotUpgradeAnOlderJar: resume, abandon, forget and
// prune of a jar of schema version 1 say that idemctl does not upgrade it,
// naming its version, and write nothing, as for a PostgreSQL jar: after an
// upgrade, the program built with the earlier version of idem that uses
// the jar refuses it. Before, they upgraded it.
func TestWriteCommandsDoNotUpgradeAnOlderJar(t *testing.T) {
	path := seed(t, newServer(t))
	db := toVersion1(t, path)
	before := written(t, path)
	for _, args := range [][]string{{"resume", "charge:p1"}, {"abandon", "--reason", "refunded", "charge:p1"}, {"forget", "charge:p1"}, {"prune", "--older-than", "1h"}} {
		code, out, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		wantError(t, code, errOut, 1, path+" holds a key jar of an older schema version: version 1, which idemctl does not upgrade, nothing written")
		if out != "" {
			t.Errorf("%q of a version 1 jar printed %q; want nothing", args, out)
		}
	}
	if after := written(t, path); !maps.Equal(after, before) {
		t.Errorf("the jar file or its -wal file changed: %q, were %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
	var version int
	if err := db.QueryRow("PRAGMA user_version").Scan(&version); err != nil || version != 1 {
		t.Errorf("the jar's user_version is %d (%v); want 1", version, err)
	}
}

// toVersion1 makes the jar at path one of schema version 1, which is
// version 2 without its index, through a connection that stays open until
// the test ends, as a program that has the jar open: its -wal and -shm
// files stay too.
func toVersion1(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("DROP INDEX operations_by_state_created; PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestReadCommandsDoNotUpgradeAnOlderJar: list, show and export of a jar of
// schema version 1, which an open for writing upgrades (after which a
// program built with the earlier version refuses it), read it as it is
// while its -wal and -shm files are there (a program has it open), and
// otherwise (its program closed it) say that the jar has an older schema
// version; either way they write nothing, by a user who may write it.
func TestReadCommandsDoNotUpgradeAnOlderJar(t *testing.T) {
	for _, open := range []bool{true, false} {
		t.Run(fmt.Sprint("in use ", open), func(t *testing.T) {
			path := seed(t, newServer(t))
			db := toVersion1(t, path)
			if !open {
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
				if got := dirNames(t, filepath.Dir(path)); !slices.Equal(got, []string{"keys.db"}) {
					t.Fatalf("the closed jar's directory holds %q; want the jar alone", got)
				}
			}
			before := written(t, path)
			for _, args := range [][]string{{"list"}, {"list", "--status", "pending"}, {"show", "charge:p1"}, {"export"}} {
				code, out, errOut := idemctl(append([]string{"--jar", path}, args...)...)
				if open {
					if code != 0 || errOut != "" || !strings.Contains(out, "charge:p1") {
						t.Errorf("%q of a version 1 jar in use: exit %d, stderr %q, stdout %q; want charge:p1 read", args, code, errOut, out)
					}
					continue
				}
				wantError(t, code, errOut, 1, path+": the jar has an older schema version and its -wal and -shm files are missing")
				for _, want := range []string{"nothing written", "the idemctl of that version"} {
					if !strings.Contains(errOut, want) {
						t.Errorf("%q of a version 1 jar: %q; want it to say %q", args, errOut, want)
					}
				}
				if out != "" {
					t.Errorf("%q of a version 1 jar printed %q; want nothing", args, out)
				}
			}
			if after := written(t, path); !maps.Equal(after, before) {
				t.Errorf("the jar file or its -wal file changed: %q, were %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
			}
			if !open {
				var err error
				db, err = sql.Open("sqlite", "file:"+path)
				if err != nil {
					t.Fatal(err)
				}
			}
			var version int
			if err := db.QueryRow("PRAGMA user_version").Scan(&version); err != nil || version != 1 {
				t.Errorf("the jar's user_version is %d (%v); want 1", version, err)
			}
		})
	}
}

// written returns the bytes of the jar file at path and of its -wal file,
// when it has one: what a write changes. (A reader changes the -shm file,
// where SQLite keeps its read marks.)
func written(t *testing.T, path string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, p := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) && p != path {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		m[filepath.Base(p)] = string(b)
	}
	return m
}

// TestAbandonOfAnAbandonedOperation: abandon of an operation abandoned
// already changes nothing, its note included, and says so with the reason
// it was abandoned for, rather than let the new one seem recorded; so too
// when another process abandons it while abandon runs.
func TestAbandonOfAnAbandonedOperation(t *testing.T) { eachJar(t, testAbandonOfAnAbandonedOperation) }

func testAbandonOfAnAbandonedOperation(t *testing.T, _ *server, path string) {
	const first = "ledger shows no charge"
	if code, out, errOut := idemctl("--jar", path, "abandon", "charge:reconcile", "--reason", first); code != 0 {
		t.Fatalf("abandon: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut := idemctl("--jar", path, "abandon", "charge:reconcile", "--reason", "checked twice")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "charge:reconcile: already abandoned") ||
		!strings.Contains(out, "note "+first) || !strings.Contains(out, "the reason given was not recorded") {
		t.Errorf("abandon again: exit %d, stdout %q, stderr %q; want it to say it was already abandoned, for %q, and the new reason not recorded", code, out, errOut, first)
	}
	if r, err := jarState(t, path, "charge:reconcile"); err != nil || r.State != idem.StateAbandoned || r.Note != first {
		t.Errorf("after abandon again: %s %q (%v); want abandoned with the first reason", r.State, r.Note, err)
	}
	// Abandoned by another process between abandon's read and its lease.
	wrapOpenedJar(t, func(j client.Jar, closeJar func() error) (client.Jar, func() error) {
		return abandonedMeanwhile{j}, closeJar
	})
	code, out, errOut = idemctl("--jar", path, "abandon", "charge:p1", "--reason", "checked the ledger")
	if code != 0 || !strings.HasPrefix(out, "charge:p1: already abandoned") || !strings.Contains(out, "note by another process") {
		t.Errorf("abandon of one abandoned meanwhile: exit %d, stdout %q, stderr %q; want it said already abandoned, by the other's reason", code, out, errOut)
	}
}

// abandonedMeanwhile is a jar whose Acquire finds the operation abandoned
// by another process, with its own reason, since it was read.
type abandonedMeanwhile struct{ client.Jar }

func (j abandonedMeanwhile) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	if _, err := j.Jar.Update(ctx, op, "", idem.Change{Now: now, State: idem.StateAbandoned, Note: "by another process", Release: true}); err != nil {
		return idem.Record{}, err
	}
	return j.Jar.Acquire(ctx, op, holder, now, ttl)
}

// TestReadOnlyFileSystem: a jar file on a read-only file system, which
// keyjar's Open for writing refuses with an error matching both
// fs.ErrPermission and syscall.EROFS, is said to be on a read-only file
// system, not to need another user: by the commands that write, and by
// list when its -wal and -shm files are missing, which only an open for
// writing creates. list of one with its -wal and -shm files reads it.
func TestReadOnlyFileSystem(t *testing.T) {
	path := seed(t, newServer(t))
	real := openKeyjar
	t.Cleanup(func() { openKeyjar = real })
	openKeyjar = func(ctx context.Context, path string, opts *keyjar.Options) (*keyjar.Jar, error) {
		if opts != nil && opts.ReadOnly {
			return real(ctx, path, opts)
		}
		// As keyjar's Open fails where os.OpenFile(path, O_RDWR) does.
		return nil, fmt.Errorf("keyjar: open %s: %w: %w", path, fs.ErrPermission, &fs.PathError{Op: "open", Path: path, Err: syscall.EROFS})
	}
	if code, out, errOut := idemctl("--jar", path, "list"); code != 0 || errOut != "" || !strings.Contains(out, "charge:p1") {
		t.Fatalf("list: exit %d, stdout %q, stderr %q; want it listed", code, out, errOut)
	}
	wantReadOnlyFS := func(args ...string) {
		t.Helper()
		code, _, errOut := idemctl(append([]string{"--jar", path}, args...)...)
		wantError(t, code, errOut, 1, path+": the file system it is on is read-only (EROFS)")
		if strings.Contains(errOut, "as a user who may") || strings.Contains(errOut, "permission denied") {
			t.Errorf("%s on a read-only file system: %q; want no advice to change users", args[0], errOut)
		}
	}
	wantReadOnlyFS("abandon", "charge:p1", "--reason", "no charge")
	wantReadOnlyFS("prune", "--older-than", "720h")
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	wantReadOnlyFS("list")
}

// TestDashNameHint: list prints a name that begins with "-" as it is, and
// the flag package takes such an argument for a flag: the usage error of a
// command that takes a name says to give it after "--", as the usage does.
func TestDashNameHint(t *testing.T) {
	jar := filepath.Join(t.TempDir(), "missing.db")
	for _, cmd := range [][]string{{"show", "-charge:1"}, {"forget", "--all"}, {"abandon", "-x", "--reason", "r"}, {"resume", "-x"}} {
		code, _, errOut := idemctl(append([]string{"--jar", jar}, cmd...)...)
		if code != 2 || !strings.Contains(errOut, "flag provided but not defined") || !strings.Contains(errOut, `begins with "-" goes after --`) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and the hint to give the name after --", cmd, code, errOut)
		}
	}
	// list takes no name: no hint.
	if code, _, errOut := idemctl("--jar", jar, "list", "-x"); code != 2 || strings.Contains(errOut, "goes after --") {
		t.Errorf("list -x: exit %d, stderr %q; want exit 2, no hint", code, errOut)
	}
	if !strings.Contains(usage, "--") || !strings.Contains(usage, `begins with "-"`) {
		t.Errorf("the usage does not say that a name that begins with \"-\" goes after --")
	}
}
