//go:build unix

package keyjar_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// TestFileMovedWhileOpen removes, renames or replaces the jar file while
// the jar is open. SQLite keeps writing to the file it opened, which is no
// longer at the jar's path: a key committed there is lost to every program
// that opens the path. Begin then fails with ErrMoved, so that nothing is
// sent under a key no restart would find, and so does Close. Close writes
// what was committed into the file the jar opened, where a Begin that
// returned before the file moved is found, and leaves nothing at the path
// that a file now there would take for its own.
func TestFileMovedWhileOpen(t *testing.T) {
	for _, c := range []struct {
		name     string
		move     func(t *testing.T, path string) (kept string) // where the earlier records are, "" for nowhere
		notExist bool                                          // the error also matches fs.ErrNotExist
	}{
		{"removed", func(t *testing.T, path string) string {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return ""
		}, true},
		{"renamed", func(t *testing.T, path string) string {
			if err := os.Rename(path, path+".old"); err != nil {
				t.Fatal(err)
			}
			return path + ".old"
		}, true},
		{"replaced", func(t *testing.T, path string) string {
			other := filepath.Join(filepath.Dir(path), "other.db")
			newJarFile(t, other)
			if err := os.Rename(path, path+".old"); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
			return path + ".old"
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := t.Context()
				path := filepath.Join(t.TempDir(), "keys.db")
				j := openPath(t, path, nil)
				if _, _, err := j.Begin(ctx, newRecord("before")); err != nil {
					t.Fatal(err)
				}
				kept := c.move(t, path)
				time.Sleep(keyjar.MovedEvery) // the jar checks at most this often

				_, created, err := j.Begin(ctx, newRecord("after"))
				if !errors.Is(err, keyjar.ErrMoved) || created {
					t.Fatalf("Begin once the jar file was %s: created %v, %v; want ErrMoved", c.name, created, err)
				}
				if errors.Is(err, fs.ErrNotExist) != c.notExist {
					t.Errorf("Begin: %v; matches fs.ErrNotExist: %v, want %v", err, !c.notExist, c.notExist)
				}
				prefixOnce(t, "Begin", err)
				if _, _, err := j.Begin(ctx, newRecord("again")); !errors.Is(err, keyjar.ErrMoved) {
					t.Fatalf("a second Begin: %v; want ErrMoved", err)
				}
				if err := j.Close(); !errors.Is(err, keyjar.ErrMoved) {
					t.Fatalf("Close: %v; want ErrMoved", err)
				}
				if c.name == "replaced" {
					// The jar's -wal file, left at the path, is not taken
					// for the new file's.
					if r, err := openPath(t, path, nil).Get(ctx, "op"); err != nil || r.Key != "key-op" {
						t.Errorf("the file now at the path lost its own record: key %q, %v; want key-op", r.Key, err)
					}
				}
				if kept == "" {
					return
				}
				moved := openPath(t, kept, nil)
				if r, err := moved.Get(ctx, "before"); err != nil || r.Key != "key-before" {
					t.Fatalf("the record begun before the file moved, in the file where it went: key %q, %v; want key-before", r.Key, err)
				}
				// A Begin that returned ErrMoved committed nothing.
				if r, err := moved.Get(ctx, "after"); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("the record whose Begin returned ErrMoved, in the file where the jar went: key %q, %v; want ErrNotFound", r.Key, err)
				}
			})
		})
	}
}

// TestOpenWhereAnOpenJarMoved: a jar of this process whose file was
// renamed, or replaced by another, while it is open keeps its -wal and
// -shm files at the path, holding what it committed since its last
// checkpoint; SQLite takes them for the files of whatever file is opened
// at the path. An Open of the path, for writing or for reading, is
// refused with ErrMoved while that jar is open, and nothing at the path
// changes; once it is closed, which writes what it committed into its
// file wherever it went, the path opens as the file now there, with its
// own records, and the moved file keeps the jar's.
func TestOpenWhereAnOpenJarMoved(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		t.Run(fmt.Sprint("replaced ", replaced), func(t *testing.T) {
			ctx := t.Context()
			dir := t.TempDir()
			path := filepath.Join(dir, "keys.db")
			j := openPath(t, path, nil)
			for _, op := range []string{"a", "b", "c"} {
				if _, _, err := j.Begin(ctx, newRecord(op)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Rename(path, path+".old"); err != nil {
				t.Fatal(err)
			}
			if replaced {
				newJarFile(t, filepath.Join(dir, "other.db"))
				if err := os.Rename(filepath.Join(dir, "other.db"), path); err != nil {
					t.Fatal(err)
				}
			}
			for _, opts := range []*keyjar.Options{nil, {ReadOnly: true}} {
				if j2, err := keyjar.Open(ctx, path, opts); !errors.Is(err, keyjar.ErrMoved) {
					if err == nil {
						j2.Close()
					}
					t.Fatalf("Open (%+v) of the path while the jar moved from it is open: %v; want ErrMoved", opts, err)
				} else {
					prefixOnce(t, "Open", err)
				}
			}
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) == replaced {
				t.Fatalf("the path after the refused Opens: %v; want it as it was", err)
			}
			if err := j.Close(); !errors.Is(err, keyjar.ErrMoved) {
				t.Fatalf("Close: %v; want ErrMoved", err)
			}
			now := openPath(t, path, nil)
			for _, op := range []string{"a", "b", "c"} {
				if _, err := now.Get(ctx, op); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("the file now at the path holds the moved jar's %q: %v", op, err)
				}
			}
			if _, err := now.Get(ctx, "op"); (err == nil) != replaced {
				t.Errorf("the file now at the path, its own record: %v; want it: %v", err, replaced)
			}
			old := openPath(t, path+".old", nil)
			for _, op := range []string{"a", "b", "c"} {
				if r, err := old.Get(ctx, op); err != nil || r.Key != "key-"+op {
					t.Errorf("the moved file, record %q: key %q, %v; want key-%s", op, r.Key, err, op)
				}
			}
		})
	}
}

// TestOpenOverAnOrphanWAL: a -wal file with commits at a path where no jar
// file is, or an empty one, is the WAL of a jar file removed or moved away
// while open (by another process, or one that did not close it): Open
// refuses it with ErrMoved and creates nothing, where SQLite would read
// that jar's pages as the new file's. An empty -wal, which Close leaves, is
// no such WAL.
func TestOpenOverAnOrphanWAL(t *testing.T) {
	ctx := t.Context()
	src := filepath.Join(t.TempDir(), "keys.db")
	j := openPath(t, src, nil)
	if _, _, err := j.Begin(ctx, newRecord("a")); err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(src + "-wal")
	if err != nil || len(wal) == 0 {
		t.Fatalf("the open jar's -wal file: %d bytes, %v; want its commits", len(wal), err)
	}
	for _, c := range []struct {
		name     string
		jarFile  bool // an empty jar file at the path
		emptyWAL bool
		refused  bool
	}{
		{"no jar file", false, false, true},
		{"an empty jar file", true, false, true},
		{"an empty -wal file", false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			w := wal
			if c.emptyWAL {
				w = nil
			}
			if err := os.WriteFile(path+"-wal", w, 0o600); err != nil {
				t.Fatal(err)
			}
			if c.jarFile {
				if err := os.WriteFile(path, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			j2, err := keyjar.Open(ctx, path, nil)
			if !c.refused {
				if err != nil {
					t.Fatalf("Open: %v; want a new jar", err)
				}
				j2.Close()
				return
			}
			if err == nil {
				j2.Close()
				t.Fatal("Open over the -wal file of another jar file: a jar; want ErrMoved")
			}
			if !errors.Is(err, keyjar.ErrMoved) {
				t.Fatalf("Open over the -wal file of another jar file: %v; want ErrMoved", err)
			}
			prefixOnce(t, "Open", err)
			if j2, err := keyjar.Open(ctx, path, &keyjar.Options{ReadOnly: true}); !errors.Is(err, keyjar.ErrMoved) {
				if err == nil {
					j2.Close()
				}
				t.Fatalf("Open with ReadOnly over the -wal file of another jar file: %v; want ErrMoved", err)
			}
			fi, err := os.Stat(path)
			if c.jarFile != (err == nil) || c.jarFile && fi.Size() != 0 {
				t.Errorf("the jar file after the refused Open: %v; want it as it was", err)
			}
		})
	}
}

// TestWALFileRemovedWhileOpen removes the jar's -wal file while the jar is
// open. SQLite appends its commits to the file it opened, which no program
// that opens the jar reads: until Close writes them into the jar file, a
// crash loses them. Begin then fails with ErrMoved, so that nothing is sent
// under a key only that file holds; Close writes what was committed into
// the jar file, where the next Open finds it.
func TestWALFileRemovedWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "keys.db")
		j := openPath(t, path, nil)
		if _, _, err := j.Begin(ctx, newRecord("before")); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path + "-wal"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(keyjar.MovedEvery) // the jar checks at most this often
		_, created, err := j.Begin(ctx, newRecord("after"))
		if !errors.Is(err, keyjar.ErrMoved) || !errors.Is(err, fs.ErrNotExist) || created {
			t.Fatalf("Begin once the -wal file was removed: created %v, %v; want ErrMoved matching fs.ErrNotExist", created, err)
		}
		prefixOnce(t, "Begin", err)
		if err := j.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		j = openPath(t, path, nil)
		if r, err := j.Get(ctx, "before"); err != nil || r.Key != "key-before" {
			t.Fatalf("the record begun before the -wal file was removed: key %q, %v; want key-before", r.Key, err)
		}
	})
}

// TestLinkRepointedWhileOpen opens the jar through a symbolic link, to the
// file or to a directory above it (a deploy's "current"), and points the
// link elsewhere while the jar is open: the path now names another file,
// which the next program that opens it opens, and where a key committed
// in the file the jar has open is not found. Begin then fails with
// ErrMoved, and so does Close; the record begun before is in the file the
// jar opened.
func TestLinkRepointedWhileOpen(t *testing.T) {
	for _, c := range []struct {
		name string
		link func(dir string) (target, path string) // the link's first target, and the jar's path through it
	}{
		{"a link to the file", func(dir string) (string, string) {
			return filepath.Join(dir, "v1", "keys.db"), filepath.Join(dir, "keys.db")
		}},
		{"a link to its directory", func(dir string) (string, string) {
			return filepath.Join(dir, "v1"), filepath.Join(dir, "current", "keys.db")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := t.Context()
				dir := t.TempDir()
				for _, v := range []string{"v1", "v2"} {
					if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				target, path := c.link(dir)
				link := filepath.Dir(path)
				if filepath.Base(target) == "keys.db" {
					link = path
				}
				if err := os.Symlink(target, link); err != nil {
					t.Fatal(err)
				}
				j := openPath(t, path, nil)
				if _, _, err := j.Begin(ctx, newRecord("before")); err != nil {
					t.Fatal(err)
				}
				// Pointed at v2 as a deploy does: a new link renamed over
				// the old one.
				other := strings.Replace(target, "v1", "v2", 1)
				if filepath.Base(other) == "keys.db" {
					newJarFile(t, other)
				}
				if err := os.Symlink(other, link+".new"); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(link+".new", link); err != nil {
					t.Fatal(err)
				}
				time.Sleep(keyjar.MovedEvery) // the jar checks at most this often

				_, created, err := j.Begin(ctx, newRecord("after"))
				if !errors.Is(err, keyjar.ErrMoved) || created {
					t.Fatalf("Begin once the link was pointed elsewhere: created %v, %v; want ErrMoved", created, err)
				}
				if err := j.Close(); !errors.Is(err, keyjar.ErrMoved) {
					t.Fatalf("Close: %v; want ErrMoved", err)
				}
				kept := openPath(t, filepath.Join(dir, "v1", "keys.db"), nil)
				if r, err := kept.Get(ctx, "before"); err != nil || r.Key != "key-before" {
					t.Fatalf("the record begun before, in the file the jar opened: key %q, %v; want key-before", r.Key, err)
				}
				if r, err := kept.Get(ctx, "after"); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("the record whose Begin returned ErrMoved: key %q, %v; want ErrNotFound", r.Key, err)
				}
			})
		})
	}
}

// TestReadsAfterTheFileMoved: a read (Get, List, ByKey) that needs a new
// connection once the jar file was removed or renamed finds nothing at the
// path to open. It fails with ErrMoved, as Begin and Close do, with
// SQLite's own error kept in the message, not with SQLite's error alone,
// which names no cause.
func TestReadsAfterTheFileMoved(t *testing.T) {
	for _, c := range []struct {
		name string
		move func(path string) error
	}{
		{"removed", os.Remove},
		{"renamed", func(path string) error { return os.Rename(path, path+".old") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "keys.db")
			j := openPath(t, path, nil)
			if _, _, err := j.Begin(ctx, newRecord("before")); err != nil {
				t.Fatal(err)
			}
			if err := c.move(path); err != nil {
				t.Fatal(err)
			}
			reads := map[string]func() error{
				"Get":   func() error { _, err := j.Get(ctx, "before"); return err },
				"List":  func() error { _, err := j.List(ctx, idem.Filter{State: idem.StatePending}); return err },
				"ByKey": func() error { _, err := j.ByKey(ctx, "key-before"); return err },
			}
			for name, read := range reads {
				err := read()
				if !errors.Is(err, keyjar.ErrMoved) || !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s once the jar file was %s: %v; want ErrMoved and fs.ErrNotExist", name, c.name, err)
				}
				prefixOnce(t, name, err)
			}
			if err := j.Close(); !errors.Is(err, keyjar.ErrMoved) {
				t.Errorf("Close: %v; want ErrMoved", err)
			}
		})
	}
}
