package keyjar_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/resume"
	"github.com/idemkit/idem/internal/unwritten"
	"github.com/idemkit/idem/keyjar"
)

// lockedJar opens a new jar file with a BusyTimeout of 20 s, and holds
// its write lock from another connection, as another process would, until
// unlock (which may be called more than once).
func lockedJar(t *testing.T) (path string, j *keyjar.Jar, unlock func()) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	j, err := keyjar.Open(context.Background(), path, &keyjar.Options{BusyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return path, j, lockFile(t, path, false)
}

// TestWithdrawnWritesStopWaitingForLock: while another process holds the
// write lock, a write whose caller's context ends returns at once, and the
// committer stops waiting for the lock once no caller waits for its batch:
// Close then returns without waiting out BusyTimeout, and nothing changed.
// A write whose caller still waits is not given up (TestLockedWrite...).
func TestWithdrawnWritesStopWaitingForLock(t *testing.T) {
	path, j, unlock := lockedJar(t)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := j.Forget(ctx, "op"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Forget while locked, its context ending: %v; want the context's error", err)
	}
	err := j.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Forget and Close took %v (Close: %v): want the committer to stop waiting for the lock once the caller left", took.Round(time.Millisecond), err)
	}
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	unlock()
	j, err = keyjar.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if r, err := j.Get(context.Background(), "op"); err != nil || r.State != idem.StatePending {
		t.Fatalf("op after the withdrawn Forget: %+v, %v; want it as it was", r, err)
	}
}

// TestCallInterruptedWhileLockedLeavesNothingToWrite: a Transport call
// whose context ends while another process holds the jar's write lock, as
// it begins a new operation or as a resume takes the lease, has its write
// withdrawn, unwritten, and defers no release of a lease it never took:
// Close then has nothing to write and returns at once, without error,
// rather than wait out BusyTimeout for a release fenced to nothing and
// report it dropped.
func TestCallInterruptedWhileLockedLeavesNothingToWrite(t *testing.T) {
	for _, resuming := range []bool{false, true} {
		t.Run(map[bool]string{false: "Begin", true: "resume's Acquire"}[resuming], func(t *testing.T) {
			_, j, unlock := lockedJar(t)
			defer unlock()
			sent := 0
			tr := &idem.Transport{Jar: j, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				sent++
				return nil, errors.New("not reached")
			})}
			ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op"), 200*time.Millisecond)
			defer cancel()
			if resuming {
				ctx = resume.Mark(ctx, "key-op")
			} else {
				ctx = idem.WithOperation(ctx, "new")
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/charge", strings.NewReader(`{}`))
			start := time.Now()
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, context.DeadlineExceeded) || sent != 0 {
				t.Fatalf("RoundTrip while locked: %v after %d sends; want the context's error, nothing sent", err, sent)
			}
			err = j.Close()
			if took := time.Since(start); took > 5*time.Second || err != nil {
				t.Fatalf("RoundTrip and Close took %v, Close: %v; want Close to return at once, without error: nothing to write", took.Round(time.Millisecond), err)
			}
		})
	}
}

// TestWithdrawnWriteIsMarkedUnwritten: an Acquire withdrawn as its
// context ends while the jar is locked says so (internal/unwritten), for
// the Transport, which then has no lease to give back.
func TestWithdrawnWriteIsMarkedUnwritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	j, err := keyjar.Open(context.Background(), path, &keyjar.Options{BusyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	unlock := lockFile(t, path, false)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = j.Acquire(ctx, "op", "h", time.Now(), time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || !unwritten.Is(err) {
		t.Fatalf("Acquire while locked, its context ending: %v (unwritten: %v); want the context's error, marked unwritten", err, unwritten.Is(err))
	}
	if _, err := j.Acquire(ctx, "op", "h", time.Now(), time.Minute); !unwritten.Is(err) {
		t.Fatalf("Acquire with its context ended: %v; want it marked unwritten", err)
	}
}
