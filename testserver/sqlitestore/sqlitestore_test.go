package sqlitestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
	"github.com/idemkit/idem/testserver/storetest"
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
	for pragma, want := range map[string]string{"journal_mode": "wal", "synchronous": "2", "user_version": "1", "busy_timeout": "5000"} {
		var got string
		if err := s.DB().QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("PRAGMA %s = %s; want %s", pragma, got, want)
		}
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
			_, ok, err := s.Claim(ctx, "scope", "key", "fp", now.UnixNano()+int64(i), now)
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

func TestReopenKeepsEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Claim(ctx, "scope", "key", "fp", 7, now); !ok || err != nil {
		t.Fatalf("Claim = %v, %v", ok, err)
	}
	if err := s.Save(ctx, "scope", "key", 7, testserver.Response{Status: 201, Body: []byte("saved")}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	e, ok, err := s.Claim(ctx, "scope", "key", "fp", 8, now)
	if err != nil || ok || e.Status != testserver.StatusDone || string(e.Response.Body) != "saved" {
		t.Fatalf("after reopen: claimed %v, %v, %+v; want the saved entry", ok, err, e)
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
	for _, p := range []string{"", "file:x.db", "x.db?mode=ro", filepath.Join(dir, "missing", "x.db")} {
		if s, err := sqlitestore.Open(context.Background(), p, nil); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded; want an error", p)
		}
	}
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte("this is not a database, not at all, really not"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := sqlitestore.Open(context.Background(), garbage, nil); err == nil {
		s.Close()
		t.Error("Open of a non-database file succeeded; want an error")
	}
}
