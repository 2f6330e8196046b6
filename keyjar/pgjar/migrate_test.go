package pgjar_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestMigrateFromVersion1: a jar of schema version 1 holding 20,000
// operations, 3 of them pending, is refused by an Open with MustExist
// (ErrNoJar: it does not upgrade), which changes nothing; an Open without
// it upgrades it to version 2 under the migration lock: every row is kept
// as it was, the indexes are a new jar's, and the walk of the pending
// operations reads them from idem_operations_by_state_created alone.
func TestMigrateFromVersion1(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	fresh := pgtest.DB(t)
	open(t, fresh, nil).Close()
	dsn := pgtest.DB(t)
	pool := newPool(t, dsn)
	if err := pgjar.MigrateToV1(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	if _, err := pool.Exec(ctx, `INSERT INTO idem_operations
		(op, key, fingerprint, state, method, url, header, body, body_size, created, updated, attempts, last_status,
			last_error, note, holder)
		SELECT 'op-' || lpad(i::text, 6, '0'), 'k' || i, 'fp', CASE WHEN i % 7000 = 1 THEN 'pending' ELSE 'done' END,
			'POST', 'http://127.0.0.1/', '{"Content-Type":["application/json"]}', convert_to('{"n":' || i || '}', 'UTF8'),
			length('{"n":' || i || '}'), CASE WHEN i = 1 THEN NULL ELSE $1::bigint + i::bigint * 1000 END,
			$1::bigint, 1, 201, '', 'n', ''
		FROM generate_series(1, 20000) AS i`, t0); err != nil {
		t.Fatal(err)
	}
	wantPending := []string{"op-000001", "op-007001", "op-014001"}
	conn := pgtest.Connect(t, dsn)
	state := func() (rows, versions string) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT
			(SELECT count(*) || ' ' || md5(string_agg(o::text, E'\n' ORDER BY op)) FROM idem_operations o),
			(SELECT string_agg(version::text, ',' ORDER BY version) FROM idem_operations_schema)`).Scan(&rows, &versions); err != nil {
			t.Fatal(err)
		}
		return rows, versions
	}
	rows, versions := state()
	if versions != "1" {
		t.Fatalf("versions %q before the migration; want 1", versions)
	}

	for _, what := range []string{"Open", "New"} {
		var (
			j   *pgjar.Jar
			err error
		)
		if what == "Open" {
			j, err = pgjar.Open(ctx, dsn, &pgjar.Options{MustExist: true})
		} else {
			j, err = pgjar.New(ctx, pool, &pgjar.Options{MustExist: true})
		}
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrOldVersion) || !errors.Is(err, pgjar.ErrNoJar) || !strings.Contains(err.Error(), "records version 1, not 2") ||
			!strings.Contains(err.Error(), "older schema version") || strings.Count(err.Error(), "pgjar: ") != 1 {
			t.Errorf("%s with MustExist of a version 1 jar: %v; want ErrOldVersion, matching ErrNoJar, saying it records version 1, not 2", what, err)
		}
		if r, v := state(); r != rows || v != "1" {
			t.Errorf("%s with MustExist changed the jar: versions %q", what, v)
		}
	}

	j := open(t, dsn, nil)
	if r, v := state(); r != rows || v != "1,2" {
		t.Errorf("after the migration: rows %s, versions %q; want the rows as they were (%s), versions 1,2", r, v, rows)
	}
	indexes := func(dsn string) string {
		t.Helper()
		var defs string
		if err := pgtest.Connect(t, dsn).QueryRow(ctx, `SELECT string_agg(indexdef, E'\n' ORDER BY indexname)
			FROM pg_indexes WHERE tablename = 'idem_operations'`).Scan(&defs); err != nil {
			t.Fatal(err)
		}
		return defs
	}
	if got, want := indexes(dsn), indexes(fresh); got != want {
		t.Errorf("indexes after the migration:\n%s\nwant a new jar's:\n%s", got, want)
	}
	pending, err := j.List(ctx, idem.Filter{State: idem.StatePending})
	var ops []string
	for _, r := range pending {
		ops = append(ops, r.Op)
	}
	if err != nil || !slices.Equal(ops, wantPending) {
		t.Errorf("List(pending) = %v, %v; want %v", ops, err, wantPending)
	}
	if r, err := j.Get(ctx, "op-007001"); err != nil || string(r.Body) != `{"n":7001}` ||
		r.Header.Get("Content-Type") != "application/json" || r.State != idem.StatePending {
		t.Errorf("Get(op-007001) = %+v, %v; want the stored request, pending", r, err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE idem_operations"); err != nil {
		t.Fatal(err)
	}
	scan := listScan(t, j, idem.Filter{State: idem.StatePending, Limit: 1000})
	if scan.IndexName != "idem_operations_by_state_created" || scan.ActualRows != len(wantPending) || scan.RowsRemoved != 0 {
		t.Errorf("the pending walk's scan: %+v; want idem_operations_by_state_created, reading the %d pending alone",
			scan, len(wantPending))
	}
	open(t, dsn, &pgjar.Options{MustExist: true}).Close() // current now
}

// lockedV1 returns a database at the jar's schema version 1 holding one
// pending operation, and a transaction of another session that holds a
// lock on idem_operations that the migration's CREATE INDEX waits for (an
// application's write in progress). The lock goes when the transaction
// ends.
func lockedV1(t *testing.T) (dsn string, lock pgx.Tx) {
	t.Helper()
	ctx := t.Context()
	dsn = pgtest.DB(t)
	if err := pgjar.MigrateToV1(ctx, newPool(t, dsn)); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(ctx, `INSERT INTO idem_operations
		(op, key, fingerprint, state, method, url, body_size, created, attempts, last_status, last_error, note, holder)
		VALUES ('op', 'key-op', 'fp', 'pending', 'POST', 'http://127.0.0.1/', 0, 1, 0, 0, '', '', '')`); err != nil {
		t.Fatal(err)
	}
	lock, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, `LOCK TABLE idem_operations IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return dsn, lock
}

// versions returns the versions idem_operations_schema records, as
// "1,2".
func versions(t *testing.T, dsn string) string {
	t.Helper()
	var v string
	if err := pgtest.Connect(t, dsn).QueryRow(t.Context(), `SELECT string_agg(version::text, ',' ORDER BY version)
		FROM idem_operations_schema`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMigrationTimeout: the upgrade of a version 1 jar whose CREATE INDEX
// waits for another session's lock on the table, past a MigrationTimeout of
// 100 ms, fails with ErrMigrationTimeout saying which version and
// statement, that its transaction rolled back and the jar is at version 1,
// and what to do; once the lock goes, an Open upgrades the jar, its
// operation kept. Before, the migration ran under QueryTimeout, and Open
// failed with the bare error: "pgjar: migrate: version 2: timeout: context
// deadline exceeded".
func TestMigrationTimeout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn, lock := lockedV1(t)
	for name, opened := range map[string]func(*pgjar.Options) (*pgjar.Jar, error){
		"Open": func(o *pgjar.Options) (*pgjar.Jar, error) { return pgjar.Open(ctx, dsn, o) },
		"New":  func(o *pgjar.Options) (*pgjar.Jar, error) { return pgjar.New(ctx, newPool(t, dsn), o) },
	} {
		j, err := opened(&pgjar.Options{MigrationTimeout: 100 * time.Millisecond})
		if err == nil {
			j.Close()
		}
		var pgErr *pgconn.PgError
		if !errors.Is(err, pgjar.ErrMigrationTimeout) ||
			!errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &pgErr) && pgErr.Code == "57014") {
			t.Fatalf("%s while another session locks the table: %v; want ErrMigrationTimeout wrapping the timeout", name, err)
		}
		for _, want := range []string{`in schema "public"`, "version 2, statement 1 of 1",
			`CREATE INDEX idem_operations_by_state_created ON "public".idem_operations`,
			"rolled back", "at version 1", "longer MigrationTimeout (100ms now)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v; want it to say %s", name, err, want)
			}
		}
		if v := versions(t, dsn); v != "1" {
			t.Errorf("versions %q after the failed migration; want 1", v)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	j := open(t, dsn, &pgjar.Options{MigrationTimeout: time.Minute})
	if v := versions(t, dsn); v != "1,2" {
		t.Errorf("versions %q once the lock went; want 1,2", v)
	}
	if r, err := j.Get(ctx, "op"); err != nil || r.Key != "key-op" {
		t.Errorf("Get(op) = %+v, %v; want the operation under its key", r, err)
	}
}

// TestMigrationOutlastsQueryTimeout: the upgrade of a version 1 jar whose
// CREATE INDEX waits for another session's lock longer than QueryTimeout
// (200 ms, as the server measures the wait) completes once the lock goes,
// under the default MigrationTimeout. Before, the migration ran under
// QueryTimeout: Open returned while the lock was held, with "pgjar:
// migrate: version 2: timeout: context deadline exceeded".
func TestMigrationOutlastsQueryTimeout(t *testing.T) {
	t.Parallel()
	dsn, lock := lockedV1(t)
	const queryTimeout = 200 * time.Millisecond
	pgtest.OpensOnceUnlocked(t, dsn, lock, "CREATE INDEX", 2*queryTimeout, func() (io.Closer, error) {
		return pgjar.Open(t.Context(), dsn, &pgjar.Options{QueryTimeout: queryTimeout})
	})
	if v := versions(t, dsn); v != "1,2" {
		t.Errorf("versions %q after the migration; want 1,2", v)
	}
}

// TestMigrationTimeoutWaitingForAnother: an Open that waits for another
// process's migration (its advisory lock) past MigrationTimeout fails with
// ErrMigrationTimeout saying that it waited for that lock, and creates
// nothing; once the lock goes, an Open creates the jar.
func TestMigrationTimeoutWaitingForAnother(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	pgtest.WaitedForMigrationLock(t, dsn, pgjar.MigrateLock, pgjar.ErrMigrationTimeout, func(timeout time.Duration) (io.Closer, error) {
		return pgjar.Open(t.Context(), dsn, &pgjar.Options{MigrationTimeout: timeout})
	})
}
