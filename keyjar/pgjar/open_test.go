package pgjar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestOpenWithoutCreating: an Open with MustExist (idemctl's) opens a
// database that holds the jar and creates nothing in one that does not:
// not the tables, not the table of versions, not the record of a version.
func TestOpenWithoutCreating(t *testing.T) {
	ctx := t.Context()
	mustExist := &pgjar.Options{MustExist: true}
	dsn := pgtest.DB(t)
	conn := pgtest.Connect(t, dsn)
	tables := func() string {
		t.Helper()
		var names string
		if err := conn.QueryRow(t.Context(), `SELECT coalesce(string_agg(tablename, ',' ORDER BY tablename), '')
			FROM pg_tables WHERE schemaname = current_schema()`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	refused := func(what, missing string) {
		t.Helper()
		before := tables()
		j, err := pgjar.Open(ctx, dsn, mustExist)
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrNoJar) || !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: Open = %v; want ErrNoJar saying %q", what, err, missing)
		}
		if after := tables(); after != before {
			t.Errorf("%s: tables %q after the Open; want %q, as before", what, after, before)
		}
	}

	refused("an empty database", `in schema "public" (no table idem_operations_schema)`)

	open(t, dsn, nil).Close() // creates the jar
	j, err := pgjar.Open(ctx, dsn, mustExist)
	if err != nil {
		t.Fatalf("a database with a jar: %v", err)
	}
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatalf("Begin in the jar opened: %v", err)
	}
	j.Close()

	for _, c := range []struct{ what, sql, missing string }{
		{"a newer schema", `INSERT INTO idem_operations_schema (version) VALUES (99)`, ""},
		{"no version recorded, no records' table", `DROP TABLE idem_operations; TRUNCATE idem_operations_schema`,
			`in schema "public" (idem_operations_schema records version 0, not 2)`},
		{"no table of versions", `DROP TABLE idem_operations_schema`, `in schema "public" (no table idem_operations_schema)`},
	} {
		if _, err := conn.Exec(t.Context(), c.sql); err != nil {
			t.Fatal(err)
		}
		if c.missing != "" {
			refused(c.what, c.missing)
			continue
		}
		const want = `pgjar: database has a newer jar schema version: in schema "public", version 99, this package knows up to 2`
		if _, err := pgjar.Open(ctx, dsn, mustExist); !errors.Is(err, pgjar.ErrVersion) || err.Error() != want {
			t.Errorf("%s: Open = %v; want ErrVersion: %s", c.what, err, want)
		}
		if _, err := conn.Exec(t.Context(), `DELETE FROM idem_operations_schema WHERE version = 99`); err != nil {
			t.Fatal(err)
		}
	}
}

// openers returns, by name, Open of dsn and New on a pool of it, with and
// without MustExist.
func openers(t *testing.T, dsn string) map[string]func() (*pgjar.Jar, error) {
	pool := newPool(t, dsn)
	mustExist := &pgjar.Options{MustExist: true}
	return map[string]func() (*pgjar.Jar, error){
		"Open":            func() (*pgjar.Jar, error) { return pgjar.Open(t.Context(), dsn, nil) },
		"New":             func() (*pgjar.Jar, error) { return pgjar.New(t.Context(), pool, nil) },
		"Open, MustExist": func() (*pgjar.Jar, error) { return pgjar.Open(t.Context(), dsn, mustExist) },
		"New, MustExist":  func() (*pgjar.Jar, error) { return pgjar.New(t.Context(), pool, mustExist) },
	}
}

// TestOpenIncompleteSchema: a database that records the jar's current
// schema version but lost its table of records, or one of its indexes, is
// refused by Open and New, with MustExist or without, with ErrSchema naming
// what is missing and the schema, and nothing is re-created. Before, Open and New opened
// it, and every call then failed with "relation does not exist".
func TestOpenIncompleteSchema(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ drop, missing string }{
		{`DROP TABLE idem_operations`,
			"no idem_operations, idem_operations_pkey, idem_operations_by_created, idem_operations_by_state, idem_operations_by_state_created"},
		{`DROP INDEX idem_operations_by_state`, "no idem_operations_by_state (only an index is missing, no row is lost: create it again, as the owner: " +
			`CREATE INDEX idem_operations_by_state ON "public".idem_operations (state, updated))`},
		{`DROP INDEX idem_operations_by_state_created`, "no idem_operations_by_state_created (only an index is missing, no row is lost: create it again, as the owner: " +
			`CREATE INDEX idem_operations_by_state_created ON "public".idem_operations (state, created NULLS FIRST, op))`},
		{`ALTER TABLE idem_operations DROP CONSTRAINT idem_operations_pkey`, "no idem_operations_pkey"},
	} {
		dsn := pgtest.DB(t)
		open(t, dsn, nil).Close()
		conn := pgtest.Connect(t, dsn)
		if _, err := conn.Exec(t.Context(), c.drop); err != nil {
			t.Fatal(err)
		}
		for what, opened := range openers(t, dsn) {
			j, err := opened()
			if err == nil {
				j.Close()
			}
			want := `pgjar: database lacks part of the jar's schema: in schema "public", ` + c.missing
			if !errors.Is(err, pgjar.ErrSchema) || err.Error() != want || errors.Is(err, pgmigrate.ErrIndexOnly) != strings.Contains(want, "CREATE INDEX") {
				t.Errorf("after %s: %s = %v; want ErrSchema: %s", c.drop, what, err, want)
			}
		}
		if _, create, ok := strings.Cut(c.missing, "as the owner: "); ok {
			// What the error says to run does it.
			dsn := pgtest.DB(t)
			open(t, dsn, nil).Close()
			conn := pgtest.Connect(t, dsn)
			if _, err := conn.Exec(t.Context(), c.drop); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(t.Context(), strings.TrimSuffix(create, ")")); err != nil {
				t.Fatalf("after %s, the statement the error gives: %v", c.drop, err)
			}
			open(t, dsn, &pgjar.Options{MustExist: true}).Close()
		}
		var missing string
		if err := conn.QueryRow(t.Context(), `SELECT coalesce(string_agg(name, ', ' ORDER BY n), '')
			FROM unnest('{idem_operations,idem_operations_pkey,idem_operations_by_created,idem_operations_by_state,idem_operations_by_state_created}'::text[])
				WITH ORDINALITY AS o(name, n)
			WHERE to_regclass(name) IS NULL`).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		if want, _, _ := strings.Cut(strings.TrimPrefix(c.missing, "no "), " ("); missing != want {
			t.Errorf("after %s and the opens: missing %q; want %q, nothing re-created", c.drop, missing, want)
		}
	}
}

// TestOpenUnrecordedSchema: a database whose table of versions was dropped
// or emptied while the jar's table kept its records is refused by Open and
// New, with MustExist or without, with ErrSchema naming what it found and
// the schema, and left as it was. Before, Open and New ran migration 1 on
// it and failed with PostgreSQL's own "relation already exists", and
// MustExist said ErrNoJar of a database that holds a jar.
func TestOpenUnrecordedSchema(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ sql, want string }{
		{`DROP TABLE idem_operations_schema`, "no idem_operations_schema"},
		{`TRUNCATE idem_operations_schema`, "idem_operations_schema records no version"},
	} {
		dsn := pgtest.DB(t)
		j := open(t, dsn, nil)
		if _, _, err := j.Begin(t.Context(), record("op")); err != nil {
			t.Fatal(err)
		}
		j.Close()
		conn := pgtest.Connect(t, dsn)
		if _, err := conn.Exec(t.Context(), c.sql); err != nil {
			t.Fatal(err)
		}
		state := func() string {
			t.Helper()
			var versions, records string
			if err := conn.QueryRow(t.Context(), `SELECT coalesce(to_regclass('idem_operations_schema')::text, 'none'),
				(SELECT count(*) FROM idem_operations)`).Scan(&versions, &records); err != nil {
				t.Fatal(err)
			}
			if versions != "none" {
				if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM idem_operations_schema`).Scan(&versions); err != nil {
					t.Fatal(err)
				}
			}
			return "versions " + versions + ", records " + records
		}
		before := state()
		want := `pgjar: database lacks part of the jar's schema: in schema "public", ` + c.want +
			", but the database holds idem_operations, idem_operations_pkey, idem_operations_by_created, idem_operations_by_state, idem_operations_by_state_created"
		for what, opened := range openers(t, dsn) {
			j, err := opened()
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, pgjar.ErrSchema) || err.Error() != want {
				t.Errorf("after %s: %s = %v; want ErrSchema: %s", c.sql, what, err, want)
			}
			if after := state(); after != before {
				t.Errorf("after %s: %s left %s; want %s, as before", c.sql, what, after, before)
			}
		}
	}
}

// TestOpenSearchPath: with a search_path whose first schema, other, lacks
// the jar that public holds, Open and New look for the jar where they
// create it, in current_schema(). With MustExist they find none
// (ErrNoJar), as without it they would create one in other; a table of
// versions in other that records the current version, the tables being
// public's, is ErrSchema; and the jar created in other opens with
// MustExist and holds the records. Before, MustExist read the version
// through the search path and opened public's jar, and the tables were
// looked for through it too: public's made other's version whole.
func TestOpenSearchPath(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	open(t, dsn, nil).Close() // in public
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA other`); err != nil {
		t.Fatal(err)
	}
	other := dsn + "&search_path=" + url.QueryEscape(`"$user",other,public`)
	opens := func(want error, ending string, names ...string) {
		t.Helper()
		openers := openers(t, other)
		for _, name := range names {
			j, err := openers[name]()
			if err == nil {
				j.Close()
			}
			if !errors.Is(err, want) || !strings.HasSuffix(err.Error(), ending) {
				t.Errorf("%s: %v; want %v ending %q", name, err, want, ending)
			}
		}
	}
	opens(pgjar.ErrNoJar, `in schema "other" (no table idem_operations_schema)`, "Open, MustExist", "New, MustExist")

	if _, err := conn.Exec(ctx, `CREATE TABLE other.idem_operations_schema (LIKE public.idem_operations_schema);
		INSERT INTO other.idem_operations_schema SELECT * FROM public.idem_operations_schema`); err != nil {
		t.Fatal(err)
	}
	opens(pgjar.ErrSchema, `in schema "other", no idem_operations, idem_operations_pkey, idem_operations_by_created, idem_operations_by_state, idem_operations_by_state_created`,
		"Open", "New", "Open, MustExist", "New, MustExist")

	if _, err := conn.Exec(ctx, `DROP TABLE other.idem_operations_schema`); err != nil {
		t.Fatal(err)
	}
	open(t, other, nil).Close() // in other
	j := open(t, other, &pgjar.Options{MustExist: true})
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatal(err)
	}
	var inOther, inPublic int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM other.idem_operations),
		(SELECT count(*) FROM public.idem_operations)`).Scan(&inOther, &inPublic); err != nil {
		t.Fatal(err)
	}
	if inOther != 1 || inPublic != 0 {
		t.Errorf("records: %d in other, %d in public; want 1 in other, where the jar opened with MustExist is", inOther, inPublic)
	}
}

// TestNewMustExist: a service that opens the jar on its own pool with
// MustExist, through the public API alone, gets ErrNoJar for a database
// without a jar and ErrSchema for a jar whose version was lost, which it
// leaves as it was, and opens a jar at the current version.
func TestNewMustExist(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mustExist := &pgjar.Options{MustExist: true}
	versions := func() string {
		t.Helper()
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('idem_operations_schema') IS NOT NULL`).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if !exists {
			return "no table"
		}
		var v string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(version::text, ',' ORDER BY version), '')
			FROM idem_operations_schema`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	if j, err := pgjar.New(ctx, pool, mustExist); !errors.Is(err, pgjar.ErrNoJar) {
		if err == nil {
			j.Close()
		}
		t.Fatalf("an empty database: New = %v; want ErrNoJar", err)
	}
	if v := versions(); v != "no table" {
		t.Fatalf("after New with MustExist on an empty database: versions %q; want no table", v)
	}

	j, err := pgjar.New(ctx, pool, nil) // creates the jar
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if _, err := pool.Exec(ctx, `TRUNCATE idem_operations_schema`); err != nil {
		t.Fatal(err)
	}
	if j, err := pgjar.New(ctx, pool, mustExist); !errors.Is(err, pgjar.ErrSchema) || !strings.Contains(err.Error(), "records no version") {
		if err == nil {
			j.Close()
		}
		t.Fatalf("a jar whose version was lost: New = %v; want ErrSchema saying so", err)
	}
	if v := versions(); v != "" {
		t.Fatalf("after New with MustExist on a jar whose version was lost: versions %q; want none, nothing recorded", v)
	}

	if _, err := pool.Exec(ctx, `INSERT INTO idem_operations_schema (version) VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	j, err = pgjar.New(ctx, pool, mustExist)
	if err != nil {
		t.Fatalf("an existing jar: New = %v", err)
	}
	defer j.Close()
	if rec, err := j.Get(ctx, "op"); err != nil || rec.Key != "key-op" {
		t.Fatalf("Get = %+v, %v; want the record begun before", rec, err)
	}
}

// TestOpenUnreachable: Open's error for a database that refuses the
// connection, or a server that is down, says the connection failed and
// why, in words of its own rather than "migrate: failed to connect"
// followed by pgx's refused TLS attempt.
func TestOpenUnreachable(t *testing.T) {
	pgtest.RefusedConnect(t, pgtest.DB(t), "pgjar", func(dsn string) (io.Closer, error) {
		return pgjar.Open(t.Context(), dsn, nil)
	})
}

// TestOpenBehindPgBouncer: a PgBouncer that takes none of the startup
// parameters Open sets refuses Open's first session, and Open says what to
// do about it, at once.
func TestOpenBehindPgBouncer(t *testing.T) {
	pgtest.RefusedByPgBouncer(t, "pgjar", func(dsn string) (io.Closer, error) {
		return pgjar.Open(t.Context(), dsn, nil)
	})
}

// TestOpenUnparsedDSNMasksPassword: Open's error for a connection string
// that pgx cannot parse shows none of its password.
func TestOpenUnparsedDSNMasksPassword(t *testing.T) {
	for _, dsn := range pgtest.UnparsedDSNs {
		_, err := pgjar.Open(t.Context(), dsn, nil)
		pgtest.RefusedUnparsed(t, dsn, err)
	}
}

// TestOpenBadOptions: each option out of range is ErrOptions from Open and
// New, naming the field, with "pgjar:" once, and nothing is created. A
// negative QueryTimeout or PruneBatch was taken for the default, and a
// QueryTimeout above PostgreSQL's longest statement_timeout failed every
// connection with the server's error (Open) or, past 146 years, made every
// wait of twice it overflow into none (New).
func TestOpenBadOptions(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	pool := newPool(t, dsn)
	for _, c := range []struct {
		o     pgjar.Options
		field string
	}{
		{pgjar.Options{QueryTimeout: -time.Second}, "QueryTimeout"},
		{pgjar.Options{QueryTimeout: math.MaxInt32*time.Millisecond + time.Millisecond}, "QueryTimeout"},
		{pgjar.Options{QueryTimeout: math.MaxInt64}, "QueryTimeout"},
		{pgjar.Options{PruneBatch: -1}, "PruneBatch"},
		{pgjar.Options{MigrationTimeout: -time.Second}, "MigrationTimeout"},
		{pgjar.Options{MigrationTimeout: math.MaxInt32*time.Millisecond + time.Millisecond}, "MigrationTimeout"},
	} {
		for name, open := range map[string]func() (*pgjar.Jar, error){
			"Open": func() (*pgjar.Jar, error) { return pgjar.Open(ctx, dsn, &c.o) },
			"New":  func() (*pgjar.Jar, error) { return pgjar.New(ctx, pool, &c.o) },
		} {
			j, err := open()
			if err == nil {
				j.Close()
			}
			pgtest.RefusedOptions(t, fmt.Sprintf("%s with %+v", name, c.o), err, pgjar.ErrOptions, c.field, "pgjar")
		}
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d tables after the refused opens; want none", tables)
	}
	j, err := pgjar.Open(ctx, dsn, &pgjar.Options{QueryTimeout: math.MaxInt32 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open with the longest QueryTimeout: %v; want it open", err)
	}
	j.Close()
}

// TestOpenThatCannotWrite: Open refuses a connection that could never
// write the jar (read-only transactions, or a role that may only read
// idem_operations) with ErrPrivilege, where it opened one on a current
// schema and every call then failed with a *idem.JarError.
func TestOpenThatCannotWrite(t *testing.T) {
	pgtest.RefusedWrite(t, pgjar.ErrPrivilege, "idem_operations", func(dsn string) (io.Closer, error) {
		return pgjar.Open(t.Context(), dsn, nil)
	})
}

// TestOpenBehindTransactionPooler: behind a pooler in transaction mode, a
// call whose statement pgx prepared on another server session (or would
// prepare under a name the session holds) is run again at once in pgx's
// exec mode, and goes through; with default_query_exec_mode=exec in Open's
// DSN it prepares nothing by name.
func TestOpenBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerMixUp(t, pgtest.DB(t), func(dsn string) (*pgxpool.Pool, func() error) {
		j := open(t, dsn, nil)
		return pgjar.PoolOf(j), func() error {
			_, err := j.Get(t.Context(), "op")
			if errors.Is(err, idem.ErrNotFound) {
				return nil
			}
			return err
		}
	})
}

// TestCallsBehindTransactionPooler: Begin, Get, Acquire, Update, a
// deferred change, List and Forget, each on a session whose prepared
// statements are not those of pgx's cache (see pgtest.MixUp), go through,
// run again at once in pgx's exec mode, and the applier drops nothing.
// Before, each failed with SQLSTATE 26000 or 42P05, and the applier
// dropped the deferred change, its operation left pending and leased.
func TestCallsBehindTransactionPooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		t.Run(code, func(t *testing.T) {
			j := open(t, pgtest.DB(t)+"&pool_max_conns=1", nil)
			ctx := t.Context()
			steps := []struct {
				name string
				call func(op string) error
			}{
				{"begin", func(op string) error {
					r := record(op)
					r.Holder, r.LeaseUntil = "h", t0.Add(time.Minute)
					_, _, err := j.Begin(ctx, r)
					return err
				}},
				{"get", func(op string) error { _, err := j.Get(ctx, op); return err }},
				{"acquire", func(op string) error { _, err := j.Acquire(ctx, op, "h", t0, time.Minute); return err }},
				{"update", func(op string) error {
					_, err := j.Update(ctx, op, "h", idem.Change{Now: t0, Attempts: 1, LastStatus: 503})
					return err
				}},
				{"defer", func(op string) error { return j.Defer(op, "h", done) }},
				{"get", func(op string) error {
					rec, err := j.Get(ctx, op)
					if err == nil && (rec.State != idem.StateDone || rec.Holder != "") {
						err = fmt.Errorf("record %s, holder %q, after the deferred change; want done, free", rec.State, rec.Holder)
					}
					return err
				}},
				{"list", func(string) error { _, err := j.List(ctx, idem.Filter{}); return err }},
				{"forget", func(op string) error { return j.Forget(ctx, op) }},
			}
			for _, step := range steps { // pgx prepares each statement
				if err := step.call("warm"); err != nil {
					t.Fatalf("%s: %v", step.name, err)
				}
			}
			for _, step := range steps {
				if err := pgtest.MixUp(ctx, pgjar.PoolOf(j), code); err != nil {
					t.Fatal(err)
				}
				if err := step.call("op"); err != nil {
					t.Errorf("%s on a mixed-up session: %v; want it through", step.name, err)
				}
			}
			if err := j.Close(); err != nil {
				t.Errorf("Close: %v; want nil, no deferred change dropped", err)
			}
		})
	}
}

// TestCallRefusedSession: a call whose new session the server refuses once
// the jar is open (the database no longer takes connections, the jar's
// sessions ended) fails with one line that says the connection failed and
// why, as Open's error does, rather than pgx's lines, its refused TLS
// attempt first (sslmode prefer, pgx's default); errors.As still finds
// the server's refusal.
func TestCallRefusedSession(t *testing.T) {
	u, err := url.Parse(pgtest.SSLModePrefer(t, pgtest.DB(t)))
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	j, err := pgjar.Open(t.Context(), u.String(), &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	name := strings.TrimPrefix(u.Path, "/")
	db := pgx.Identifier{name}.Sanitize()
	u.Path = "/postgres" // a database may not refuse its own session's connections
	conn := pgtest.Connect(t, u.String())
	if _, err := conn.Exec(t.Context(), `ALTER DATABASE `+db+` ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := conn.Exec(context.Background(), `ALTER DATABASE `+db+` ALLOW_CONNECTIONS true`); err != nil {
			t.Error(err)
		}
	})
	if _, err := conn.Exec(t.Context(), `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = $1`, name); err != nil {
		t.Fatal(err)
	}
	_, err = j.Get(t.Context(), "charge:1")
	var pe *pgconn.PgError
	if msg := fmt.Sprint(err); !strings.HasPrefix(msg, `pgjar: get "charge:1": connection to the database failed`) ||
		strings.Contains(msg, "\n") || strings.Contains(msg, "tls") || !errors.As(err, &pe) || pe.Code != "55000" {
		t.Errorf("Get after the server refused new sessions: %q; want one line, %q and the server's refusal (SQLSTATE 55000), no TLS attempt",
			msg, `pgjar: get "charge:1": connection to the database failed`)
	}
	if err := j.Defer("charge:1", "h", idem.Change{Now: t0}); err != nil {
		t.Fatal(err)
	}
	j.Close() // applies, or drops, what was deferred
	if out := logged.String(); !strings.Contains(out, "err=\"connection to the database failed") || strings.Contains(out, "tls") {
		t.Errorf("logged %q; want the dropped change's error in one line, as Get's", out)
	}
}

// TestOpenSettingsDroppedByPooler: a pooler in front of the server that
// drops the startup parameters Open sets (PgBouncer with them in its
// ignore_startup_parameters, as README's Behind PgBouncer says to list them)
// leaves the session on the role's settings: Open refuses one whose
// default_transaction_isolation is not read committed, or whose
// synchronous_commit is off while the DSN chose none, with ErrPool saying
// which and what to do; with the role's settings as Open needs them, it
// opens the jar. Before, Open opened it, its keys committed without a
// flush of the WAL, or its statements run SERIALIZABLE.
func TestOpenSettingsDroppedByPooler(t *testing.T) {
	pgtest.SettingsDropped(t, func(ctx context.Context, dsn string) error {
		j, err := pgjar.Open(ctx, dsn, nil)
		if err != nil {
			return err
		}
		return j.Close()
	}, pgjar.ErrPool)
}

// TestDeferredBehindTransactionPooler: a deferred change that adds an
// attempt (sent again only when it was surely not applied), whose batch
// meets a pooler's mix-up of pgx's prepared statements, is sent again at
// once in pgx's exec mode, and applied once: nothing is dropped or logged.
// Before, the applier dropped it (Close returned idem.ErrDropped quoting
// SQLSTATE 26000), and the operation stayed as it was.
func TestDeferredBehindTransactionPooler(t *testing.T) {
	ctx := t.Context()
	var logged syncBuffer
	j, err := pgjar.Open(ctx, pgtest.DB(t)+"&pool_max_conns=1", &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("op", "", idem.Change{Now: t0.Add(time.Second), Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err := j.Get(ctx, "op"); err != nil || rec.Attempts != 1 { // waits for the change
		t.Fatalf("Get after the first change: %+v, %v; want it applied", rec, err)
	}
	conn, err := pgjar.PoolOf(j).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Conn().PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll() // what a pooler's session switch amounts to
	conn.Release()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("op", "", idem.Change{Now: t0.Add(2 * time.Second), Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err := j.Get(ctx, "op"); err != nil || rec.Attempts != 2 {
		t.Errorf("Get after the second change: attempts %d, %v; want 2: applied once", rec.Attempts, err)
	}
	if err := j.Close(); err != nil {
		t.Errorf("Close: %v; want nil, nothing dropped", err)
	}
	if logged.String() != "" {
		t.Errorf("log: %s; want nothing", logged.String())
	}
}
