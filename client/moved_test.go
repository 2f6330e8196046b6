//go:build unix

package client_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar"
)

// TestReadsAfterTheJarFileMoved: once the jar file New opened is removed
// under the running Client, the calls that read the jar (Pending, a
// resume's read of the record, Forget) fail with keyjar.ErrMoved, as the
// calls that begin an operation and Close do, not with SQLite's
// "unable to open database file" alone, which names no cause: a program's
// start-up loop over Pending can tell the fault.
func TestReadsAfterTheJarFileMoved(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "keys.db")
	c, err := client.New(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pending(ctx); !errors.Is(err, keyjar.ErrMoved) {
		t.Errorf("Pending once the jar file was removed: %v; want keyjar.ErrMoved", err)
	}
	if _, err := c.Resume(ctx, "charge:1"); !errors.Is(err, keyjar.ErrMoved) {
		t.Errorf("Resume once the jar file was removed: %v; want keyjar.ErrMoved", err)
	}
	if err := c.Forget(ctx, "charge:1"); !errors.Is(err, keyjar.ErrMoved) {
		t.Errorf("Forget once the jar file was removed: %v; want keyjar.ErrMoved", err)
	}
	if err := c.Close(); !errors.Is(err, keyjar.ErrMoved) {
		t.Errorf("Close: %v; want keyjar.ErrMoved", err)
	}
}
