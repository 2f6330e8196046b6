package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// The test binary is re-run as a helper process that resumes one
// operation: see resumeProcess.
const (
	envJar    = "IDEM_CLIENT_TEST_RESUME_JAR"
	envOp     = "IDEM_CLIENT_TEST_RESUME_OP"
	envNotify = "IDEM_CLIENT_TEST_RESUME_NOTIFY"
)

func TestMain(m *testing.M) {
	if point := os.Getenv(envCrashAt); point != "" {
		os.Exit(crashProcess(point, os.Getenv(envJar), os.Getenv(envCrashURL)))
	}
	if path := os.Getenv(envJar); path != "" {
		os.Exit(resumeProcess(path, os.Getenv(envOp), os.Getenv(envNotify)))
	}
	pgtest.Main(m)
}

// resumeProcess opens the jar file at path and resumes op. When the jar
// finds op leased by another holder, it tells the server at notify (once).
// It prints "status <code> key <key> replayed <bool>", or "not sent: <error>"
// when Resume returns ErrState, and returns the exit status.
func resumeProcess(path, op, notify string) int {
	ctx := context.Background()
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer j.Close()
	c, err := client.New(ctx, "", &client.Options{
		Jar:    &notifyingJar{Jar: j, notify: notify},
		Header: withAuth,
		Policy: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, MaxElapsed: 20 * time.Second},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	resp, err := c.Resume(ctx, op)
	if errors.Is(err, client.ErrState) {
		fmt.Printf("not sent: %v\n", err)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	resp.Body.Close()
	fmt.Printf("status %d key %s replayed %v\n", resp.StatusCode, resp.Key, resp.Replayed)
	return 0
}

// notifyingJar tells the test server, once, that the jar refused it the
// lease: the other process is sending.
type notifyingJar struct {
	client.Jar
	notify string
	once   sync.Once
}

func (j *notifyingJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	r, err := j.Jar.Acquire(ctx, op, holder, now, ttl)
	if errors.Is(err, idem.ErrLeased) {
		j.once.Do(func() {
			if resp, err := http.Get(j.notify); err == nil {
				resp.Body.Close()
			}
		})
	}
	return r, err
}

// Two processes resume one operation at once: the jar's lease lets one
// send at a time, so the server never sees the client race itself, and the
// one that waited for the lease finds the operation done and sends nothing.
func TestTwoProcessesResumeOneAtATime(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")

	var (
		inFlight, maxInFlight, charged atomic.Int64
		mu                             sync.Mutex
		keys                           []string
	)
	leased := make(chan struct{})
	var leasedOnce sync.Once
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	charge := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charged.Add(1)
		// Hold the first send until the other process has tried to send too.
		select {
		case <-leased:
		case <-time.After(30 * time.Second):
			t.Errorf("the second process never found the operation leased")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/leased" {
			leasedOnce.Do(func() { close(leased) })
			return
		}
		mu.Lock()
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		mu.Unlock()
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		charge.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// The first run died with the operation pending: the server was unreachable.
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(ctx, path, &client.Options{Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PostJSON(ctx, "charge:o1", srv.URL+"/charges", chargeReq{Order: "o1", Amount: 100}, nil); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first run: %v; want pending", err)
	}
	rec, _ := c.Jar().Get(ctx, "charge:o1")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	var outs [2]strings.Builder
	var errs [2]strings.Builder
	var cmds [2]*exec.Cmd
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envJar+"="+path, envOp+"=charge:o1", envNotify+"="+srv.URL+"/leased")
		cmd.Stdout, cmd.Stderr = &outs[i], &errs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v: %s", i, err, errs[i].String())
		}
	}

	select {
	case <-leased:
	default:
		t.Fatal("no process found the operation leased: the two resumes did not overlap")
	}
	if m := maxInFlight.Load(); m != 1 {
		t.Fatalf("the server saw %d sends of the operation at once; want 1", m)
	}
	if st := mw.Stats(); st.Conflicts != 0 || st.Claims != 1 || charged.Load() != 1 {
		t.Fatalf("server stats %+v, handler ran %d times; want no 409, one claim, one run", st, charged.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 1 || keys[0] != rec.Key {
		t.Fatalf("keys sent %q; want the stored key %q once", keys, rec.Key)
	}
	got := []string{outs[0].String(), outs[1].String()}
	sent := "status 201 key " + rec.Key + " replayed false\n"
	if got[0] != sent {
		got[0], got[1] = got[1], got[0]
	}
	if got[0] != sent || !strings.HasPrefix(got[1], "not sent: ") || !strings.Contains(got[1], "is done") {
		t.Fatalf("the processes printed %q; want %q from one and, from the other, that the operation is done and was not sent", got, sent)
	}
}
