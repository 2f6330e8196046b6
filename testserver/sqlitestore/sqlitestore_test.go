package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/sqlitestore"
	"github.com/idemkit/idem/testserver/storetest"
	"modernc.org/sqlite"
)

func open(t *testing.T, path string) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) testserver.Store {
		return open(t, filepath.Join(t.TempDir(), "keys.db"))
	})
}

func TestConformanceInMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) testserver.Store { return open(t, ":memory:") })
}

func TestClosed(t *testing.T) {
	storetest.RunClosed(t, func(t *testing.T) storetest.Closer {
		return open(t, filepath.Join(t.TempDir(), "keys.db"))
	}, sqlitestore.ErrClosed)
}

func TestFileModeAndPragmas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s := open(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("file mode %o; want 600", mode)
	}
	pragmas := map[string]string{"journal_mode": "wal", "synchronous": "2", "user_version": "2", "busy_timeout": "5000",
		"application_id": fmt.Sprint(sqlitestore.ApplicationID), "fullfsync": "1", "checkpoint_fullfsync": "1"}
	for pragma, want := range pragmas {
		var got string
		if err := s.DB().QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("PRAGMA %s = %s; want %s", pragma, got, want)
		}
	}
}

// TestFileRemovedBeforeSQLiteOpensIt removes the file between Open's
// creation of it (mode 0600) and SQLite's open. SQLite must not create it
// again, with the umask's mode, readable by others: Open fails with an
// error matching fs.ErrNotExist, and leaves no file.
func TestFileRemovedBeforeSQLiteOpensIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	removed := false
	s, err := sqlitestore.OpenHooked(context.Background(), path, nil, func(path string) {
		removed = true
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	})
	if err == nil {
		s.Close()
	}
	if fi, serr := os.Stat(path); serr == nil {
		t.Fatalf("the file removed before SQLite opened it: Open = %v, and a file of mode %o; want fs.ErrNotExist, and no file",
			err, fi.Mode().Perm())
	}
	if !removed || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the file removed before SQLite opened it (%v): Open = %v; want fs.ErrNotExist", removed, err)
	}
}

// Two stores on one file stand for two server processes.
func TestSharedFileOneWinner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	a, b := open(t, path), open(t, path)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	results := make(chan bool, 2*storetest.Racers)
	errs := make(chan error, 2*storetest.Racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 * storetest.Racers {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, ok, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: now.UnixNano() + int64(i)}, now)
			results <- ok
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	close(errs)
	won := 0
	for ok := range results {
		if ok {
			won++
		}
	}
	for err := range errs {
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claims won across two stores on one file; want 1", won)
	}
}

// TestFleet runs three server instances, each on a store of its own on
// one file, as server processes on one machine share it, one of them
// crashing mid-request (see storetest.RunFleet).
func TestFleet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	storetest.RunFleet(t, func(t *testing.T) testserver.Store { return open(t, path) })
}

// TestConcurrentOpenOfNewFile opens one new file from several stores at
// once, as server processes starting together do: every Open succeeds,
// although SQLite answers one of two connections switching the file to WAL
// mode at the same moment with SQLITE_BUSY at once, without waiting.
func TestConcurrentOpenOfNewFile(t *testing.T) {
	const n = 4
	for round := range 40 {
		path := filepath.Join(t.TempDir(), fmt.Sprint("keys-", round, ".db"))
		errs := make(chan error, n)
		for range n {
			go func() {
				s, err := sqlitestore.Open(context.Background(), path, nil)
				if err == nil {
					err = s.Close()
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: Open: %v", round, err)
			}
		}
	}
}

// TestReopenPathOfAnyName: the path is a file name, never read as a URI,
// as keyjar's: a directory and files whose names hold spaces, non-ASCII
// letters, '?', '#', '%' escapes, '&' and '=' hold the store under exactly
// those names, and a second Open finds the saved answer there.
func TestReopenPathOfAnyName(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "dir ü?#%20")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	for _, name := range []string{"keys.db", "ke ys.db", "clé€.db", "keys.db?mode=ro", "keys#frag.db", "100%25.db",
		"a&vfs=memdb.db", "file:keys.db"} {
		path := filepath.Join(dir, name)
		s, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		if _, ok, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 7}, now); !ok || err != nil {
			t.Fatalf("%q: Claim = %v, %v", name, ok, err)
		}
		if err := s.Save(ctx, "scope", "key", testserver.Fence{Token: 7}, testserver.Response{Status: 201, Body: []byte("saved")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		for d, want := range map[string]string{top: filepath.Base(dir), dir: name} {
			if got, err := os.ReadDir(d); err != nil || len(got) != 1 || got[0].Name() != want {
				t.Fatalf("after the store %q was closed, %s holds %v (%v); want %q alone", name, d, got, err, want)
			}
		}
		s = open(t, path)
		e, ok, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 8}, now)
		if err != nil || ok || e.Status != testserver.StatusDone || string(e.Response.Body) != "saved" {
			t.Fatalf("%q after reopen: claimed %v, %v, %+v; want the saved entry", name, ok, err, e)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	newer := filepath.Join(dir, "newer.db")
	s := open(t, newer)
	if _, err := s.DB().Exec("PRAGMA user_version = 99"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := sqlitestore.Open(context.Background(), newer, nil); !errors.Is(err, sqlitestore.ErrSchemaTooNew) {
		t.Errorf("Open of a newer schema = %v; want ErrSchemaTooNew", err)
	}
	if s, err := sqlitestore.Open(context.Background(), filepath.Join(dir, "missing", "x.db"), nil); err == nil {
		s.Close()
		t.Error("Open in a missing directory succeeded; want an error")
	}
}

// TestOpenEmptyPath: an empty path names no file, as for os.Open and
// keyjar.Open: Open refuses it with an error matching fs.ErrNotExist, and
// creates nothing in the working directory.
func TestOpenEmptyPath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	s, err := sqlitestore.Open(context.Background(), "", nil)
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "empty path") {
		t.Errorf("Open(\"\") = %v; want fs.ErrNotExist, saying the path is empty", err)
	}
	if got, err := os.ReadDir(dir); err != nil || len(got) != 0 {
		t.Errorf("after the refused Open, the working directory holds %v (%v); want nothing", got, err)
	}
}

// TestOpenBadOptions: a negative BusyTimeout is ErrOptions, naming the
// field, with "sqlitestore:" once, and no file is created, for a path or
// ":memory:"; zero is the default. It was taken for the default, as zero
// is, where keyjar.Open refuses it.
func TestOpenBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, busy := range []time.Duration{-1, -time.Second, math.MinInt64} {
		for _, path := range []string{filepath.Join(dir, "keys.db"), ":memory:"} {
			s, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Options{BusyTimeout: busy})
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, sqlitestore.ErrOptions) || !strings.Contains(err.Error(), "BusyTimeout") || strings.Count(err.Error(), "sqlitestore:") != 1 {
				t.Errorf("Open(%q) with BusyTimeout %v: %v; want ErrOptions naming BusyTimeout, with sqlitestore: once", path, busy, err)
			}
		}
	}
	if got, err := os.ReadDir(dir); err != nil || len(got) != 0 {
		t.Errorf("after the refused opens, the directory holds %v (%v); want nothing", got, err)
	}
}

// rawDB opens the SQLite file at path as another program would: its own
// connection, no pragmas of this package.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func execRaw(t *testing.T, path, query string) {
	t.Helper()
	db := rawDB(t, path)
	if _, err := db.Exec(query); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// pragma reads an integer pragma of the file at path.
func pragma(t *testing.T, path, name string) int64 {
	t.Helper()
	var v int64
	if err := rawDB(t, path).QueryRow("PRAGMA " + name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// openUnchanged calls open, closes what it opened, and returns its error;
// the test fails if the file at path is not byte for byte as it was.
func openUnchanged(t *testing.T, path string, open func() (io.Closer, error)) error {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sides := func() (names []string) { // the -wal and -shm files there are
		for _, suffix := range []string{"-wal", "-shm", "-journal"} {
			if _, err := os.Stat(path + suffix); err == nil {
				names = append(names, suffix)
			}
		}
		return names
	}
	sidesBefore := sides()
	c, err := open()
	if err == nil {
		c.Close()
	}
	if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(before, after) {
		t.Errorf("Open (err %v) changed %s: %v", err, path, rerr)
	}
	if sidesAfter := sides(); !slices.Equal(sidesBefore, sidesAfter) {
		t.Errorf("Open (err %v): the files beside %s were %q, now %q", err, path, sidesBefore, sidesAfter)
	}
	return err
}

// TestOpenForeign opens SQLite files of other programs, a client's key jar
// first, and files that are not SQLite databases: each is refused with
// ErrNotStore and left exactly as it was, with none of the store's tables
// added.
func TestOpenForeign(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"a client's key jar", func(t *testing.T, path string) {
			j, err := keyjar.Open(context.Background(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := idem.Record{Op: "op", Key: "key", Fingerprint: "fp", State: idem.StatePending, Method: "POST", URL: "https://example.com/"}
			if _, _, err := j.Begin(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"another program's database", func(t *testing.T, path string) {
			execRaw(t, path, "CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ann')")
		}},
		{"another program's database at user_version 1", func(t *testing.T, path string) {
			execRaw(t, path, "CREATE TABLE users (name TEXT); PRAGMA user_version = 1")
		}},
		{"an empty database of another application_id", func(t *testing.T, path string) {
			execRaw(t, path, "PRAGMA application_id = 305419896")
		}},
		{"a file that is not a SQLite database", func(t *testing.T, path string) {
			writeFile(t, path, []byte("this is not a database, not at all, really not"))
		}},
		{"a truncated SQLite header", func(t *testing.T, path string) {
			writeFile(t, path, []byte("SQLite format 3\x00\x10\x00"))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			c.setup(t, path)
			err := openUnchanged(t, path, func() (io.Closer, error) { return sqlitestore.Open(context.Background(), path, nil) })
			if !errors.Is(err, sqlitestore.ErrNotStore) {
				t.Fatalf("Open: %v; want ErrNotStore", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Open: error %q spans lines; want one", err)
			}
		})
	}
}

// TestOpenVersion1 opens a database of schema version 1, which kept no
// claim IDs, holding an answer saved and a claim in flight: Open adds the
// column and sets version 2; the answer is replayed, the claim is found
// under its token with the empty ID, and is fenced, taken over and saved
// as any other. A store of this version at version 1 would fail every
// statement, which names claim_id.
func TestOpenVersion1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	open(t, path).Close()
	// Back to version 1, its columns in the order it created them.
	execRaw(t, path, `ALTER TABLE idempotency_keys DROP COLUMN claim_id; PRAGMA user_version = 1;
		INSERT INTO idempotency_keys VALUES ('scope', 'done', 'fp', 'done', 201, '{}', X'6f6b', 5, 5);
		INSERT INTO idempotency_keys VALUES ('scope', 'held', 'fp', 'in_flight', NULL, NULL, NULL, 7, 7);`)

	s := open(t, path)
	if v := pragma(t, path, "user_version"); v != 2 {
		t.Fatalf("user_version %d after Open; want 2", v)
	}
	now := time.Unix(0, 9)
	e, ok, err := s.Claim(ctx, "scope", "done", "fp", testserver.Fence{Token: 9, ClaimID: "new"}, now)
	if err != nil || ok || e.Status != testserver.StatusDone || e.Response == nil || string(e.Response.Body) != "ok" {
		t.Fatalf("Claim of the answered key = %+v, claimed %v, %v; want its answer", e, ok, err)
	}
	held := testserver.Fence{Token: 7}
	e, ok, err = s.Claim(ctx, "scope", "held", "fp", testserver.Fence{Token: 7, ClaimID: "new"}, now)
	if err != nil || ok || e.Status != testserver.StatusInFlight || e.Fence != held {
		t.Fatalf("Claim of the key in flight = %+v, claimed %v, %v; want it in flight under %+v", e, ok, err, held)
	}
	if ok, err := s.Release(ctx, "scope", "held", testserver.Fence{Token: 7, ClaimID: "new"}); ok || err != nil {
		t.Fatalf("Release under its token with another ID = %v, %v; want false", ok, err)
	}
	over := testserver.Fence{Token: 8, ClaimID: "over"}
	if ok, err := s.TakeOver(ctx, "scope", "held", held, over); !ok || err != nil {
		t.Fatalf("TakeOver of the claim with the empty ID = %v, %v; want true", ok, err)
	}
	if err := s.Save(ctx, "scope", "held", over, testserver.Response{Status: 201}); err != nil {
		t.Fatalf("Save after the take-over: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, path).Close() // at version 2: opened as it is
	if v := pragma(t, path, "user_version"); v != 2 {
		t.Fatalf("user_version %d after a second Open; want 2", v)
	}
}

// TestOpenPreviousVersion opens a database of the previous version that
// set no application_id, which wrote the schema of version 1, with an
// application's tables beside the store's (as idemserver keeps PayCo's
// ledger): it opens, keeps its entries, and is marked as the store's.
func TestOpenPreviousVersion(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	s := open(t, path)
	now := time.Unix(1_700_000_000, 0)
	if _, ok, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 7}, now); !ok || err != nil {
		t.Fatalf("Claim = %v, %v", ok, err)
	}
	if err := s.Save(ctx, "scope", "key", testserver.Fence{Token: 7}, testserver.Response{Status: 201, Body: []byte("saved")}); err != nil {
		t.Fatal(err)
	}
	if _, err := payments.NewPayCo(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	execRaw(t, path, "ALTER TABLE idempotency_keys DROP COLUMN claim_id; PRAGMA user_version = 1; PRAGMA application_id = 0")

	for range 2 { // the first Open marks the file, the second finds it marked
		s = open(t, path)
		e, ok, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 8}, now)
		if err != nil || ok || e.Status != testserver.StatusDone || string(e.Response.Body) != "saved" {
			t.Fatalf("Claim after Open: claimed %v, %v, %+v; want the saved entry", ok, err, e)
		}
		payco, err := payments.NewPayCo(ctx, s.DB())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := payco.Charge(ctx, "pay-key", "order", 100, "eur"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if app := pragma(t, path, "application_id"); app != sqlitestore.ApplicationID {
			t.Fatalf("application_id %#x after Open; want %#x", app, sqlitestore.ApplicationID)
		}
	}
}

// TestKeyJarRefusesStore: keyjar.Open refuses the store's database, of this
// version and of the previous one, with keyjar.ErrCorrupt, and leaves it as
// it was.
func TestKeyJarRefusesStore(t *testing.T) {
	for _, previous := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "keys.db")
		s := open(t, path)
		if _, err := payments.NewPayCo(context.Background(), s.DB()); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if previous {
			execRaw(t, path, "PRAGMA application_id = 0")
		}
		err := openUnchanged(t, path, func() (io.Closer, error) { return keyjar.Open(context.Background(), path, nil) })
		if !errors.Is(err, keyjar.ErrCorrupt) {
			t.Errorf("keyjar.Open of a store's database (previous version %v): %v; want keyjar.ErrCorrupt", previous, err)
		}
	}
}

// TestClaimCommitFails makes the commit of a claim fail after its INSERT
// succeeded: an application's trigger on the store's table writes a row
// that breaks a deferred foreign key, which SQLite checks at COMMIT. The
// claim was not made, so Claim must not report it.
func TestClaimCommitFails(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "keys.db"))
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	// The store has one connection: the pragma holds for its statements.
	if _, err := s.DB().Exec(`PRAGMA foreign_keys = ON;
		CREATE TABLE parent (id INTEGER PRIMARY KEY);
		CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
		CREATE TRIGGER orphan AFTER INSERT ON idempotency_keys BEGIN INSERT INTO child VALUES (1); END`); err != nil {
		t.Fatal(err)
	}
	e, claimed, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 7}, now)
	if err == nil || claimed || e != (testserver.Entry{}) {
		t.Fatalf("Claim whose commit fails = %+v, claimed %v, %v; want the zero entry, unclaimed, an error", e, claimed, err)
	}
	if _, err := s.DB().Exec(`DROP TRIGGER orphan`); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := s.Claim(ctx, "scope", "key", "fp", testserver.Fence{Token: 8}, now); err != nil || !claimed {
		t.Fatalf("Claim after the failed commit = claimed %v, %v; want the key free", claimed, err)
	}
}

// TestLockedPastBusyTimeout: a write that waited BusyTimeout for another
// process's write lock fails with ErrLocked, as keyjar's does, so that a
// caller can tell a busy file from a broken one.
func TestLockedPastBusyTimeout(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := sqlitestore.Open(ctx, path, &sqlitestore.Options{BusyTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Unix(1_700_000_000, 0)
	if _, _, err := s.Claim(ctx, "", "held", "fp", testserver.Fence{Token: 1}, now); err != nil {
		t.Fatal(err)
	}
	// Another process holds the write lock.
	conn := otherProcess(t, path)
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")

	held := testserver.Fence{Token: 1}
	for name, write := range map[string]func() error{
		"Claim":    func() error { _, _, err := s.Claim(ctx, "", "k", "fp", testserver.Fence{Token: 2}, now); return err },
		"TakeOver": func() error { _, err := s.TakeOver(ctx, "", "held", held, testserver.Fence{Token: 3}); return err },
		"Save":     func() error { return s.Save(ctx, "", "held", held, testserver.Response{Status: 201}) },
		"Release":  func() error { _, err := s.Release(ctx, "", "held", held); return err },
		"Prune":    func() error { _, err := s.Prune(ctx, now.Add(time.Hour), 10); return err },
	} {
		if err := write(); !errors.Is(err, sqlitestore.ErrLocked) {
			t.Errorf("%s while another process holds the write lock: %v; want ErrLocked", name, err)
		}
	}
}

// TestOpenLockedPastBusyTimeout: Open of a store file in rollback-journal
// mode (made so by another program), while another process reads it, waits
// BusyTimeout for the locks it needs and then fails with ErrLocked, as a
// write does, not with an error a caller cannot tell from a broken file's:
// to check the schema, when the read began before Open, and to turn the
// file to WAL, when it began after that check.
func TestOpenLockedPastBusyTimeout(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	conn := otherProcess(t, path)
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode = DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode = DELETE: %q, %v", mode, err)
	}
	// A read transaction: a shared lock, which keeps the mode from changing.
	read := func() {
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	opts := &sqlitestore.Options{BusyTimeout: time.Millisecond}
	for _, when := range []string{"before Open", "after the schema check"} {
		var s *sqlitestore.Store
		var err error
		if when == "before Open" {
			read()
			s, err = sqlitestore.Open(ctx, path, opts)
		} else {
			s, err = sqlitestore.OpenHookedWAL(ctx, path, opts, read)
		}
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, sqlitestore.ErrLocked) {
			t.Errorf("Open while another process reads the file, from %s: %v; want ErrLocked", when, err)
		}
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
}

// otherProcess returns a connection to the SQLite file at path of its own,
// as another process opens it, closed when t ends.
func otherProcess(t *testing.T, path string) *sql.Conn {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// commitHook installs f as the commit hook of the store's one connection,
// until the test ends.
func commitHook(t *testing.T, s *sqlitestore.Store, f sqlite.CommitHookFn) {
	t.Helper()
	type hooker interface{ RegisterCommitHook(sqlite.CommitHookFn) }
	set := func(f sqlite.CommitHookFn) {
		conn, err := s.DB().Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.Raw(func(dc any) error { dc.(hooker).RegisterCommitHook(f); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	set(f)
	t.Cleanup(func() { set(nil) })
}

// TestWriteCommittedAsContextEnds: a Save, TakeOver or Release whose
// context ends while its statement runs, after SQLite committed it,
// reports what was done, not the context's error. modernc.org/sqlite
// returns the context's error whenever it ended during the statement,
// committed or interrupted: the Middleware would log a saved answer as a
// failed save, counted among its store errors, a claim released as one
// left in flight, and refuse a request whose take-over it made. A write
// rolled back as its context ends still fails.
//
// It runs in a synctest bubble so that the commit hook can wait for the
// driver's watcher goroutine to have seen the context end (synctest.Wait),
// instead of sleeping for it.
func TestWriteCommittedAsContextEnds(t *testing.T) {
	synctest.Test(t, testWriteCommittedAsContextEnds)
}

func testWriteCommittedAsContextEnds(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "keys.db"))
	now := time.Unix(1_700_000_000, 0)
	f, next := testserver.Fence{Token: 7, ClaimID: "c"}, testserver.Fence{Token: 8, ClaimID: "d"}
	// write runs w with a context that ends as SQLite commits its
	// statement, which the commit hook then lets through, or rolls back.
	write := func(commit bool, w func(ctx context.Context) error) error {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// On the connection the write runs on: the driver replaces one
		// that was interrupted.
		var armed atomic.Bool
		commitHook(t, s, func() int32 {
			if !armed.Load() {
				return 0
			}
			cancel()
			// The driver's watcher sees the context end, and interrupts
			// a statement that is committing already: once every other
			// goroutine of the bubble is blocked, it has.
			synctest.Wait()
			if commit {
				return 0
			}
			return 1 // rolled back
		})
		armed.Store(true)
		defer armed.Store(false)
		return w(ctx)
	}
	for _, key := range []string{"saved", "taken", "released", "rolled back"} {
		if _, claimed, err := s.Claim(context.Background(), "", key, "fp", f, now); err != nil || !claimed {
			t.Fatalf("Claim(%s): claimed %v, %v", key, claimed, err)
		}
	}
	if err := write(true, func(ctx context.Context) error {
		return s.Save(ctx, "", "saved", f, testserver.Response{Status: 201, Body: []byte("ok")})
	}); err != nil {
		t.Errorf("Save committed as its context ended: %v; want nil", err)
	}
	if err := write(true, func(ctx context.Context) error {
		won, err := s.TakeOver(ctx, "", "taken", f, next)
		if err == nil && !won {
			return errors.New("not won")
		}
		return err
	}); err != nil {
		t.Errorf("TakeOver committed as its context ended: %v; want won", err)
	}
	if err := write(true, func(ctx context.Context) error {
		released, err := s.Release(ctx, "", "released", f)
		if err == nil && !released {
			return errors.New("not released")
		}
		return err
	}); err != nil {
		t.Errorf("Release committed as its context ended: %v; want released", err)
	}
	if err := write(false, func(ctx context.Context) error {
		return s.Save(ctx, "", "rolled back", f, testserver.Response{Status: 201})
	}); !errors.Is(err, context.Canceled) {
		t.Errorf("Save rolled back as its context ended: %v; want context.Canceled", err)
	}

	other := testserver.Fence{Token: 9, ClaimID: "e"}
	if e, _, err := s.Claim(context.Background(), "", "saved", "fp", other, now); err != nil || e.Status != testserver.StatusDone || e.Response == nil || string(e.Response.Body) != "ok" {
		t.Errorf("the key saved as the context ended: %+v, %v; want it done with the answer", e, err)
	}
	if e, _, err := s.Claim(context.Background(), "", "taken", "fp", other, now); err != nil || e.Status != testserver.StatusInFlight || e.Fence != next {
		t.Errorf("the key taken over as the context ended: %+v, %v; want it in flight with the new fence", e, err)
	}
	if _, claimed, err := s.Claim(context.Background(), "", "released", "fp", other, now); err != nil || !claimed {
		t.Errorf("the key released as the context ended: claimed %v, %v; want it free", claimed, err)
	}
	if e, _, err := s.Claim(context.Background(), "", "rolled back", "fp", other, now); err != nil || e.Status != testserver.StatusInFlight || e.Fence != f {
		t.Errorf("the key whose save rolled back: %+v, %v; want it in flight with its claim's fence", e, err)
	}
}
