package keyjar_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// TestWithdrawnWritesStopWaitingForLock: while another process holds the
// write lock, a write whose caller's context ends returns at once, and the
// committer stops waiting for the lock once no caller waits for its batch:
// Close then returns without waiting out BusyTimeout, and nothing changed.
// A write whose caller still waits is not given up (TestLockedWrite...).
func TestWithdrawnWritesStopWaitingForLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	j, err := keyjar.Open(context.Background(), path, &keyjar.Options{BusyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockFile(t, path, false)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := j.Forget(ctx, "op"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Forget while locked, its context ending: %v; want the context's error", err)
	}
	err = j.Close()
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
