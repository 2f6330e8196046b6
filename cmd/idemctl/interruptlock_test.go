package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
)

// TestInterruptedWhileLocked: abandon, forget or prune interrupted (its
// context cancelled, as SIGINT does) while it waits for another process's
// write lock on a jar file stops waiting at once, rather than after
// --lock-timeout: it exits 1 saying it was interrupted, and the jar is as
// it was.
func TestInterruptedWhileLocked(t *testing.T) {
	srv := newServer(t)
	for _, args := range [][]string{
		{"abandon", "charge:p1", "--reason", "x"},
		{"forget", "charge:done"},
		{"prune", "--older-than", "1h"},
	} {
		t.Run(args[0], func(t *testing.T) {
			path := seed(t, srv)
			lockJar(t, path, false)
			code, stderr, took := interruptedAfter(t, 200*time.Millisecond, append([]string{"--jar", path, "--lock-timeout", "20s"}, args...)...)
			if took > 5*time.Second {
				t.Fatalf("%s interrupted after 200ms took %v: exit %d, stderr %q; want it to stop waiting for the lock at once",
					args[0], took.Round(time.Millisecond), code, stderr)
			}
			wantError(t, code, stderr, 1, "interrupted")
			wantAsSeeded(t, path)
		})
	}
}

// TestResumeInterruptedWhileLocked: resume of one operation interrupted
// while it waits for another process's write lock on a jar file stops
// waiting for it at once, and so does its Close: the transport's Acquire
// was withdrawn, unwritten, and it defers no release of a lease it never
// took, which Close would wait up to --lock-timeout to write (fenced to
// nothing) and then report dropped, as an answer that may not be recorded
// although nothing was sent.
func TestResumeInterruptedWhileLocked(t *testing.T) {
	srv := newServer(t)
	path := seed(t, srv)
	lockJar(t, path, false)
	const lockTimeout = 20 * time.Second
	code, stderr, took := interruptedAfter(t, 200*time.Millisecond, "--jar", path, "--lock-timeout", lockTimeout.String(),
		"resume", "charge:p1", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 1 || took > 5*time.Second || !strings.Contains(stderr, "the call's context ended") || strings.Contains(stderr, "may not be recorded") {
		t.Fatalf("resume interrupted after 200ms took %v: exit %d, stderr %q; want exit 1, the call's context ended, at once (not after --lock-timeout, %v), and no word of an answer not recorded",
			took.Round(time.Millisecond), code, stderr, lockTimeout)
	}
	wantAsSeeded(t, path)
}

// interruptedAfter runs idemctl with args and cancels its context d after
// it opened the jar, as SIGINT does, by when the command waits for the
// lock: it returns the exit status, stderr and how long it ran from then.
// A command that ended before, or did not open the jar, fails the test:
// it did not wait for the lock, and its result says nothing of an
// interrupt during that wait.
func interruptedAfter(t *testing.T, d time.Duration, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opened time.Time
	real := openJarFn
	t.Cleanup(func() { openJarFn = real })
	openJarFn = func(ctx context.Context, spec string, lockTimeout time.Duration, readOnly bool) (client.Jar, func() error, error) {
		j, closeJar, err := real(ctx, spec, lockTimeout, readOnly)
		if err == nil {
			opened = time.Now()
			time.AfterFunc(d, cancel)
		}
		return j, closeJar, err
	}
	var stdout, stderr bytes.Buffer
	code := runContext(ctx, args, &stdout, &stderr)
	if opened.IsZero() || ctx.Err() == nil {
		t.Fatalf("%s ended before it was interrupted, %v after it opened the jar: exit %d, stderr %q; want it waiting for the lock",
			args, d, code, stderr.String())
	}
	return code, stderr.String(), time.Since(opened)
}

// wantAsSeeded checks that the jar at path holds charge:p1 pending and
// charge:done done, as seed left them.
func wantAsSeeded(t *testing.T, path string) {
	t.Helper()
	for op, want := range map[string]idem.State{"charge:p1": idem.StatePending, "charge:done": idem.StateDone} {
		if r, err := jarState(t, path, op); err != nil || r.State != want || r.Note != "" {
			t.Errorf("%s after the interrupted command: %+v, %v; want it %s, as it was", op, r, err, want)
		}
	}
}
