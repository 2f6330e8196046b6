package client_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// The test binary is re-run as a client process that makes one call and
// stops at a named point of it, for the parent to kill: see crashProcess.
const (
	envCrashAt  = "IDEM_CLIENT_TEST_CRASH_AT"  // the point: begun, reading, read or backoff
	envCrashURL = "IDEM_CLIENT_TEST_CRASH_URL" // the server; the jar is envJar
)

// crashOp is the operation the crash processes send.
const crashOp = "charge:o1"

// crashBound is the longest the crash test waits for any one step: a step
// that takes longer fails the test.
const crashBound = 30 * time.Second

// crashProcess opens the jar file at path and sends crashOp to url, and
// stops where point says, printing "at <point> …" on stdout, until it is
// killed:
//
//	begun: once the jar's Begin returned, before anything is sent; it
//	       prints the key.
//	reading: in the connection's first read, which never ends: the
//	       request is sent, the answer never read.
//	read: once the call returned and its answer was read, while the jar
//	       cannot commit the outcome that the Transport deferred (another
//	       connection holds the file's write lock); it prints the charge.
//	backoff: in the wait before a retry, an hour long, once the retry's
//	       record is written.
//
// At any other point the process runs the call and, killed nowhere, says so
// on stderr with exit status 1.
func crashProcess(point, path, url string) int {
	ctx := context.Background()
	j, err := keyjar.Open(ctx, path, &keyjar.Options{BusyTimeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts := &client.Options{
		Jar:    &crashJar{Jar: j, point: point, path: path},
		Header: withAuth,
		Policy: retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, NoJitter: true, MaxElapsed: 2 * time.Hour},
	}
	switch point {
	case "reading":
		opts.Base = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return unreadConn{conn}, nil
		}}
	case "backoff":
		opts.Hooks.OnRetry = func(e idem.Event) {
			// The Transport deferred the retry's record (its status, its
			// next attempt time): a Get waits until it is written, as a
			// wait of an hour would.
			if _, err := j.Get(ctx, e.Op); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Println("at backoff")
		}
	}
	c, err := client.New(ctx, "", opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var out charge
	_, err = c.PostJSON(ctx, crashOp, url+"/charges", chargeReq{Order: "o1", Amount: 100}, &out)
	if err == nil && point == "read" {
		hold("read " + out.ID)
	}
	fmt.Fprintf(os.Stderr, "the call returned (%v) although the process was to stop %s\n", err, point)
	return 1
}

// hold prints "at " and what, and waits until it is killed. It exits, with
// status 3, when stdin ends first: the parent is gone.
func hold(what string) {
	fmt.Println("at " + what)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}

// crashJar stops the process at the points that are the jar's: after
// Begin, and with the outcome deferred but not written.
type crashJar struct {
	*keyjar.Jar
	point, path string
}

func (j *crashJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	rec, created, err := j.Jar.Begin(ctx, r)
	if err == nil && j.point == "begun" {
		hold("begun " + rec.Key)
	}
	return rec, created, err
}

func (j *crashJar) Defer(op, holder string, ch idem.Change) error {
	if j.point == "read" && ch.State == idem.StateDone {
		// Another connection takes the file's write lock and keeps it: the
		// jar's committer waits for it (BusyTimeout, a minute), and the
		// outcome stays queued, unwritten, until the process is killed.
		db, err := sql.Open("sqlite", "file:"+j.path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
		if err == nil {
			_, err = db.Begin()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "locking the jar:", err)
			os.Exit(2)
		}
	}
	return j.Jar.Defer(op, holder, ch)
}

// unreadConn is a connection whose reads never return: what the server
// answers is never read.
type unreadConn struct{ net.Conn }

func (unreadConn) Read([]byte) (int, error) {
	hold("reading")
	return 0, io.EOF
}

// crashServer is the server of the crash test: the testserver Middleware
// over a handler that charges, counting its runs per key.
type crashServer struct {
	mw          *testserver.Middleware
	hold        bool // the first run waits for release before it answers
	unavailable bool // the first request of each key is answered 503, not run

	running     chan struct{} // closed once the first run has charged (hold)
	release     chan struct{}
	releaseOnce sync.Once
	answered    chan struct{} // closed once the first keyed request is answered
	once        sync.Once

	mu   sync.Mutex
	keys []string       // the key of every keyed request
	runs map[string]int // the handler's charges per key
	seen map[string]bool
}

func newCrashServer() *crashServer {
	return &crashServer{mw: &testserver.Middleware{Store: &testserver.MemoryStore{}},
		running: make(chan struct{}), release: make(chan struct{}), answered: make(chan struct{}),
		runs: map[string]int{}, seen: map[string]bool{}}
}

func (s *crashServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idem.KeyHeader)
	if key == "" {
		return // resumeProcess's notice that the operation is leased
	}
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	s.mw.Wrap(http.HandlerFunc(s.charge)).ServeHTTP(w, r)
	http.NewResponseController(w).Flush()
	s.once.Do(func() { close(s.answered) })
}

func (s *crashServer) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idem.KeyHeader)
	s.mu.Lock()
	if s.unavailable && !s.seen[key] {
		s.seen[key] = true
		s.mu.Unlock()
		http.Error(w, "the processor is unavailable", http.StatusServiceUnavailable)
		return
	}
	s.runs[key]++
	n := s.runs[key]
	s.mu.Unlock()
	if s.hold && n == 1 {
		close(s.running)
		select {
		case <-s.release:
		case <-time.After(crashBound):
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(charge{ID: fmt.Sprint("ch_", n), Order: "o1", Amount: 100})
}

// unblock lets the held run answer.
func (s *crashServer) unblock() { s.releaseOnce.Do(func() { close(s.release) }) }

// seenKeys returns the key of every keyed request so far, and the
// handler's charges per key.
func (s *crashServer) seenKeys() ([]string, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	runs := map[string]int{}
	for k, n := range s.runs {
		runs[k] = n
	}
	return append([]string(nil), s.keys...), runs
}

// crashChild is a crash process, its stdout line by line.
type crashChild struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr bytes.Buffer
}

func startCrashChild(t *testing.T, point, path, url string) *crashChild {
	t.Helper()
	c := &crashChild{cmd: exec.Command(os.Args[0], "-test.run=^$"), lines: make(chan string, 16)}
	c.cmd.Env = append(os.Environ(), envCrashAt+"="+point, envJar+"="+path, envCrashURL+"="+url)
	c.cmd.Stderr = &c.stderr
	stdin, err := c.cmd.StdinPipe() // held open: the child waits on it
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	return c
}

// at waits until the child prints "at <point>" and returns the rest of
// that line.
func (c *crashChild) at(t *testing.T, point string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.cmd.Wait()
			t.Fatalf("the child ended before it reached %s: %v\n%s", point, c.cmd.ProcessState, c.stderr.String())
		}
		rest, found := strings.CutPrefix(line, "at "+point)
		if !found {
			t.Fatalf("the child says %q; want at %s", line, point)
		}
		return strings.TrimSpace(rest)
	case <-time.After(crashBound):
		t.Fatalf("the child did not reach %s within %v", point, crashBound)
	}
	return ""
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(crashBound):
		t.Fatalf("%s did not happen within %v", what, crashBound)
	}
}

// A client process is killed with SIGKILL at each point of one call, where
// it waits to be killed, and a new process resumes the operation from the
// same jar file. Each time the operation ends done under the key the jar
// held after the kill, the only key the server saw, and the server ran it
// exactly once.
func TestKilledAtEachPointResumes(t *testing.T) {
	for _, tc := range []struct {
		point       string
		hold        bool // the server holds the first run's answer until after the kill
		unavailable bool // the server answers the first request 503
		reached     func(t *testing.T, c *crashChild, s *crashServer) (key string)
		sentBefore  int  // requests the server had from the killed process
		ranBefore   bool // the server ran the operation before the kill
		replayed    bool // the resume gets the saved answer
	}{{
		// After Begin returned (the key is durable), before any byte is sent.
		point:   "begun",
		reached: func(t *testing.T, c *crashChild, s *crashServer) string { return c.at(t, "begun") },
	}, {
		// The request in flight: the server ran it and has not answered.
		point: "in flight",
		hold:  true,
		reached: func(t *testing.T, c *crashChild, s *crashServer) string {
			waitFor(t, s.running, "the server's run")
			return ""
		},
		sentBefore: 1, ranBefore: true, replayed: true,
	}, {
		// The server ran it and answered; the client never read the answer.
		point: "reading",
		reached: func(t *testing.T, c *crashChild, s *crashServer) string {
			c.at(t, "reading")
			waitFor(t, s.answered, "the server's answer")
			return ""
		},
		sentBefore: 1, ranBefore: true, replayed: true,
	}, {
		// The answer was read, the outcome (done) deferred and not written.
		point: "read",
		reached: func(t *testing.T, c *crashChild, s *crashServer) string {
			if got := c.at(t, "read"); got != "ch_1" {
				t.Fatalf("the killed process read charge %q; want ch_1", got)
			}
			return ""
		},
		sentBefore: 1, ranBefore: true, replayed: true,
	}, {
		// In the backoff wait after a 503.
		point:       "backoff",
		unavailable: true,
		reached:     func(t *testing.T, c *crashChild, s *crashServer) string { c.at(t, "backoff"); return "" },
		sentBefore:  1,
	}} {
		t.Run(tc.point, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			s := newCrashServer()
			s.hold, s.unavailable = tc.hold, tc.unavailable
			srv := httptest.NewServer(s)
			defer srv.Close()
			defer s.unblock()

			c := startCrashChild(t, tc.point, path, srv.URL)
			begun := tc.reached(t, c, s)
			if err := c.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			c.cmd.Wait()
			if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the process ended with %v, not killed; stderr:\n%s", c.cmd.ProcessState, c.stderr.String())
			}
			if tc.hold {
				s.unblock()
				waitFor(t, s.answered, "the server's answer to the killed process")
			}

			// The key survived the kill, pending, and is the one sent.
			rec := jarRecord(t, path)
			keys, runs := s.seenKeys()
			if rec.State != idem.StatePending || begun != "" && rec.Key != begun {
				t.Fatalf("after the kill the jar holds %s under key %q; want it pending under %q", rec.State, rec.Key, begun)
			}
			ran := runs[rec.Key] == 1
			if len(keys) != tc.sentBefore || len(runs) > 1 || ran != tc.ranBefore {
				t.Fatalf("before the restart the server had keys %q, runs %v; want %d requests, ran %v, under %q",
					keys, runs, tc.sentBefore, tc.ranBefore, rec.Key)
			}

			// A new process resumes it from the same file.
			ctx, cancel := context.WithTimeout(context.Background(), crashBound)
			defer cancel()
			resume := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			resume.Env = append(os.Environ(), envJar+"="+path, envOp+"="+crashOp, envNotify+"="+srv.URL+"/leased",
				// Under -race, a process that exits waits a second for
				// other threads' reports first: not this one's.
				"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
			var stderr bytes.Buffer
			resume.Stderr = &stderr
			out, err := resume.Output()
			if err != nil {
				t.Fatalf("resume: %v\n%s", err, stderr.String())
			}
			if want := fmt.Sprintf("status 201 key %s replayed %v\n", rec.Key, tc.replayed); string(out) != want {
				t.Fatalf("the resume printed %q; want %q", out, want)
			}

			after := jarRecord(t, path)
			keys, runs = s.seenKeys()
			if after.State != idem.StateDone || after.Key != rec.Key {
				t.Errorf("after the resume the jar holds %s under key %q; want done under %q", after.State, after.Key, rec.Key)
			}
			for _, k := range keys {
				if k != rec.Key {
					t.Errorf("the server saw keys %q; want only %q", keys, rec.Key)
					break
				}
			}
			if len(runs) != 1 || runs[rec.Key] != 1 {
				t.Errorf("the server ran %v; want %q once", runs, rec.Key)
			}
		})
	}
}

// jarRecord returns crashOp's record in the jar file at path, opened and
// closed for the read, as a restarted program would.
func jarRecord(t *testing.T, path string) idem.Record {
	t.Helper()
	j, err := keyjar.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	rec, err := j.Get(t.Context(), crashOp)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
