//go:build unix

// Package nobody runs a test's child process as the user nobody, whom file
// permissions stop: a test that runs as root, whom they do not, checks
// what a user without write access gets by running that part as nobody.
package nobody

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// ID is the user id and the group id of the user nobody.
const ID = 65534

// Attr returns the attributes of a child process (exec.Cmd.SysProcAttr)
// that runs as nobody.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: ID, Gid: ID}}
}

// Binary copies the running test binary, which lies where nobody may not
// run it, into dir as name, lets nobody into dir and its parent, and
// returns the copy's path.
func Binary(t testing.TB, dir, name string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// WithoutWrite takes away the write permission on the SQLite file at path,
// its -wal and -shm files and their directory, until the test ends, and
// reports whether this process runs as root, whom permissions do not
// stop: the test then reads the files as nobody (Attr), who may read them
// (0644) and not write them. It skips the test when the permissions cannot
// be changed.
func WithoutWrite(t testing.TB, path string) (root bool) {
	t.Helper()
	root = os.Geteuid() == 0
	mode := os.FileMode(0o444)
	if root {
		mode = 0o644
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, mode); err != nil {
			t.Skipf("cannot take the write permission away (%v): nothing to test", err)
		}
		t.Cleanup(func() { os.Chmod(p, 0o600) })
	}
	dir := filepath.Dir(path)
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Skipf("cannot take the write permission away (%v): nothing to test", err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	return root
}
