//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
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

// show tells a lease that still holds the operation from one that does
// not: a lease whose time has passed, or whose holder process on this host
// is gone (killed), is no longer held, and a resume here takes it at once.
func TestShowLeaseThatNoLongerHolds(t *testing.T) {
	ctx := context.Background()
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	host := holderHost(t)
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, r := range []idem.Record{
		{Op: "ended", Holder: fmt.Sprintf("%s/%d/x.1", host, os.Getpid()), LeaseUntil: now.Add(-time.Minute)},
		{Op: "killed", Holder: fmt.Sprintf("%s/%d/x.1", host, gone.ProcessState.Pid()), LeaseUntil: now.Add(time.Hour)},
		{Op: "alive", Holder: fmt.Sprintf("%s/%d/x.1", host, os.Getpid()), LeaseUntil: now.Add(time.Hour)},
	} {
		r.Key, r.Fingerprint, r.Method, r.URL, r.Created, r.Updated = "key-"+r.Op, "fp", "POST", "http://127.0.0.1/v1/charges", now, now
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for op, want := range map[string]string{"ended": "free (held by ", "killed": "free on this host (held by ", "alive": "held by "} {
		code, out, errOut := idemctl("--jar", path, "show", op)
		if code != 0 || errOut != "" {
			t.Fatalf("show %s: exit %d, %s", op, code, errOut)
		}
		var lease string
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(line, "lease:"); ok {
				lease = strings.TrimSpace(v)
			}
		}
		if !strings.HasPrefix(lease, want) {
			t.Errorf("show %s: lease %q; want %q…", op, lease, want)
		}
	}
}

// holderHost returns the host part of the lease holder ids this process
// writes (idem.NewHolder).
func holderHost(t *testing.T) string {
	t.Helper()
	holder, err := idem.NewHolder()
	if err != nil {
		t.Fatal(err)
	}
	host, _, ok := strings.Cut(holder, "/")
	if !ok {
		t.Fatalf("holder %q: want host/pid/…", holder)
	}
	return host
}
