package keyjar_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

var readOnly = &keyjar.Options{ReadOnly: true}

// untouched is what a read-only jar leaves as it was: the names in the
// jar's directory, and the bytes of the jar file and of its -wal file.
// (The -shm file is SQLite's shared memory, where a reader that may write
// it keeps its read marks; one that may not reads it as it is: the tests
// run as another user show that nothing needs writing.)
func untouched(t *testing.T, path string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, name := range dirNames(t, filepath.Dir(path)) {
		m[name] = ""
	}
	for _, p := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if err == nil {
			m[filepath.Base(p)] = string(b)
		}
	}
	return m
}

// TestReadOnlyReads: a read-only jar reads what the jar holds, and what a
// writer commits while it is open, at once; it does not see, nor wait for,
// what another connection is writing and has not committed.
func TestReadOnlyReads(t *testing.T) {
	ctx := t.Context()
	w, path := openTemp(t, nil)
	for _, op := range []string{"a", "b", "c"} {
		if _, _, err := w.Begin(ctx, newRecord(op)); err != nil {
			t.Fatal(err)
		}
	}
	later := newRecord("").Created.Add(time.Minute)
	if _, err := w.Update(ctx, "b", "", idem.Change{Now: later, State: idem.StateDone, LastStatus: 201}); err != nil {
		t.Fatal(err)
	}
	ro := openPath(t, path, readOnly)
	want, err := w.List(ctx, idem.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ro.List(ctx, idem.Filter{}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("List = %v, %v; want the writer's %v", got, err, want)
	}
	if got, err := ro.List(ctx, idem.Filter{State: idem.StateDone}); err != nil || len(got) != 1 || got[0].Op != "b" || got[0].LastStatus != 201 {
		t.Errorf("List of the done = %v, %v; want b, 201", got, err)
	}
	if got, err := ro.Get(ctx, "a"); err != nil || !reflect.DeepEqual(got, want[0]) {
		t.Errorf("Get(a) = %v, %v; want %v", got, err, want[0])
	}
	if got, err := ro.ByKey(ctx, "key-c"); err != nil || len(got) != 1 || got[0].Op != "c" {
		t.Errorf("ByKey(key-c) = %v, %v; want c", got, err)
	}
	if _, err := ro.Get(ctx, "missing"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(missing) = %v; want idem.ErrNotFound", err)
	}

	// What the writer commits next.
	if _, _, err := w.Begin(ctx, newRecord("d")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Update(ctx, "a", "", idem.Change{Now: later, State: idem.StateFailed}); err != nil {
		t.Fatal(err)
	}
	if err := w.Forget(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := w.Defer("b", "", idem.Change{Now: later, Note: "deferred"}); err != nil {
		t.Fatal(err)
	}
	if got, err := w.Get(ctx, "b"); err != nil || got.Note != "deferred" { // the deferred change is written
		t.Fatal(got.Note, err)
	}
	if got, err := ro.List(ctx, idem.Filter{}); err != nil || len(got) != 3 ||
		got[0].Op != "a" || got[0].State != idem.StateFailed || got[1].Note != "deferred" || got[2].Op != "d" {
		t.Errorf("List after the writer's commits = %v, %v; want a failed, b with its note, d", got, err)
	}
	if _, err := ro.Get(ctx, "c"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(c) after the writer forgot it = %v; want idem.ErrNotFound", err)
	}

	// A write in progress elsewhere is neither seen nor waited for.
	release := writeInProgress(t, path)
	defer release()
	if got, err := ro.Get(ctx, "a"); err != nil || got.Note != "" {
		t.Errorf("Get(a) while another writes = note %q, %v; want the committed record", got.Note, err)
	}
	if _, err := ro.Get(ctx, "uncommitted"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(uncommitted) = %v; want idem.ErrNotFound", err)
	}
}

// TestReadOnlyRefusesWrites: every method of a read-only jar that would
// write returns ErrReadOnly, and nothing changes: not the records, not the
// files.
func TestReadOnlyRefusesWrites(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "keys.db")
	w := openPath(t, path, nil)
	done := newRecord("done")
	done.State = idem.StateDone
	for _, r := range []idem.Record{newRecord("op"), done} {
		if _, _, err := w.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ro := openPath(t, path, readOnly)
	want, err := ro.List(ctx, idem.Filter{})
	if err != nil || len(want) != 2 {
		t.Fatalf("List = %v, %v; want op and done", want, err)
	}
	before := untouched(t, path)
	now := done.Created.Add(time.Hour) // done is prunable before now
	farFuture := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	doneCtx, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Begin", func() error { _, _, err := ro.Begin(ctx, newRecord("new")); return err }},
		{"Begin of an existing op", func() error { _, _, err := ro.Begin(ctx, newRecord("op")); return err }},
		{"Acquire", func() error { _, err := ro.Acquire(ctx, "op", "h", now, time.Minute); return err }},
		{"Update", func() error {
			_, err := ro.Update(ctx, "op", "", idem.Change{Now: now, State: idem.StateDone})
			return err
		}},
		{"Defer", func() error { return ro.Defer("op", "", idem.Change{Now: now, State: idem.StateDone}) }},
		{"Forget", func() error { return ro.Forget(ctx, "done") }},
		{"ForgetKey", func() error { return ro.ForgetKey(ctx, "done", "key-done") }},
		{"AbandonKey", func() error { return ro.AbandonKey(ctx, "op", "key-op", "", "gone", now) }},
		{"Prune", func() error { return pruned(ro.Prune(ctx, now, 0)) }},
		{"Prune with a limit", func() error { return pruned(ro.Prune(ctx, now, 1)) }},
		// ErrReadOnly first, whatever the arguments, as ErrClosed after
		// Close: the write is refused for what the jar is.
		{"Begin of an invalid record", func() error { _, _, err := ro.Begin(ctx, idem.Record{Op: "new"}); return err }},
		{"Begin of an invalid state", func() error {
			r := newRecord("new")
			r.State = "bogus"
			_, _, err := ro.Begin(ctx, r)
			return err
		}},
		{"Acquire past 2262", func() error { _, err := ro.Acquire(ctx, "op", "h", farFuture, time.Minute); return err }},
		{"Update of an invalid state", func() error {
			_, err := ro.Update(ctx, "op", "", idem.Change{Now: now, State: "bogus"})
			return err
		}},
		{"Defer past 2262", func() error { return ro.Defer("op", "", idem.Change{Now: farFuture}) }},
		{"Forget with a done context", func() error { return ro.Forget(doneCtx, "done") }},
		{"Prune with a done context", func() error { return pruned(ro.Prune(doneCtx, now, 0)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if !errors.Is(err, keyjar.ErrReadOnly) {
				t.Fatalf("%s = %v; want keyjar.ErrReadOnly", c.name, err)
			}
			prefixOnce(t, c.name, err)
			if got, err := ro.List(ctx, idem.Filter{}); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("after %s: %v, %v; want the records as they were, %v", c.name, got, err, want)
			}
			if after := untouched(t, path); !maps.Equal(after, before) {
				t.Errorf("after %s: the jar's files changed: %q, were %q", c.name, slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
			}
		})
	}
	// Nor does the close of the last connection to the file.
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after := untouched(t, path); !maps.Equal(after, before) {
		t.Errorf("after Close: the jar's files changed: %q, were %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
}

// pruned turns Prune's answer into its error, or an error when it says it
// pruned anything.
func pruned(n int, err error) error {
	if err == nil && n != 0 {
		return errors.New("pruned some")
	}
	return err
}

// TestReadOnlyClosed: after Close, every method of a read-only jar returns
// ErrClosed, the writing ones too.
func TestReadOnlyClosed(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	ro, err := keyjar.Open(ctx, path, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t0 := newRecord("").Created
	_, _, errBegin := ro.Begin(ctx, newRecord("new"))
	_, errGet := ro.Get(ctx, "op")
	_, errAcquire := ro.Acquire(ctx, "op", "h", t0, time.Minute)
	_, errUpdate := ro.Update(ctx, "op", "", idem.Change{Now: t0})
	_, errList := ro.List(ctx, idem.Filter{})
	_, errByKey := ro.ByKey(ctx, "key-op")
	_, errPrune := ro.Prune(ctx, t0, 0)
	for name, err := range map[string]error{"Begin": errBegin, "Get": errGet, "Acquire": errAcquire, "Update": errUpdate,
		"List": errList, "ByKey": errByKey, "Prune": errPrune, "Defer": ro.Defer("op", "", idem.Change{Now: t0}),
		"Forget": ro.Forget(ctx, "op"), "ForgetKey": ro.ForgetKey(ctx, "op", "key-op"), "second Close": ro.Close()} {
		if !errors.Is(err, keyjar.ErrClosed) {
			t.Errorf("%s after Close: %v; want ErrClosed", name, err)
		}
		prefixOnce(t, name, err)
	}
}

// TestReadOnlyOpenErrors: a read-only Open refuses what a writing Open
// with MustExist refuses, with the same errors, and also a jar it could
// read only by writing: a WAL-mode jar without its -wal and -shm files,
// which SQLite would create. It creates and changes nothing.
func TestReadOnlyOpenErrors(t *testing.T) {
	random := make([]byte, 8192)
	rand.NewChaCha8([32]byte{2}).Read(random)
	withoutWAL := func(t *testing.T, path string) {
		for _, p := range []string{path + "-wal", path + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string) // makes the file at path, or not
		want  error
		says  string
	}{
		{"missing file", func(*testing.T, string) {}, fs.ErrNotExist, ""},
		{"empty file", writeFile(nil), keyjar.ErrCorrupt, "is empty: it holds no operation"},
		{"random bytes", writeFile(random), keyjar.ErrCorrupt, "not a SQLite database"},
		{"truncated header", writeFile([]byte("SQLite format 3\x00\x10\x00")), keyjar.ErrCorrupt, ""},
		{"another program's database", func(t *testing.T, path string) {
			db := rawDB(t, path, "")
			if _, err := db.Exec("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ann')"); err != nil {
				t.Fatal(err)
			}
			db.Close()
		}, keyjar.ErrCorrupt, "another program"},
		{"the reference server's database", func(t *testing.T, path string) {
			st, err := sqlitestore.Open(t.Context(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
		}, keyjar.ErrCorrupt, "reference server's database"},
		{"newer schema version", jarOfVersion(99, false), keyjar.ErrVersion, "version 99"},
		{"newer schema version, its -wal and -shm files kept", jarOfVersion(99, true), keyjar.ErrVersion, "version 99"},
		{"older schema version", jarOfVersion(0, false), keyjar.ErrCorrupt, "schema version 0"},
		{"WAL-mode jar without its -wal and -shm files", func(t *testing.T, path string) {
			newJarFile(t, path)
			withoutWAL(t, path)
		}, keyjar.ErrReadOnly, "-wal"},
		{"WAL-mode jar without its -shm file", func(t *testing.T, path string) {
			newJarFile(t, path)
			if err := os.Remove(path + "-shm"); err != nil {
				t.Fatal(err)
			}
		}, keyjar.ErrReadOnly, "-shm"},
		{"jar in locking_mode=EXCLUSIVE", func(t *testing.T, path string) {
			newJarFile(t, path)
			t.Cleanup(lockFile(t, path, true))
		}, keyjar.ErrLocked, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			c.setup(t, path)
			before := untouched(t, path)
			j, err := keyjar.Open(t.Context(), path, &keyjar.Options{ReadOnly: true, BusyTimeout: 20 * time.Millisecond})
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Open: err = %v; want %v saying %q", err, c.want, c.says)
			}
			prefixOnce(t, "Open", err)
			if after := untouched(t, path); !maps.Equal(after, before) {
				t.Errorf("Open changed the jar's directory or files: %q, were %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
			}
		})
	}
}

// jarOfVersion returns a setup that makes a jar at path and sets its
// schema version (PRAGMA user_version) through another connection, which
// stays open until the test ends when keepOpen is set: the last connection
// to close removes the -wal and -shm files, as SQLite does by default.
func jarOfVersion(version int, keepOpen bool) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		newJarFile(t, path)
		db := rawDB(t, path, "")
		if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", version)); err != nil {
			t.Fatal(err)
		}
		if !keepOpen {
			db.Close()
		}
	}
}

// TestReadOnlyRollbackJournal: a jar that another program switched out of
// WAL mode (journal_mode=DELETE) is read as it is, without the -wal and
// -shm files, which a read-only Open neither needs nor creates, and
// without switching it back.
func TestReadOnlyRollbackJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	db := rawDB(t, path, "")
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode = DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
	db.Close()
	if got := dirNames(t, filepath.Dir(path)); !slices.Equal(got, []string{"keys.db"}) {
		t.Fatalf("the directory holds %q; want keys.db alone", got)
	}
	before := untouched(t, path)
	ro := openPath(t, path, readOnly)
	if r, err := ro.Get(t.Context(), "op"); err != nil || r.Key != "key-op" {
		t.Fatalf("Get(op) = key %q, %v; want key-op", r.Key, err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after := untouched(t, path); !maps.Equal(after, before) {
		t.Errorf("the read-only jar changed the directory or the file: %q, was %q", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b[18:20], []byte{1, 1}) {
		t.Errorf("the file's read and write versions are %v (%v); want 1, 1: still not WAL", b[18:20], err)
	}
}

// TestReadOnlyThroughSymlink: a read-only jar opened through a symbolic
// link in another directory reads the file the link points to, with the
// -wal and -shm files beside that file, and creates none beside the link.
func TestReadOnlyThroughSymlink(t *testing.T) {
	target := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, target)
	link := filepath.Join(t.TempDir(), "link.db")
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	ro := openPath(t, link, readOnly)
	if r, err := ro.Get(t.Context(), "op"); err != nil || r.Key != "key-op" {
		t.Fatalf("Get(op) = key %q, %v; want key-op", r.Key, err)
	}
	if got := dirNames(t, filepath.Dir(link)); !slices.Equal(got, []string{"link.db"}) {
		t.Errorf("the link's directory holds %q; want link.db alone", got)
	}
}
