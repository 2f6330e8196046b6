//go:build unix

package main

import (
	"path/filepath"
	"syscall"
	"testing"
)

// TestFIFOIsNoJar: a FIFO is refused at once; reading it would wait for a
// writer forever.
func TestFIFOIsNoJar(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo.db")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idemctl("--jar", fifo, "list")
	wantError(t, code, errOut, 1, "not a regular file")
}
