//go:build unix

package keyjar_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/keyjar"
)

// TestOpenReadOnlyDir opens jars in a directory the process cannot write:
// a new one, an existing one without its -wal and -shm files, and one open
// elsewhere whose -wal and -shm files the process cannot open. Each error wraps fs.ErrPermission. Run as
// root, whom permissions do not stop, the test runs the Opens in a child
// process as the user nobody.
func TestOpenReadOnlyDir(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "ro")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	existing, held := filepath.Join(dir, "existing.db"), filepath.Join(dir, "held.db")
	newJarFile(t, existing)
	// As a program that removes them at its close leaves it (another SQLite
	// program, or keyjar before it kept them): SQLite must create them.
	for _, p := range []string{existing + "-wal", existing + "-shm"} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	hj := openPath(t, held, nil)
	if _, _, err := hj.Begin(t.Context(), newRecord("op")); err != nil {
		t.Fatal(err)
	}
	open := func(path string) (permission bool, msg string) {
		_, err := keyjar.Open(t.Context(), path, nil)
		if err == nil {
			return false, "opened"
		}
		return errors.Is(err, fs.ErrPermission), err.Error()
	}
	if os.Geteuid() == 0 {
		open = asNobody(t, top, existing, held)
	} else {
		for _, p := range []string{held + "-wal", held + "-shm"} {
			if err := os.Chmod(p, 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(p, 0o600) })
		}
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	for _, name := range []string{"new.db", "existing.db", "held.db"} {
		ok, msg := open(filepath.Join(dir, name))
		if !ok {
			t.Errorf("Open of %s in a read-only directory: %s; want an error wrapping fs.ErrPermission", name, msg)
		}
		// The file itself may be written: the error must say what may not.
		if name == "existing.db" && !strings.Contains(msg, "directory "+dir+" cannot be written") {
			t.Errorf("Open of %s in a read-only directory: %s; want it to say that the directory %s cannot be written", name, msg, dir)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "new.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("new.db exists after the refused Open: %v", err)
	}
	// The refused Opens lost nothing.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, j := range []*keyjar.Jar{openPath(t, existing, nil), hj} {
		if r, err := j.Get(t.Context(), "op"); err != nil || r.Key != "key-op" {
			t.Errorf("after the refused Opens: key %q, %v; want key-op", r.Key, err)
		}
	}
}

// TestOpenReadOnlyWAL: the jar file may be written but its -wal and -shm
// files, which another user's process created, may only be read: nothing
// could be written. Open says so with an error wrapping fs.ErrPermission
// although it only reads a current jar, and also while another process
// holds the write lock. Run as root, the Open runs as the user nobody.
func TestOpenReadOnlyWAL(t *testing.T) {
	for _, writing := range []bool{false, true} {
		t.Run(map[bool]string{false: "idle", true: "while another writes"}[writing], func(t *testing.T) {
			top := t.TempDir()
			path := filepath.Join(top, "keys.db")
			newJarFile(t, path)
			openPath(t, path, nil) // keeps the -wal and -shm files
			if writing {
				t.Cleanup(writeInProgress(t, path))
			}
			open, mode := func(path string) (bool, string) {
				line := startChild(t, testBinary(t), "open", path, "", nil).line(t)
				return strings.HasPrefix(line, "permission:"), line
			}, os.FileMode(0o444)
			if os.Geteuid() == 0 {
				// nobody owns the jar file, root the -wal and -shm files.
				open, mode = asNobody(t, top, path), 0o644
			}
			for _, p := range []string{path + "-wal", path + "-shm"} {
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Chmod(p, 0o600) })
			}
			if ok, msg := open(path); !ok {
				t.Errorf("Open with read-only -wal and -shm files: %s; want an error wrapping fs.ErrPermission", msg)
			}
		})
	}
}

// asNobody prepares top for the user nobody (the test binary copied there,
// the jar files owned by nobody) and returns an open function that runs
// keyjar.Open in a child process as nobody.
func asNobody(t *testing.T, top string, jars ...string) func(path string) (bool, string) {
	const nobody = 65534
	self, err := os.ReadFile(testBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(top, "keyjar.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, jar := range jars {
		if err := os.Chown(jar, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	return func(path string) (bool, string) {
		c := startChild(t, bin, "open", path, "", &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}})
		line := c.line(t)
		return bytes.HasPrefix([]byte(line), []byte("permission:")), line
	}
}

// TestOpenFIFO: a FIFO is not a jar, and Open says so at once: reading its
// first bytes would wait for a writer forever.
func TestOpenFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo.db")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := keyjar.Open(t.Context(), path, nil)
	if err == nil {
		j.Close()
	}
	if !errors.Is(err, keyjar.ErrCorrupt) {
		t.Fatalf("Open(a FIFO) = %v; want ErrCorrupt", err)
	}
}
