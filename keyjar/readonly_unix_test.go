//go:build unix

package keyjar_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/internal/nobody"
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
	bin := nobody.Binary(t, top, "keyjar.test")
	for _, jar := range jars {
		if err := os.Chown(jar, nobody.ID, nobody.ID); err != nil {
			t.Fatal(err)
		}
	}
	return func(path string) (bool, string) {
		c := startChild(t, bin, "open", path, "", nobody.Attr())
		line := c.line(t)
		return bytes.HasPrefix([]byte(line), []byte("permission:")), line
	}
}

// TestReadOnlyWithoutWriteAccess opens jars with ReadOnly as a user who
// may write neither the jar file, its -wal and -shm files nor their
// directory: a jar its program closed, one a program has open and writes
// to meanwhile (the read-only jar sees what it commits), and one whose
// program was killed (SIGKILL) after a Begin. Run as root, whom
// permissions do not stop, the jar is read in a child process as the user
// nobody; otherwise here, with the write permissions taken away.
func TestReadOnlyWithoutWriteAccess(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string) (write func()) // makes the jar; write, if not nil, commits op2
		want  string                                         // the operations read
	}{
		{"closed", func(t *testing.T, path string) func() {
			newJarFile(t, path)
			return nil
		}, "op=key-op"},
		{"open in a program that writes", func(t *testing.T, path string) func() {
			w := openPath(t, path, nil)
			if _, _, err := w.Begin(t.Context(), newRecord("op")); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, _, err := w.Begin(t.Context(), newRecord("op2")); err != nil {
					t.Fatal(err)
				}
			}
		}, "op=key-op"},
		{"its program killed", func(t *testing.T, path string) func() {
			killedHolder(t, path, "killed-key")
			return nil
		}, "op=killed-key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			top := t.TempDir()
			dir := filepath.Join(top, "ro")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "keys.db")
			write := c.setup(t, path)
			read := unwritable(t, top, path)
			before := untouched(t, path)
			if got := read(); got != c.want {
				t.Fatalf("the read-only jar reads %q; want %q", got, c.want)
			}
			if write == nil {
				if after := untouched(t, path); !maps.Equal(after, before) {
					t.Errorf("the read-only jar changed the directory or the files: %q, were %q",
						slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
				}
				return
			}
			write()
			if got, want := read(), c.want+" op2=key-op2"; got != want {
				t.Fatalf("the read-only jar reads %q after the program's write; want %q", got, want)
			}
		})
	}
}

// unwritable takes away the write permissions on the jar at path (its
// file, -wal and -shm files) and its directory, below top, and returns a
// function that lists the jar, opened once with ReadOnly, as listing does:
// in a child process as the user nobody when this process runs as root,
// which permissions do not stop, here otherwise.
func unwritable(t *testing.T, top, path string) (read func() string) {
	t.Helper()
	if !nobody.WithoutWrite(t, path) {
		j := openPath(t, path, &keyjar.Options{ReadOnly: true})
		return func() string { return listing(t.Context(), j) }
	}
	c := startChild(t, nobody.Binary(t, top, "keyjar.test"), "read", path, "", nobody.Attr())
	first := true
	return func() string {
		if !first {
			if _, err := io.WriteString(c.stdin, "again\n"); err != nil {
				t.Fatal(err)
			}
		}
		first = false
		return c.line(t)
	}
}

// TestOpenFIFO: a FIFO is not a jar, and Open says so at once, read-only
// too: reading its first bytes, or opening it for reading alone, would wait
// for a writer forever. Nor is a Unix socket, which no open takes.
func TestOpenFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo.db")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "sock.db")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, path := range []string{fifo, sock} {
		for _, opts := range []*keyjar.Options{nil, {ReadOnly: true}} {
			j, err := keyjar.Open(t.Context(), path, opts)
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, keyjar.ErrCorrupt) {
				t.Fatalf("Open(%s, %+v) = %v; want ErrCorrupt", filepath.Base(path), opts, err)
			}
		}
	}
}
