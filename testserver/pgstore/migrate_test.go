package pgstore_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lockedV1 returns a database at version 1 holding a claim (see
// atVersion1), a pool on it, and a transaction of another session that
// holds a lock on the store's table until it ends, which version 2's
// ALTER TABLE waits for.
func lockedV1(t *testing.T) (string, *pgxpool.Pool, pgx.Tx) {
	t.Helper()
	dsn, pool, _ := atVersion1(t)
	lock, err := pgtest.Connect(t, dsn).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Rollback(context.Background()) })
	if _, err := lock.Exec(t.Context(), `LOCK TABLE idempotency_keys IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	return dsn, pool, lock
}

// TestMigrationTimeout: the upgrade of a version 1 store whose ALTER TABLE
// waits for another session's lock on the table, past a MigrationTimeout
// of 100 ms, fails with ErrMigrationTimeout saying which version and
// statement, that its transaction rolled back and the database is at
// version 1, and what to do; once the lock goes, an Open upgrades it, its
// claim kept. Before, the migration ran under QueryTimeout (5 s), and Open
// failed with the bare error ("pgstore: migrate: version 2: timeout:
// context deadline exceeded").
func TestMigrationTimeout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn, pool, lock := lockedV1(t)
	for name, opened := range map[string]func(*pgstore.Options) (*pgstore.Store, error){
		"Open": func(o *pgstore.Options) (*pgstore.Store, error) { return pgstore.Open(ctx, dsn, o) },
		"New":  func(o *pgstore.Options) (*pgstore.Store, error) { return pgstore.New(ctx, pool, o) },
	} {
		s, err := opened(&pgstore.Options{MigrationTimeout: 100 * time.Millisecond})
		if err == nil {
			s.Close()
		}
		var pgErr *pgconn.PgError
		if !errors.Is(err, pgstore.ErrMigrationTimeout) ||
			!errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &pgErr) && pgErr.Code == "57014") {
			t.Fatalf("%s while another session locks the table: %v; want ErrMigrationTimeout wrapping the timeout", name, err)
		}
		for _, want := range []string{`in schema "public"`, "version 2, statement 1 of 1",
			`ALTER TABLE "public".idempotency_keys`, "rolled back", "at version 1", "longer MigrationTimeout (100ms now)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v; want it to say %s", name, err, want)
			}
		}
		if v := versions(t, pool); !slices.Equal(v, []int32{1}) {
			t.Errorf("versions %v after the failed migration; want [1]", v)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, &pgstore.Options{MigrationTimeout: time.Minute})
	if v := versions(t, pool); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("versions %v once the lock went; want [1 2 3]", v)
	}
	if e, claimed, err := s.Claim(ctx, "s", "k-1", "fp", testserver.Fence{Token: 2, ClaimID: "new"}, t0); err != nil || claimed ||
		e.Status != testserver.StatusInFlight || e.Token != 1 {
		t.Errorf("Claim(s, k-1) = %+v, %v, %v; want the claim of version 1 in flight, token 1", e, claimed, err)
	}
}

// TestMigrationOutlastsQueryTimeout: the upgrade of a version 1 store whose
// ALTER TABLE waits for another session's lock longer than QueryTimeout
// (200 ms, as the server measures the wait) completes once the lock goes,
// under the default MigrationTimeout. Before, Open returned while the
// lock was held, with a timeout.
func TestMigrationOutlastsQueryTimeout(t *testing.T) {
	t.Parallel()
	dsn, pool, lock := lockedV1(t)
	const queryTimeout = 200 * time.Millisecond
	pgtest.OpensOnceUnlocked(t, dsn, lock, "ALTER TABLE", 2*queryTimeout, func() (io.Closer, error) {
		return pgstore.Open(t.Context(), dsn, &pgstore.Options{QueryTimeout: queryTimeout})
	})
	if v := versions(t, pool); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("versions %v after the migration; want [1 2 3]", v)
	}
}

// TestMigrationTimeoutWaitingForAnother: an Open that waits for another
// process's migration (its advisory lock) past MigrationTimeout fails with
// ErrMigrationTimeout saying that it waited for that lock, and creates
// nothing; once the lock goes, an Open creates the store.
func TestMigrationTimeoutWaitingForAnother(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	pgtest.WaitedForMigrationLock(t, dsn, pgstore.MigrateLock, pgstore.ErrMigrationTimeout, func(timeout time.Duration) (io.Closer, error) {
		return pgstore.Open(t.Context(), dsn, &pgstore.Options{MigrationTimeout: timeout})
	})
}
