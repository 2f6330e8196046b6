package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/refusetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Connect opens a connection to the database dsn names, for a test's own
// statements, closed when the test ends.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// InSchema creates schema (its name, which InSchema quotes) in the
// database that admin is connected to, and calls open while the search_path
// that admin's role gets there names schema alone, so that whatever open
// opens finds schema as its current_schema(). It then resets the role's
// search_path and the pool that open returns (pgxpool.Pool.Reset): the
// pool's connections from then on search "$user", public.
func InSchema(t testing.TB, admin *pgx.Conn, schema string, open func() *pgxpool.Pool) {
	t.Helper()
	if _, err := admin.Exec(t.Context(), `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	setRolePath(t, admin, pgx.Identifier{schema}.Sanitize())
	pool := open()
	setRolePath(t, admin, "")
	pool.Reset()
}

// setRolePath sets the search_path that the connections to conn's
// database, as conn's role, get from the role when they connect after it
// (ALTER ROLE … IN DATABASE … SET: other databases of the cluster keep
// theirs), or resets it when path is "". path is SQL: a list of
// identifiers.
func setRolePath(t testing.TB, conn *pgx.Conn, path string) {
	t.Helper()
	cfg := conn.Config()
	stmt := "ALTER ROLE " + pgx.Identifier{cfg.User}.Sanitize() + " IN DATABASE " +
		pgx.Identifier{cfg.Database}.Sanitize()
	if path == "" {
		stmt += " RESET search_path"
	} else {
		stmt += " SET search_path TO " + path
	}
	if _, err := conn.Exec(t.Context(), stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// Tables returns the tables of the database dsn names outside the
// system's schemas, as schema.table, comma-separated in order: "" for none.
func Tables(t testing.TB, dsn string) string {
	t.Helper()
	var tables string
	if err := Connect(t, dsn).QueryRow(t.Context(), `SELECT coalesce(string_agg(schemaname || '.' || tablename, ','
		ORDER BY schemaname, tablename), '') FROM pg_catalog.pg_tables
		WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	return tables
}

// AppRole creates, in the database dsn names (as a superuser), a role
// named after the database that may log in but create nothing in the
// schema public (CREATE on it is revoked from PUBLIC, as PostgreSQL 15
// does), runs each of grants, a GRANT statement up to its "TO", for that
// role, and returns a DSN that logs in as it: an application's role on
// tables that another role created.
func AppRole(t testing.TB, dsn string, grants ...string) string {
	t.Helper()
	admin := Connect(t, dsn)
	role := pgx.Identifier{admin.Config().Database + "_app"}.Sanitize()
	stmts := []string{`REVOKE CREATE ON SCHEMA public FROM PUBLIC`, `CREATE ROLE ` + role + ` LOGIN`}
	for _, g := range grants {
		stmts = append(stmts, g+` TO `+role)
	}
	for _, q := range stmts {
		if _, err := admin.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(admin.Config().Database + "_app")
	return u.String()
}

// RefusedCreate fails t unless err, what opening the tables of a package
// in schema as an AppRole that may not create them returned, is privilege
// (errors.Is), names schema (in schema "public"), says to open it once as
// a role that may, and wraps the server's refusal (SQLSTATE 42501); and
// unless the database dsn names holds no table.
func RefusedCreate(t testing.TB, dsn string, err, privilege error, schema string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.Is(err, privilege) || !strings.Contains(err.Error(), "in schema "+pgx.Identifier{schema}.Sanitize()) ||
		!strings.Contains(err.Error(), "once as a role that may") || !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("opened as a role that may not create the tables: %v; "+
			"want %v naming the schema and what to do, wrapping SQLSTATE 42501", err, privilege)
	}
	if tables := Tables(t, dsn); tables != "" {
		t.Errorf("tables %s after that; want none", tables)
	}
}

// RefusedOptions fails t unless err, what Open or New of package pkg
// (pgjar, pgstore) returned for what, options out of range, is errOptions
// (errors.Is), names field, and says "pkg:" once.
func RefusedOptions(t testing.TB, what string, err, errOptions error, field, pkg string) {
	t.Helper()
	if !errors.Is(err, errOptions) || !strings.Contains(err.Error(), field) || strings.Count(err.Error(), pkg+":") != 1 {
		t.Errorf("%s: %v; want %v naming %s, with %s: once", what, err, errOptions, field, pkg)
	}
}

// RefusedLock revokes EXECUTE on pg_advisory_xact_lock(bigint) from
// PUBLIC in the database dsn names (as a superuser: a superuser keeps
// it), calls open, as a role that may use the tables of a package but
// has no other grant of that function, and fails t unless open's error
// is privilege (errors.Is), names the function, and wraps the server's
// refusal (SQLSTATE 42501).
func RefusedLock(t testing.TB, dsn string, privilege error, open func() error) {
	t.Helper()
	const revoke = `REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_xact_lock(bigint) FROM PUBLIC`
	if _, err := Connect(t, dsn).Exec(t.Context(), revoke); err != nil {
		t.Fatalf("%s: %v", revoke, err)
	}
	err := open()
	var pgErr *pgconn.PgError
	if !errors.Is(err, privilege) || !strings.Contains(err.Error(), "pg_advisory_xact_lock(bigint)") ||
		!errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("opened as a role that may not execute pg_advisory_xact_lock: %v; "+
			"want %v naming the function, wrapping SQLSTATE 42501", err, privilege)
	}
}

// RefusedWrite checks that open, which opens a package's tables (in
// schema public) in the database a DSN names, refuses with privilege (errors.Is) a connection that could open them
// but never write them: one whose transactions are read-only
// (default_transaction_read_only, as on a hot standby), on a database
// without the tables (and creates none) and on one that holds them; and a
// role that may only read table, the one the package writes; and a role
// that may write table but not read table_schema, its record of versions.
// Each error must say read-only or name the table with what to grant.
// Before, the read-only and read-only-role cases opened, and every call
// that wrote then failed; the last failed with the server's bare
// "permission denied".
func RefusedWrite(t testing.TB, privilege error, table string, openCloser func(dsn string) (io.Closer, error)) {
	t.Helper()
	open := func(dsn string) error {
		c, err := openCloser(dsn)
		if err == nil {
			c.Close()
		}
		return err
	}
	const readOnly = "&default_transaction_read_only=on"
	empty := DB(t)
	if err := open(empty + readOnly); !errors.Is(err, privilege) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("opened read-only, on a database without the tables: %v; want %v saying read-only", err, privilege)
	}
	if tables := Tables(t, empty); tables != "" {
		t.Errorf("tables %s after that; want none", tables)
	}
	dsn := DB(t)
	if err := open(dsn); err != nil {
		t.Fatalf("open as the owner: %v", err)
	}
	if err := open(dsn + readOnly); !errors.Is(err, privilege) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("opened read-only, on a database that holds the tables: %v; want %v saying read-only", err, privilege)
	}
	reader := AppRole(t, dsn, `GRANT SELECT ON ALL TABLES IN SCHEMA public`)
	if err := open(reader); !errors.Is(err, privilege) || !strings.Contains(err.Error(), table) ||
		!strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE, DELETE") {
		t.Errorf("opened as a role that may only read the tables: %v; want %v naming %s and what to grant",
			err, privilege, table)
	}
	// Granted the table it writes, not the one of versions that every
	// Open reads: before, the server's bare "permission denied".
	versions := DB(t)
	if err := open(versions); err != nil {
		t.Fatalf("open as the owner: %v", err)
	}
	writer := AppRole(t, versions, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+table)
	if err := open(writer); !errors.Is(err, privilege) || !strings.Contains(err.Error(), table+`_schema"`) ||
		!strings.Contains(err.Error(), "GRANT SELECT ON") {
		t.Errorf("opened as a role that may write %s but not read %s_schema: %v; want %v naming it and what to grant",
			table, table, err, privilege)
	}
}

// UnparsedDSNs are connection strings that pgx cannot parse, each with the
// password "sec ret" (or "s3cret" whole) that an error must not show any
// piece of: pgx masks a key=value password to its first space, escaped or
// not, which leaves "ret" of "sec\ ret" in its message.
var UnparsedDSNs = []string{
	`host=127.0.0.1 password=sec\ ret sslmode=bogus`,
	`host=127.0.0.1 password='sec ret' sslmode=bogus`,
	`postgres://u:sec%20ret@127.0.0.1/x?sslmode=bogus`,
	`host=127.0.0.1 password=s3cret connect_timeout=zz`,
}

// RefusedUnparsed fails t unless err, what open returned for dsn, one of
// UnparsedDSNs, wraps a *pgconn.ParseConfigError and shows no piece of
// its password.
func RefusedUnparsed(t testing.TB, dsn string, err error) {
	t.Helper()
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) || strings.Contains(err.Error(), "ret") {
		t.Errorf("open %s: %v; want a *pgconn.ParseConfigError that shows no piece of the password", dsn, err)
	}
}

// SSLModePrefer returns dsn without its sslmode, so that pgx tries TLS
// first (sslmode prefer, its default), as a DSN of a user's would: the
// cluster refuses it, and a connection that fails says so in a line of its
// own before the cause.
func SSLModePrefer(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("sslmode")
	u.RawQuery = q.Encode()
	return u.String()
}

// RefusedConnect fails t unless open, pgjar's or pgstore's Open, refuses
// to connect, with the password hunter2 in the DSN, to a database that
// does not exist and to a server that is down (an address of
// refusetest.Addr) with an error that begins "pkg: connection to the
// database failed", says why once (the server's refusal, the refused
// dial) without the password, pgx's TLS attempt before it (sslmode
// prefer, the default) or the word migrate, and still matches the
// *pgconn.ConnectError and the server's *pgconn.PgError with errors.As.
func RefusedConnect(t testing.TB, dsn, pkg string, open func(dsn string) (io.Closer, error)) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "hunter2")
	u.Path, u.RawQuery = "/no_such_db", "connect_timeout=5" // sslmode prefer, pgx's default
	missing := u.String()
	down := "postgres://postgres:hunter2@" + refusetest.Addr(t) + "/idem?connect_timeout=5"
	for _, c := range []struct{ dsn, why, code string }{
		{missing, `database "no_such_db" does not exist (SQLSTATE 3D000)`, "3D000"},
		{down, "connection refused", ""},
	} {
		closer, err := open(c.dsn)
		if err == nil {
			closer.Close()
		}
		var (
			ce *pgconn.ConnectError
			pe *pgconn.PgError
		)
		msg := fmt.Sprint(err)
		if !strings.HasPrefix(msg, pkg+": connection to the database failed") || strings.Count(msg, c.why) != 1 ||
			strings.Contains(msg, "hunter2") || strings.Contains(msg, "tls") || strings.Contains(msg, "migrate") ||
			!errors.As(err, &ce) || (c.code != "" && (!errors.As(err, &pe) || pe.Code != c.code)) {
			t.Errorf("open %s: %v; want %q, saying %q once, without the password, pgx's TLS attempt or \"migrate\", matching *pgconn.ConnectError (and *pgconn.PgError %s)",
				c.dsn, err, pkg+": connection to the database failed", c.why, c.code)
		}
	}
}

// RefusedByPgBouncer fails t unless open, pgjar's or pgstore's Open,
// refuses a PgBouncer that takes none of the startup parameters idem sets
// (refusetest.PgBouncer) at its first refusal, without trying again, with
// an error that begins "pkg: connection to the database failed", quotes
// the refusal once, says to list the three parameters in
// ignore_startup_parameters, shows no password, and matches the server's
// *pgconn.PgError with errors.As.
func RefusedByPgBouncer(t testing.TB, pkg string, open func(dsn string) (io.Closer, error)) {
	t.Helper()
	addr, sessions := refusetest.PgBouncer(t)
	closer, err := open("postgres://ops:hunter2@" + addr + "/jars?connect_timeout=5")
	if err == nil {
		closer.Close()
		t.Fatal("open succeeded")
	}
	msg := err.Error()
	var pe *pgconn.PgError
	if !strings.HasPrefix(msg, pkg+": connection to the database failed") ||
		strings.Count(msg, "unsupported startup parameter: default_transaction_isolation") != 1 ||
		!strings.Contains(msg, "; behind a PgBouncer? list the startup parameters idem sets (default_transaction_isolation, statement_timeout, synchronous_commit) in its ignore_startup_parameters") ||
		strings.Contains(msg, "hunter2") || !errors.As(err, &pe) || pe.Code != "08P01" {
		t.Errorf("open: %v; want %q, quoting PgBouncer's refusal once, saying to list the three parameters in ignore_startup_parameters, without the password, matching *pgconn.PgError 08P01",
			err, pkg+": connection to the database failed")
	}
	if n := sessions(); n != 1 {
		t.Errorf("open sent %d startup messages; want 1: the refusal stays until PgBouncer's configuration changes", n)
	}
}

// PoolerMixUp fails t unless a call goes through on a session whose
// prepared statements are not those pgx's statement cache holds, as behind
// a pooler in transaction mode, which hands pgx another server session than
// the one it prepared on. open opens pgjar's or pgstore's Open on the DSN it
// is given, and returns the pool it opened and call, one of its statements.
// After call has run once, the pool's one connection is mixed up (see
// MixUp): its session forgets the statements pgx prepared (SQLSTATE 26000
// when pgx uses one) or holds one pgx is about to prepare (42P05). call
// must go through, run again at once in pgx's exec mode, and so must the
// call after; with default_query_exec_mode=exec in dsn, call prepares
// nothing by name and goes through too.
func PoolerMixUp(t *testing.T, dsn string, open func(dsn string) (*pgxpool.Pool, func() error)) {
	for _, code := range []string{"26000", "42P05"} {
		for _, exec := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/exec=%v", code, exec), func(t *testing.T) {
				u, err := url.Parse(dsn)
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("pool_max_conns", "1")
				if exec {
					q.Set("default_query_exec_mode", "exec")
				}
				u.RawQuery = q.Encode()
				pool, call := open(u.String())
				if err := call(); err != nil {
					t.Fatalf("first call: %v", err)
				}
				if err := MixUp(t.Context(), pool, code); err != nil {
					t.Fatal(err)
				}
				if err := call(); err != nil {
					t.Fatalf("call on a session whose prepared statements are not pgx's (%s): %v; want it through", code, err)
				}
				if err := call(); err != nil {
					t.Errorf("the call after: %v; want it through", err)
				}
			})
		}
	}
}

// MixUp makes the prepared statements of the session of a connection of
// pool (take one of pool_max_conns=1 for the connection a store uses)
// disagree with pgx's statement cache, as a pooler in transaction mode
// does when it hands pgx another server session: with code "26000" the
// session forgets them (DEALLOCATE ALL, sent behind pgx's back), and pgx's
// next use of one fails with SQLSTATE 26000 (prepared statement
// "stmtcache_…" does not exist); with "42P05" pgx forgets them and the
// session holds another statement under each name, and pgx's next
// preparation of one fails with 42P05 (… already exists). A session on
// which pgx prepared nothing (exec mode) is left as it is.
func MixUp(ctx context.Context, pool *pgxpool.Pool, code string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	pc := conn.Conn().PgConn()
	rr, err := pc.Exec(ctx, `SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'stmtcache_')`).ReadAll()
	if err != nil {
		return err
	}
	var names []string
	for _, r := range rr {
		for _, row := range r.Rows {
			names = append(names, string(row[0]))
		}
	}
	switch code {
	case "26000":
		_, err = pc.Exec(ctx, "DEALLOCATE ALL").ReadAll()
		return err
	case "42P05":
		if err := conn.Conn().DeallocateAll(ctx); err != nil {
			return err
		}
		for _, name := range names {
			if _, err := pc.Exec(ctx, "PREPARE "+pgx.Identifier{name}.Sanitize()+" AS SELECT 1").ReadAll(); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("mix up: SQLSTATE %q: want 26000 or 42P05", code)
}

// OpensOnceUnlocked runs open, which opens a package's tables in dsn's
// database, while lock, another session's transaction, holds a lock that
// one of its statements beginning with prefix waits for: it fails t if
// open returns before that statement has waited longer than d
// (pg_stat_activity, polled over a connection of its own, at most 100 000
// times: seconds, not forever), then ends lock and fails t unless open
// succeeds.
func OpensOnceUnlocked(t testing.TB, dsn string, lock pgx.Tx, prefix string, d time.Duration, open func() (io.Closer, error)) {
	t.Helper()
	opened := make(chan error, 1)
	go func() {
		c, err := open()
		if err == nil {
			err = c.Close()
		}
		opened <- err
	}()
	watcher := Connect(t, dsn)
	const polls = 100_000
	for i := 0; ; i++ {
		select {
		case err := <-opened:
			t.Fatalf("returned while another session held the lock: %v", err)
		default:
		}
		if i == polls {
			t.Fatalf("after %d polls, no statement %q… has waited %v for a lock", polls, prefix, d)
		}
		var n int
		if err := watcher.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND starts_with(query, $1)
			AND clock_timestamp() - query_start > $2`, prefix, d).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
	}
	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("open once the lock went: %v", err)
	}
}

// WaitedForMigrationLock checks that open, which opens a package's tables
// in dsn's empty database within a migration timeout, fails with timedOut
// (errors.Is) saying that it waited for the lock, and creates nothing,
// while another session holds lock (the package's advisory lock of
// migrations) past a timeout of 100 ms; and that it opens them once the
// lock goes.
func WaitedForMigrationLock(t testing.TB, dsn string, lock int64, timedOut error, open func(timeout time.Duration) (io.Closer, error)) {
	t.Helper()
	ctx := t.Context()
	other := Connect(t, dsn)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock); err != nil {
		t.Fatal(err)
	}
	c, err := open(100 * time.Millisecond)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, timedOut) || !strings.Contains(err.Error(), "waiting for the lock") {
		t.Fatalf("opened while another process migrates: %v; want %v saying it waited for the lock", err, timedOut)
	}
	if tables := Tables(t, dsn); tables != "" {
		t.Errorf("tables %s after the failed open; want none", tables)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock); err != nil {
		t.Fatal(err)
	}
	c, err = open(time.Minute)
	if err != nil {
		t.Fatalf("open once the lock went: %v", err)
	}
	c.Close()
}
