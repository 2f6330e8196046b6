package keyjar_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// rawDB opens path with the SQLite driver directly, bypassing keyjar.
func rawDB(t *testing.T, path string, params string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+params)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// lockFile holds a write transaction on the SQLite file at path through
// another connection, as another process would, and returns its release.
// The lock blocks every other writer; in locking_mode=EXCLUSIVE (exclusive
// true, possible only while no other connection has the file open) it blocks
// readers too.
func lockFile(t *testing.T, path string, exclusive bool) (unlock func()) {
	t.Helper()
	params := "?_txlock=exclusive&_pragma=busy_timeout(5000)"
	if exclusive {
		params += "&_pragma=locking_mode(EXCLUSIVE)"
	}
	db := rawDB(t, path, params)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("CREATE TABLE lock_probe (x)"); err != nil {
		t.Fatal(err)
	}
	return func() { tx.Rollback(); db.Close() }
}

// newJarFile creates a closed jar at path holding one operation.
func newJarFile(t testing.TB, path string) {
	t.Helper()
	j, err := keyjar.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(context.Background(), newRecord("op")); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenErrors opens files that are not usable jars: each gives its typed
// error, never a panic, and the file is left exactly as it was.
func TestOpenErrors(t *testing.T) {
	random := make([]byte, 8192)
	rand.NewChaCha8([32]byte{1}).Read(random)
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string) // creates the file at path
		opts  *keyjar.Options
		want  error
	}{
		{"random bytes", writeFile(random), nil, keyjar.ErrCorrupt},
		{"short garbage", writeFile([]byte("not a database")), nil, keyjar.ErrCorrupt},
		{"truncated header", writeFile([]byte("SQLite format 3\x00\x10\x00")), nil, keyjar.ErrCorrupt},
		{"jar with a damaged header", func(t *testing.T, path string) {
			newJarFile(t, path)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			copy(b[16:], bytes.Repeat([]byte{0xff}, 84)) // page size, versions, counters
			writeFile(b)(t, path)
		}, nil, keyjar.ErrCorrupt},
		{"another program's database", func(t *testing.T, path string) {
			db := rawDB(t, path, "")
			if _, err := db.Exec("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ann')"); err != nil {
				t.Fatal(err)
			}
			db.Close()
		}, nil, keyjar.ErrCorrupt},
		{"newer schema version", jarOfVersion(99, false), nil, keyjar.ErrVersion},
		{"locked new file", func(t *testing.T, path string) {
			t.Cleanup(lockFile(t, path, false))
		}, &keyjar.Options{BusyTimeout: 20 * time.Millisecond}, keyjar.ErrLocked},
		{"new WAL file in a write transaction", func(t *testing.T, path string) {
			// Open must create the schema, under the write lock.
			db := rawDB(t, path, "?_pragma=journal_mode(WAL)")
			if err := db.Ping(); err != nil {
				t.Fatal(err)
			}
			db.Close()
			t.Cleanup(lockFile(t, path, false))
		}, &keyjar.Options{BusyTimeout: 20 * time.Millisecond}, keyjar.ErrLocked},
		{"jar in locking_mode=EXCLUSIVE", func(t *testing.T, path string) {
			newJarFile(t, path)
			t.Cleanup(lockFile(t, path, true))
		}, &keyjar.Options{BusyTimeout: 20 * time.Millisecond}, keyjar.ErrLocked},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			c.setup(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			j, err := keyjar.Open(t.Context(), path, c.opts)
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Open: err = %v; want %v", err, c.want)
			}
			prefixOnce(t, "Open", err)
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("Open changed the file (%d bytes, was %d)", len(after), len(before))
			}
		})
	}
}

// writeInProgress holds a write transaction on the jar at path through
// another connection, as another process writing to it would: BEGIN
// IMMEDIATE, then a new operation "uncommitted" and a note on every
// operation, none of it committed. It returns the rollback.
func writeInProgress(t *testing.T, path string) (rollback func()) {
	t.Helper()
	db := rawDB(t, path, "?_txlock=immediate&_pragma=busy_timeout(5000)")
	tx, err := beginWrite(db)
	if err != nil {
		t.Fatal(err)
	}
	return func() { tx.Rollback(); db.Close() }
}

// beginWrite begins an IMMEDIATE transaction on db (opened with
// _txlock=immediate) and writes in it what writeInProgress says.
func beginWrite(db *sql.DB) (*sql.Tx, error) {
	tx, err := db.Begin()
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(`INSERT INTO operations (op, key, fingerprint, state, method, url, body_size,
		attempts, last_status, last_error, note, holder)
		VALUES ('uncommitted', 'key-uncommitted', 'fp', 'pending', 'POST', 'http://127.0.0.1/charge', 0, 0, 0, '', '', '')`)
	if err == nil {
		_, err = tx.Exec("UPDATE operations SET note = 'uncommitted'")
	}
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// TestOpenWhileAnotherWrites: another connection or process holds a write
// transaction on a jar whose schema is current. Open needs no write lock
// then: it succeeds within a busy timeout far shorter than the writer
// holds on, and Get and List read the committed state, as WAL readers do.
// Writes still wait for the writer and fail with ErrLocked past the busy
// timeout; once the writer is gone, they succeed.
// TestOpenInMissingDirectory: Open creates the file, not its directory, and
// its error says so, naming the path once.
func TestOpenInMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "keys.db")
	_, err := keyjar.Open(t.Context(), path, nil)
	if !errors.Is(err, fs.ErrNotExist) || strings.Count(err.Error(), path) != 1 || !strings.Contains(err.Error(), "not its directory") {
		t.Fatalf("Open in a missing directory: %v; want fs.ErrNotExist, the path once, and that the directory is not created", err)
	}
}

func TestOpenWhileAnotherWrites(t *testing.T) {
	for _, c := range []struct {
		name string
		hold func(t *testing.T, path string) (release func())
	}{
		{"connection", writeInProgress},
		{"process", writeInProgressElsewhere},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "keys.db")
			newJarFile(t, path)
			release := c.hold(t, path)
			j, err := keyjar.Open(ctx, path, &keyjar.Options{BusyTimeout: 20 * time.Millisecond})
			if err != nil {
				release()
				t.Fatalf("Open while another writes: %v; want the jar", err)
			}
			defer j.Close()
			if r, err := j.Get(ctx, "op"); err != nil || r.Key != "key-op" || r.Note != "" {
				t.Errorf("Get(op) = key %q, note %q, %v; want key-op without a note, as committed", r.Key, r.Note, err)
			}
			if _, err := j.Get(ctx, "uncommitted"); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Get(uncommitted) = %v; want ErrNotFound", err)
			}
			if recs, err := j.List(ctx, idem.Filter{}); err != nil || len(recs) != 1 || recs[0].Op != "op" {
				t.Errorf("List = %d records, %v; want op alone", len(recs), err)
			}
			_, _, err = j.Begin(ctx, newRecord("op2"))
			if !errors.Is(err, keyjar.ErrLocked) {
				t.Errorf("Begin while another writes: %v; want ErrLocked", err)
			}
			prefixOnce(t, "Begin while another writes", err)
			release()
			if _, created, err := j.Begin(ctx, newRecord("op2")); err != nil || !created {
				t.Errorf("Begin after the writer is gone = created %v, %v; want created", created, err)
			}
		})
	}
}

// TestLongBusyTimeoutWaits: a BusyTimeout beyond what SQLite's 32-bit
// busy_timeout holds (30 days) still waits for a lock, rather than not at
// all: the caller's deadline, here 100 ms, ends the wait, not ErrLocked.
func TestLongBusyTimeoutWaits(t *testing.T) {
	j, path := openTemp(t, &keyjar.Options{BusyTimeout: 30 * 24 * time.Hour})
	unlock := lockFile(t, path, false)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, _, err := j.Begin(ctx, newRecord("op"))
	unlock() // the committer, still waiting, then goes on and Close returns
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin on a locked file with BusyTimeout 30 days: %v; want the caller's deadline, not ErrLocked", err)
	}
}

// TestBusyTimeout: every connection of a jar, the writer's and the
// readers', waits Options.BusyTimeout for another's lock, 5 s when it is
// zero, in a new file and in an existing one (whose Open briefly sets the
// writer's to 0 to check that it may write). The writer's busy_timeout is
// at most 100 ms, a slice of its wait (the committer waits in slices,
// TestWithdrawnWritesStopWaitingForLock), and its write waits the whole
// BusyTimeout all the same.
func TestBusyTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	for _, c := range []struct {
		name string
		opts *keyjar.Options
		want int // ms
	}{
		{"new file, nil Options", nil, 5000},
		{"existing file, nil Options", nil, 5000},
		{"zero BusyTimeout", &keyjar.Options{}, 5000},
		{"BusyTimeout 250ms", &keyjar.Options{BusyTimeout: 250 * time.Millisecond}, 250},
	} {
		j := openPath(t, path, c.opts)
		writer, reader, err := keyjar.BusyTimeouts(t.Context(), j)
		if err != nil || writer != min(c.want, 100) || reader != c.want {
			t.Errorf("%s: busy_timeout %d ms on the writer, %d on a reader, %v; want %d and %d", c.name, writer, reader, err, min(c.want, 100), c.want)
		}
		if c.want == 250 {
			unlock := lockFile(t, path, false)
			start := time.Now()
			_, _, err := j.Begin(t.Context(), newRecord("op-locked"))
			took := time.Since(start)
			unlock()
			if !errors.Is(err, keyjar.ErrLocked) || took < 250*time.Millisecond {
				t.Errorf("%s: Begin while another writes: %v after %v; want ErrLocked after 250ms", c.name, err, took)
			}
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(b []byte) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenEmptyFile: an empty file is a new jar.
func TestOpenEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	writeFile(nil)(t, path)
	j := openPath(t, path, nil)
	if _, _, err := j.Begin(t.Context(), newRecord("op")); err != nil {
		t.Fatal(err)
	}
}

// TestOpenWithoutCreating: an Open with MustExist (idemctl's) opens an
// existing jar and creates nothing: not a missing file, not one removed
// after Open checked it and before SQLite opens it, not a jar in an empty
// file.
func TestOpenWithoutCreating(t *testing.T) {
	ctx := t.Context()
	opts := &keyjar.Options{MustExist: true}
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.db")
	newJarFile(t, path)
	j, err := keyjar.Open(ctx, path, opts)
	if err != nil {
		t.Fatalf("an existing jar: %v", err)
	}
	if _, err := j.Get(ctx, "op"); err != nil {
		t.Fatalf("an existing jar's operation: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	removed := false
	remove := func(path string) {
		removed = true
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
	_, err = keyjar.OpenHooked(ctx, path, opts, keyjar.Hooks{Checked: remove})
	if _, serr := os.Stat(path); !removed || !errors.Is(err, fs.ErrNotExist) || !errors.Is(serr, fs.ErrNotExist) {
		t.Fatalf("the file removed after the check (%v): %v, then %v; want fs.ErrNotExist, and no file", removed, err, serr)
	}
	if _, err := keyjar.Open(ctx, path, opts); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v; want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the open of a missing file: %v; want no file", err)
	}

	writeFile(nil)(t, path)
	if _, err := keyjar.Open(ctx, path, opts); !errors.Is(err, keyjar.ErrCorrupt) || !strings.Contains(err.Error(), "is empty: it holds no operation") {
		t.Fatalf("an empty file: %v; want ErrCorrupt saying it is empty and holds no operation", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty file after the open: %v, %v; want it left empty", fi, err)
	}
}

// TestOpenDeadline: Open keeps the caller's deadline while another
// connection holds the file, even with a long busy timeout.
func TestOpenDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, path)
	unlock := lockFile(t, path, true)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	abandoned := make(chan struct{})
	j, err := keyjar.OpenHooked(ctx, path, &keyjar.Options{BusyTimeout: time.Minute}, keyjar.Hooks{Abandoned: func() { close(abandoned) }})
	if !errors.Is(err, context.DeadlineExceeded) || j != nil {
		unlock()
		t.Fatalf("Open on a locked file = %v, %v; want nil, DeadlineExceeded", j, err)
	}
	// The opening goes on aside until the lock is free, and then closes
	// the jar it opened: wait for it, which writes in the directory, before
	// the directory is removed.
	unlock()
	<-abandoned
}

// TestOpenBadOptions: each option out of range is ErrOptions, naming the
// field, with "keyjar:" once, and nothing is created. A MaxBatch too large
// to allocate its queue made Open panic after creating the file.
func TestOpenBadOptions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	for _, c := range []struct {
		o     keyjar.Options
		field string
	}{
		{keyjar.Options{BusyTimeout: -1}, "BusyTimeout"},
		{keyjar.Options{MaxBatch: -1}, "MaxBatch"},
		{keyjar.Options{MaxBatch: 1<<16 + 1}, "MaxBatch"},
		{keyjar.Options{MaxBatch: math.MaxInt}, "MaxBatch"},
	} {
		j, err := keyjar.Open(t.Context(), path, &c.o)
		if err == nil {
			j.Close()
			t.Errorf("Open with %+v succeeded; want ErrOptions", c.o)
			continue
		}
		if !errors.Is(err, keyjar.ErrOptions) || !strings.Contains(err.Error(), c.field) || strings.Count(err.Error(), "keyjar:") != 1 {
			t.Errorf("Open with %+v: %v; want ErrOptions naming %s, with keyjar: once", c.o, err, c.field)
		}
	}
	j, err := keyjar.Open(t.Context(), filepath.Join(t.TempDir(), "max.db"), &keyjar.Options{MaxBatch: 1 << 16})
	if err != nil {
		t.Fatalf("Open with MaxBatch 65536: %v; want it open", err)
	}
	j.Close()
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused Open created the file: %v", err)
	}
}

// TestOpenEmptyPath: an empty path names no file, as for os.Open: Open
// refuses it with an error matching fs.ErrNotExist, with or without
// MustExist, and creates nothing in the working directory.
func TestOpenEmptyPath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, o := range []*keyjar.Options{nil, {MustExist: true}} {
		j, err := keyjar.Open(t.Context(), "", o)
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "empty path") {
			t.Errorf("Open(\"\", %+v) = %v; want fs.ErrNotExist, saying the path is empty", o, err)
		}
		prefixOnce(t, "Open(\"\")", err)
	}
	if got := dirNames(t, dir); len(got) != 0 {
		t.Errorf("after the refused opens, the working directory holds %q; want nothing", got)
	}
}

// TestConcurrentOpenOfNewFile opens one new file from several connections at
// once, as processes starting together do: all of them open it, and it is a
// jar once.
func TestConcurrentOpenOfNewFile(t *testing.T) {
	for round := range 20 {
		path := filepath.Join(t.TempDir(), fmt.Sprint("keys-", round, ".db"))
		const n = 4
		errs := make(chan error, n)
		jars := make(chan *keyjar.Jar, n)
		for range n {
			go func() {
				j, err := keyjar.Open(t.Context(), path, nil)
				if err == nil {
					jars <- j
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: Open: %v", round, err)
			}
		}
		for range n {
			j := <-jars
			if _, _, err := j.Begin(t.Context(), newRecord("op")); err != nil {
				t.Fatalf("round %d: Begin: %v", round, err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The reference server's database beside a jar is an easy file to give
// Open by mistake: the error names it, and the file is left as it was.
func TestOpenServerDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemserver.db")
	st, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := keyjar.Open(t.Context(), path, nil)
	if err == nil {
		j.Close()
	}
	if !errors.Is(err, keyjar.ErrCorrupt) || !strings.Contains(err.Error(), "reference server's database") {
		t.Fatalf("Open of an idemserver database: %v; want ErrCorrupt naming the reference server's database", err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Errorf("Open changed the server's database (%v)", err)
	}
}

// TestOpenDirectory: a directory is no jar, as a FIFO is not: Open says so
// with ErrCorrupt, read-only too, and a symbolic link to it is the same.
func TestOpenDirectory(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(t.TempDir(), "link.db")
	paths := []string{dir}
	if err := os.Symlink(dir, link); err == nil {
		paths = append(paths, link)
	}
	for _, path := range paths {
		for _, opts := range []*keyjar.Options{nil, {ReadOnly: true}} {
			j, err := keyjar.Open(t.Context(), path, opts)
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, keyjar.ErrCorrupt) || !strings.Contains(err.Error(), "is a directory") {
				t.Errorf("Open(%s, %+v) = %v; want ErrCorrupt saying it is a directory", path, opts, err)
			}
		}
	}
}

// TestOpenPathOfAnyName: the path is a file name, never read as a URI: a
// directory and a file whose names hold spaces, non-ASCII letters, '?',
// '#', '%' escapes, '&' and '=' hold the jar under exactly those names, and a
// second Open finds it there. So do ":memory:" and the URIs SQLite reads as
// a database in memory, which would lose the keys with the process: opened
// relative to the working directory, as here, each is a file there.
func TestOpenPathOfAnyName(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "dir ü?#%20")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, name := range []string{"ke ys.db", "clé€.db", "keys.db?mode=ro", "keys#frag.db", "100%25.db", "a&vfs=memdb.db", "file:keys.db",
		":memory:", "file::memory:", "file:keys.db?mode=memory&cache=shared"} {
		newJarFile(t, name)
		for d, want := range map[string][]string{top: {filepath.Base(dir)}, dir: jarFiles(name)} {
			if got := dirNames(t, d); !slices.Equal(got, want) {
				t.Fatalf("after the jar %q was closed, %s holds %q; want %q alone", name, d, got, want)
			}
		}
		if fi, err := os.Stat(name); err != nil || fi.Size() == 0 {
			t.Fatalf("the jar %q is empty or missing after a Begin: %v", name, err)
		}
		j := openPath(t, name, nil)
		if r, err := j.Get(t.Context(), "op"); err != nil || r.Key != "key-op" {
			t.Errorf("jar %q reopened: key %q, %v; want key-op", name, r.Key, err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		for _, f := range jarFiles(name) {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// jarFiles returns the names of the files of the jar named name, as
// os.ReadDir sorts them: the jar file, and the -shm and -wal files that
// SQLite keeps beside it, which Close leaves in place.
func jarFiles(name string) []string {
	return []string{name, name + "-shm", name + "-wal"}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestOpenPathWithTrailingSeparator: "keys.db/" names a directory, as it
// does for os.Open, never the file keys.db, which filepath.Abs would find
// by cleaning the separator away. Open refuses it as os.Open does (ENOTDIR
// for the file, fs.ErrNotExist for nothing there), with or without
// MustExist, and creates nothing.
func TestOpenPathWithTrailingSeparator(t *testing.T) {
	dir := t.TempDir()
	jar := filepath.Join(dir, "keys.db")
	newJarFile(t, jar)
	sep := string(filepath.Separator)
	for _, c := range []struct {
		path string
		want error
	}{
		{jar + sep, syscall.ENOTDIR},
		{filepath.Join(dir, "new.db") + sep, fs.ErrNotExist},
	} {
		for _, o := range []*keyjar.Options{nil, {MustExist: true}} {
			j, err := keyjar.Open(t.Context(), c.path, o)
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), "ends in a separator") {
				t.Errorf("Open(%s, %+v) = %v; want %v, naming the path and its separator", c.path, o, err, c.want)
			}
			prefixOnce(t, "Open("+c.path+")", err)
		}
	}
	if got, want := dirNames(t, dir), jarFiles("keys.db"); !slices.Equal(got, want) {
		t.Errorf("after the refused opens, %s holds %q; want %q alone", dir, got, want)
	}
	if j, err := keyjar.Open(t.Context(), dir+sep, nil); !errors.Is(err, keyjar.ErrCorrupt) {
		if err == nil {
			j.Close()
		}
		t.Errorf("Open(%s) = %v; want ErrCorrupt: a directory", dir+sep, err)
	}
}

// v1Pending are the pending operations of the jar jarV1 writes, in List's
// order: one created at the zero time, then by time.
var v1Pending = []string{"op-000", "op-100", "op-200"}

// jarV1 returns a setup that writes a jar of schema version 1 at path, in
// WAL mode, holding 300 operations: those of v1Pending pending, the others
// done, with headers and bodies. The connection that wrote it stays open
// until the test ends when keepOpen is set, so that its -wal and -shm files
// stay too.
func jarV1(keepOpen bool) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		db := rawDB(t, path, "")
		var mode string
		if err := db.QueryRow("PRAGMA journal_mode = WAL").Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("journal_mode = %q, %v", mode, err)
		}
		if _, err := db.Exec(keyjar.SchemaV1 + fmt.Sprintf("PRAGMA application_id = %d; PRAGMA user_version = 1", keyjar.ApplicationID)); err != nil {
			t.Fatal(err)
		}
		t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()
		for i := range 300 {
			state, created := "done", any(t0+int64(i)*int64(time.Second))
			if slices.Contains(v1Pending, fmt.Sprintf("op-%03d", i)) {
				state = "pending"
			}
			if i == 0 {
				created = nil // the zero time
			}
			if _, err := db.Exec(`INSERT INTO operations VALUES (?, ?, 'fp', ?, 'POST', 'http://127.0.0.1/charges',
				'{"Content-Type":["application/json"]}', ?, ?, ?, ?, 1, 201, '', NULL, 'n', '', NULL)`,
				fmt.Sprintf("op-%03d", i), fmt.Sprint("key-", i), state, fmt.Appendf(nil, `{"n":%d}`, i),
				len(fmt.Sprintf(`{"n":%d}`, i)), created, t0); err != nil {
				t.Fatal(err)
			}
		}
		if !keepOpen {
			db.Close()
		}
	}
}

// dump returns every row of the jar file at path's operations table, in
// op order, and its schema: the SQL of its table and indexes, by name,
// and its user_version.
func dump(t *testing.T, path string) (rows, schema []string) {
	t.Helper()
	db := rawDB(t, path, "")
	defer db.Close()
	r, err := db.Query("SELECT * FROM operations ORDER BY op")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cols, _ := r.Columns()
	for r.Next() {
		v := make([]any, len(cols))
		p := make([]any, len(v))
		for i := range v {
			p[i] = &v[i]
		}
		if err := r.Scan(p...); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, fmt.Sprintf("%q", v))
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	s, err := db.Query("SELECT name, sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for s.Next() {
		var name, stmt string
		if err := s.Scan(&name, &stmt); err != nil {
			t.Fatal(err)
		}
		schema = append(schema, name+": "+strings.Join(strings.Fields(stmt), " "))
	}
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return rows, append(schema, fmt.Sprint("user_version: ", v))
}

// TestMigrateFromVersion1: Open upgrades a jar of schema version 1 to the
// current version: it keeps every row as it was, ends with the schema (and
// user_version) a new jar has, and its walk of the pending operations is
// read from the index on (state, created, op).
func TestMigrateFromVersion1(t *testing.T) {
	_, fresh := openTemp(t, nil)
	_, want := dump(t, fresh)
	for name, opts := range map[string]*keyjar.Options{"default": nil} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			jarV1(false)(t, path)
			before, _ := dump(t, path)
			j := openPath(t, path, opts)
			ctx := t.Context()
			pending, err := j.List(ctx, idem.Filter{State: idem.StatePending})
			if got := opsOf(pending); err != nil || !slices.Equal(got, v1Pending) {
				t.Errorf("List(pending) = %v, %v; want %v", got, err, v1Pending)
			}
			if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 300 {
				t.Errorf("List() = %d records, %v; want 300", len(all), err)
			}
			r, err := j.Get(ctx, "op-100")
			if err != nil || r.State != idem.StatePending || string(r.Body) != `{"n":100}` ||
				r.Header.Get("Content-Type") != "application/json" {
				t.Errorf("Get(op-100) = %+v, %v; want the stored request, pending", r, err)
			}
			plan, err := keyjar.ListPlan(ctx, j, idem.Filter{State: idem.StatePending, Limit: 1000})
			if want := "SEARCH operations USING INDEX operations_by_state_created (state=?)"; err != nil ||
				!slices.Equal(plan, []string{want}) {
				t.Errorf("plan of the pending walk: %q, %v; want %q", plan, err, want)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			after, schema := dump(t, path)
			if !slices.Equal(after, before) {
				t.Errorf("the rows changed in the migration:\n%s\nwere\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
			}
			if !slices.Equal(schema, want) {
				t.Errorf("schema after the migration:\n%s\nwant a new jar's:\n%s", strings.Join(schema, "\n"), strings.Join(want, "\n"))
			}
			if got := integrityCheck(t, path); got != "ok" {
				t.Errorf("integrity_check after the migration: %s", got)
			}
		})
	}
}

// TestMustExistDoesNotUpgrade: an Open with MustExist of a jar of schema
// version 1 refuses it with ErrOldVersion, naming its version, and leaves
// it as it was (its rows, its schema, its user_version), as pgjar's does:
// after an upgrade, a program built with the earlier version refuses the
// jar. It is no ErrReadOnly: MustExist's Open may write. Before, it
// upgraded the jar.
func TestMustExistDoesNotUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	jarV1(false)(t, path)
	before, schema := dump(t, path)
	_, err := keyjar.Open(t.Context(), path, &keyjar.Options{MustExist: true})
	if !errors.Is(err, keyjar.ErrOldVersion) || errors.Is(err, keyjar.ErrReadOnly) || !strings.Contains(err.Error(), "version 1,") {
		t.Fatalf("Open with MustExist of a version 1 jar: %v; want ErrOldVersion naming version 1, not ErrReadOnly", err)
	}
	after, schemaAfter := dump(t, path)
	if !slices.Equal(after, before) || !slices.Equal(schemaAfter, schema) {
		t.Errorf("the jar changed:\n%s\n%s\nwas\n%s\n%s", strings.Join(after, "\n"), strings.Join(schemaAfter, "\n"),
			strings.Join(before, "\n"), strings.Join(schema, "\n"))
	}
}

// TestReadOnlyVersion1: a read-only Open of a jar of schema version 1,
// whose upgrade would be a write, reads it as it is, without the index on
// (state, created, op): Get, List (with a State too, and in pages) and
// ByKey find what a jar of the current version holds, and the jar stays
// as it was, at version 1.
func TestReadOnlyVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	jarV1(true)(t, path) // its -wal and -shm files kept, as a program that has it open keeps them
	before := untouched(t, path)
	ro := openPath(t, path, readOnly)
	ctx := t.Context()
	if got, err := ro.List(ctx, idem.Filter{State: idem.StatePending}); err != nil || !slices.Equal(opsOf(got), v1Pending) {
		t.Errorf("read-only List(pending) of a version 1 jar = %v, %v; want %v", opsOf(got), err, v1Pending)
	}
	page, err := ro.List(ctx, idem.Filter{State: idem.StatePending, After: idem.Cursor{Op: "op-000"}, Limit: 1})
	if want := v1Pending[1:2]; err != nil || !slices.Equal(opsOf(page), want) {
		t.Errorf("read-only List(pending) after op-000 = %v, %v; want %v", opsOf(page), err, want)
	}
	if all, err := ro.List(ctx, idem.Filter{}); err != nil || len(all) != 300 {
		t.Errorf("read-only List() = %d records, %v; want 300", len(all), err)
	}
	if r, err := ro.Get(ctx, "op-100"); err != nil || r.State != idem.StatePending || string(r.Body) != `{"n":100}` {
		t.Errorf("read-only Get(op-100) = %+v, %v; want the stored request, pending", r, err)
	}
	if found, err := ro.ByKey(ctx, "key-7"); err != nil || !slices.Equal(opsOf(found), []string{"op-007"}) {
		t.Errorf("read-only ByKey(key-7) = %v, %v; want op-007", opsOf(found), err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after := untouched(t, path); !maps.Equal(after, before) {
		t.Errorf("the read-only jar changed the jar's directory or files")
	}
	if _, schema := dump(t, path); !slices.Contains(schema, "user_version: 1") {
		t.Errorf("schema after the read-only jar: %q; want user_version 1", schema)
	}
}

func opsOf(rs []idem.Record) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Op)
	}
	return out
}

// TestReadOnlyVersion1WithoutWALFiles: a read-only Open of a jar of schema
// version 1 whose -wal and -shm files are missing (its last program closed
// it) refuses it with ErrOldVersion, as one with them: an Open for writing,
// which would create the files, would upgrade it too.
func TestReadOnlyVersion1WithoutWALFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	jarV1(false)(t, path)
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(path + suffix); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the version 1 jar's %s file: %v; want none", suffix, err)
		}
	}
	before := untouched(t, path)
	_, err := keyjar.Open(t.Context(), path, readOnly)
	if !errors.Is(err, keyjar.ErrOldVersion) || !errors.Is(err, keyjar.ErrReadOnly) || !strings.Contains(err.Error(), "schema version 1") {
		t.Fatalf("read-only Open of a version 1 jar without its -wal and -shm files: %v; want ErrOldVersion naming version 1", err)
	}
	prefixOnce(t, "Open", err)
	if after := untouched(t, path); !maps.Equal(after, before) {
		t.Errorf("the read-only Open changed the jar's directory or files")
	}
}
