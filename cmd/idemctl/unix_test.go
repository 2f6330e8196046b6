//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/nobody"
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

// TestReadWithoutWriteAccess: list, show and export read a jar whose file,
// -wal and -shm files and directory the user may not write, and change no
// byte there; a command that writes is refused, and says what it needs, as
// does list when the -wal file cannot be read.
// Run as root, whom permissions do not stop, idemctl (the test binary,
// made idemctl by asIdemctl) runs as the user nobody; otherwise here, with
// the write permissions taken away.
func TestReadWithoutWriteAccess(t *testing.T) {
	top, dir, path := seedInDir(t)
	run := idemctlWithoutWriteAccess(t, top, path)
	before := dirFiles(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list"}, "charge:p1"},
		{[]string{"list", "--status", "pending"}, "charge:p2"},
		{[]string{"show", "charge:p1"}, `{"order_id":"charge:p1","amount":100}`},
		{[]string{"export"}, `"op": "charge:reconcile"`},
	} {
		code, out, errOut := run(append([]string{"--jar", path}, c.args...)...)
		if code != 0 || errOut != "" || !strings.Contains(out, c.want) {
			t.Errorf("%q without write access: exit %d, stderr %q, stdout %q; want exit 0 and %q", c.args, code, errOut, out, c.want)
		}
	}
	code, _, errOut := run("--jar", path, "abandon", "charge:p1", "--reason", "no charge")
	wantError(t, code, errOut, 1, path+": permission denied")
	if !strings.Contains(errOut, "write") {
		t.Errorf("abandon without write access: %q; want it to say that it needs to write", errOut)
	}
	wantUnchanged(t, dir, before)
	// A jar without its -wal and -shm files cannot be read without
	// creating them, which this user may not: said, and nothing changes.
	// The file and its directory are both read-only to the user
	// (TestReadOnlyJarFileWithoutWALFiles: the file alone).
	moveWALFiles(t, path, "", ".away")
	before = dirFiles(t, dir)
	code, _, errOut = run("--jar", path, "list")
	wantError(t, code, errOut, 1, path+": its -wal and -shm files are missing")
	if !strings.Contains(errOut, "as a user who may write the jar file and its directory") {
		t.Errorf("list of a jar without its -wal and -shm files: %q; want it to say who may create them", errOut)
	}
	wantUnchanged(t, dir, before)
	moveWALFiles(t, path, ".away", "")
	// Reading needs read access to the -wal file too, and says so.
	if err := os.Chmod(path+"-wal", 0); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run("--jar", path, "list")
	wantError(t, code, errOut, 1, path+": permission denied; list, show and export read the file and its -wal and -shm files")
}

// TestReadVersion1WithoutWriteAccess: list, show and export of a jar of
// schema version 1, which only an open for writing upgrades, by a user who
// may not write it read it as it is, and change nothing.
func TestReadVersion1WithoutWriteAccess(t *testing.T) {
	top, dir, path := seedInDir(t)
	toVersion1(t, path) // its connection stays open: -wal and -shm stay
	run := idemctlWithoutWriteAccess(t, top, path)
	before := dirFiles(t, dir)
	for _, args := range [][]string{{"list", "--status", "pending"}, {"show", "charge:p1"}, {"export"}} {
		code, out, errOut := run(append([]string{"--jar", path}, args...)...)
		if code != 0 || errOut != "" || !strings.Contains(out, "charge:p1") {
			t.Errorf("%q of a version 1 jar without write access: exit %d, stderr %q, stdout %q; want charge:p1 read", args, code, errOut, out)
		}
	}
	wantUnchanged(t, dir, before)
}

// seedInDir creates the jar file path, holding the operations fill makes,
// in the directory dir of its own below top, for idemctlWithoutWriteAccess.
func seedInDir(t *testing.T) (top, dir, path string) {
	t.Helper()
	top = t.TempDir()
	dir = filepath.Join(top, "jars")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "keys.db")
	seedFile(t, newServer(t), path)
	return top, dir, path
}

// wantUnchanged fails the test unless dir holds what dirFiles found there
// before.
func wantUnchanged(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	if after := dirFiles(t, dir); !maps.Equal(after, before) {
		t.Errorf("the jar's directory changed: %q, was %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
}

// moveWALFiles renames the -wal and -shm files of the jar at path, from
// their names with suffix from to those with suffix to, in a directory
// whose write permission was taken away: given back for the renames.
func moveWALFiles(t *testing.T, path, from, to string) {
	t.Helper()
	dir := filepath.Dir(path)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Rename(p+from, p+to); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
}

// dirFiles returns the name and the bytes of each file in dir.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, name := range dirNames(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		m[name] = string(b)
	}
	return m
}

// idemctlWithoutWriteAccess takes away the write permissions on the jar at
// path (its file, -wal and -shm files) and on its directory, below top, and
// returns a function that runs idemctl as a user who may only read them:
// the user nobody, in a child process, when this process runs as root, and
// this process otherwise.
func idemctlWithoutWriteAccess(t *testing.T, top, path string) func(args ...string) (int, string, string) {
	t.Helper()
	if !nobody.WithoutWrite(t, path) {
		return idemctl
	}
	bin := nobody.Binary(t, top, "idemctl")
	return func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), asIdemctl+"=1")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.SysProcAttr = nobody.Attr()
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
}

// TestResumeAllStoppedBySignal: SIGINT (Ctrl-C), SIGTERM or SIGHUP (the
// terminal closed) while resume --all sends an operation stops it as a
// cancelled context does (TestResumeAllInterruptedWhileSending): that
// operation and those not reached stay pending under their keys, one line
// says so, and the exit status is 1.
func TestResumeAllStoppedBySignal(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			started := make(chan *os.Process, 1)
			var once sync.Once
			stop := func() { once.Do(func() { (<-started).Signal(sig) }) }
			testResumeAllStoppedWhileSending(t, stop, func(args ...string) (int, string, string) {
				var stdout, stderr bytes.Buffer
				cmd := exec.CommandContext(ctx, self, args...)
				cmd.Env = append(os.Environ(), asIdemctl+"=1")
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				started <- cmd.Process
				cmd.Wait()
				return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
			})
		})
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
