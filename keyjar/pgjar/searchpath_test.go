package pgjar_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/jartest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// rows returns how many rows the table idem_operations of schema holds.
func rows(t *testing.T, admin *pgx.Conn, schema string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM `+
		pgx.Identifier{schema, "idem_operations"}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTempTableDoesNotShadow: a temporary table named idem_operations on
// every connection of the pool (pg_temp is searched first) neither hides
// the jar's records nor receives its writes. Before, the jar's statements
// named the table without its schema: Get read the empty temporary table
// (idem.ErrNotFound), and Begin, Update and the applier wrote there.
func TestTempTableDoesNotShadow(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	if _, _, err := open(t, dsn, nil).Begin(ctx, record("before")); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.ShadowingPool(t, dsn, "idem_operations")
	j := onPool(t, pool, nil)

	if rec, err := j.Get(ctx, "before"); err != nil || rec.Key != "key-before" {
		t.Errorf("Get of the record begun before = %+v, %v; want it", rec, err)
	}
	if _, created, err := j.Begin(ctx, record("after")); err != nil || !created {
		t.Fatalf("Begin = %v, %v; want created", created, err)
	}
	if _, err := j.Update(ctx, "after", "", idem.Change{Now: t0.Add(time.Second), Note: "updated"}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err := j.Defer("after", "", idem.Change{Now: t0.Add(2 * time.Second), Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err := j.Get(ctx, "after"); err != nil || rec.Note != "updated" || rec.Attempts != 1 {
		t.Errorf("Get after Update and Defer = %+v, %v; want the note and one attempt", rec, err)
	}

	admin := pgtest.Connect(t, dsn)
	var notes string
	if err := admin.QueryRow(ctx, `SELECT string_agg(op || ':' || note || ':' || attempts, ',' ORDER BY op)
		FROM public.idem_operations`).Scan(&notes); err != nil {
		t.Fatal(err)
	}
	if want := "after:updated:1,before::0"; notes != want {
		t.Errorf("the jar's table holds %q; want %q", notes, want)
	}
	if n := pgtest.TempRows(t, pool, "idem_operations"); n != 0 {
		t.Errorf("the temporary tables hold %d records; want none", n)
	}
}

// TestQuotedSchemaName: a jar in a schema whose name needs quoting (a
// double quote, upper case, a space, a dot) is created there by Open and
// written and read there after the search_path of later connections moved
// to public, which holds another jar. Before, Begin wrote in public's jar.
func TestQuotedSchemaName(t *testing.T) {
	for _, schema := range []string{`Idem "x"`, `a.b c`} {
		t.Run(schema, func(t *testing.T) {
			ctx := t.Context()
			dsn := pgtest.DB(t)
			admin := pgtest.Connect(t, dsn)
			open(t, dsn, nil) // public's jar
			var j *pgjar.Jar
			pgtest.InSchema(t, admin, schema, func() *pgxpool.Pool {
				j = open(t, dsn, nil)
				return pgjar.PoolOf(j)
			})

			if _, created, err := j.Begin(ctx, record("op")); err != nil || !created {
				t.Fatalf("Begin = %v, %v; want created", created, err)
			}
			if rec, err := j.Get(ctx, "op"); err != nil || rec.Key != "key-op" {
				t.Fatalf("Get = %+v, %v; want the record begun", rec, err)
			}
			if in, public := rows(t, admin, schema), rows(t, admin, "public"); in != 1 || public != 0 {
				t.Errorf("records: %d in %q, %d in public; want 1 in %q, the jar's schema, and none in public",
					in, schema, public, schema)
			}
		})
	}
}

// TestSearchPathChangedAfterOpen runs the conformance suite on jars opened
// in a schema, first, that the role's search_path named at Open, on
// connections that the pool made after the role's search_path was reset
// (public, which holds no jar). Before, every statement ran in public and
// failed: relation "idem_operations" does not exist.
func TestSearchPathChangedAfterOpen(t *testing.T) {
	t.Parallel()
	jartest.Run(t, func(t *testing.T) jartest.Jar {
		dsn := pgtest.DB(t)
		var j *pgjar.Jar
		pgtest.InSchema(t, pgtest.Connect(t, dsn), "first", func() *pgxpool.Pool {
			j = open(t, dsn, nil)
			return pgjar.PoolOf(j)
		})
		return j
	})
}

// TestOpenNoSchema: a search_path that names no schema that exists leaves
// current_schema() null: Open and New, with MustExist or without, return
// ErrNoSchema naming the search_path, and create nothing. Before, Open and
// New failed with PostgreSQL's "no schema has been selected to create in",
// and with MustExist with ErrNoJar.
func TestOpenNoSchema(t *testing.T) {
	dsn := pgtest.DB(t)
	for name, opened := range openers(t, dsn+"&search_path=nowhere") {
		j, err := opened()
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrNoSchema) || !strings.Contains(err.Error(), `"nowhere"`) || !strings.Contains(err.Error(), "CREATE SCHEMA") {
			t.Errorf("%s: %v; want ErrNoSchema naming the search_path and what to do", name, err)
		}
	}
	if tables := pgtest.Tables(t, dsn); tables != "" {
		t.Errorf("tables %s after the opens; want none", tables)
	}
}

// TestNoJarNamesSchema: MustExist on a database whose jar is in public,
// with a search_path whose first schema, jobs, holds none, is ErrNoJar
// naming jobs, the schema it looked in. Before, the error named no schema,
// and an operator could not tell that it had not looked in public.
func TestNoJarNamesSchema(t *testing.T) {
	dsn := pgtest.DB(t)
	open(t, dsn, nil).Close() // in public
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	opens := openers(t, dsn+"&search_path=jobs,public")
	for _, name := range []string{"Open, MustExist", "New, MustExist"} {
		j, err := opens[name]()
		if err == nil {
			j.Close()
		}
		const want = `pgjar: database holds no key jar in schema "jobs" (no table idem_operations_schema)`
		if !errors.Is(err, pgjar.ErrNoJar) || err.Error() != want {
			t.Errorf("%s: %v; want ErrNoJar: %s", name, err, want)
		}
	}
}

// tablesIn returns the tables of schema in the database conn is on, as
// pgtest.Tables names them: "" for none.
func tablesIn(t *testing.T, conn *pgx.Conn, schema string) string {
	t.Helper()
	var tables string
	if err := conn.QueryRow(t.Context(), `SELECT coalesce(string_agg(tablename, ',' ORDER BY tablename), '')
		FROM pg_catalog.pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	return tables
}

// TestOpenRefusesAJarInAnotherSchema: a jar in public, opened under the
// default search_path ("$user", public); then a schema named after the
// role is created. Open, which would create the jar there, returns
// ErrSchema naming both schemas and creates nothing, and the pending
// operation keeps its key in public. Before, Open created a second, empty
// jar in the role's schema, and a call under the same name began the
// operation again under a new key. With MustExist, the error is ErrNoJar
// and ErrSchema, with the same hint; before, ErrNoJar alone, in schema
// "postgres", without a word of public.
func TestOpenRefusesAJarInAnotherSchema(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	r := record("charge:order-1")
	if _, created, err := open(t, dsn, nil).Begin(ctx, r); err != nil || !created {
		t.Fatal(created, err)
	}
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA postgres AUTHORIZATION postgres`); err != nil {
		t.Fatal(err)
	}
	for name, opened := range openers(t, dsn) {
		j, err := opened()
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrSchema) || !strings.Contains(err.Error(), `schema "postgres"`) ||
			!strings.Contains(err.Error(), `set search_path to "public"`) {
			t.Errorf("%s: %v; want ErrSchema naming postgres and saying to set search_path to public", name, err)
		}
		if strings.Contains(name, "MustExist") && !errors.Is(err, pgjar.ErrNoJar) {
			t.Errorf("%s: %v; want ErrNoJar too", name, err)
		}
	}
	if tables := tablesIn(t, admin, "postgres"); tables != "" {
		t.Errorf("tables %s in schema postgres after the opens; want none", tables)
	}
	j := open(t, dsn+"&search_path=public", nil)
	if rec, err := j.Get(ctx, r.Op); err != nil || rec.Key != r.Key {
		t.Errorf("Get in public = %+v, %v; want the pending operation under its key", rec, err)
	}
}

// TestOpenRefusesAJarInASchemaWithoutUsage: a jar in jobs
// (search_path=jobs,public); a role granted its tables but not USAGE on
// jobs, whose current_schema() therefore falls through to public, where
// it may create tables. Open returns ErrPrivilege saying to grant USAGE on
// jobs, and creates nothing in public. Before, it created a second, empty
// jar in public. With MustExist, the error is ErrNoJar and ErrPrivilege,
// with the same hint; before, ErrNoJar alone, in schema "public", without
// a word of jobs.
func TestOpenRefusesAJarInASchemaWithoutUsage(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	if _, created, err := open(t, dsn+"&search_path=jobs,public", nil).Begin(ctx, record("op")); err != nil || !created {
		t.Fatal(created, err)
	}
	app := pgtest.AppRole(t, dsn, `GRANT CREATE ON SCHEMA public`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON jobs.idem_operations`, `GRANT SELECT ON jobs.idem_operations_schema`)
	for name, opened := range openers(t, app+"&search_path=jobs,public") {
		j, err := opened()
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrPrivilege) || !strings.Contains(err.Error(), `GRANT USAGE ON SCHEMA "jobs"`) {
			t.Errorf("%s: %v; want ErrPrivilege saying to grant USAGE on jobs", name, err)
		}
		if strings.Contains(name, "MustExist") && !errors.Is(err, pgjar.ErrNoJar) {
			t.Errorf("%s: %v; want ErrNoJar too", name, err)
		}
	}
	if tables := tablesIn(t, admin, "public"); tables != "" {
		t.Errorf("tables %s in schema public after the opens; want none", tables)
	}
}

// TestOpenSchemaWithoutUsage: a search_path whose only schema exists, and
// holds the jar, but which the role may not use (USAGE, which
// current_schema() skips it for) leaves current_schema() null too: the
// ErrNoSchema of Open and New says that the role may not use it, and what
// to grant. Before, it said only that the search_path named no schema that
// exists, and to create one, which the schema's owner could not.
func TestOpenSchemaWithoutUsage(t *testing.T) {
	dsn := pgtest.DB(t)
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	open(t, dsn+"&search_path=jobs", nil).Close()
	app := pgtest.AppRole(t, dsn, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA jobs`)
	for name, opened := range openers(t, app+"&search_path=jobs") {
		j, err := opened()
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrNoSchema) || !strings.Contains(err.Error(), `"jobs"`) || !strings.Contains(err.Error(), "USAGE") {
			t.Errorf("%s: %v; want ErrNoSchema naming the search_path and USAGE", name, err)
		}
	}
}

// TestSearchPathDroppedByPooler: a pooler in front of the server that drops
// the DSN's search_path (PgBouncer with search_path among its
// ignore_startup_parameters, as the hint of its refusal once said to list
// it) leaves the session on the role's search_path. Open and New, with
// MustExist and without, refuse it with ErrSchema naming both search_paths
// and what to do, and create nothing; once the role's search_path is the
// DSN's, they open the jar and find its pending operation. Before, Open
// created an empty jar in public, where the pending operation was not
// found, and a call under its name would have begun it under a new key.
func TestSearchPathDroppedByPooler(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := open(t, dsn+"&search_path=jobs", nil).Begin(ctx, record("pending")); err != nil {
		t.Fatal(err)
	}
	dropped := pgtest.Dropping(t, dsn+"&search_path=jobs", "search_path")
	for name, opened := range openers(t, dropped) {
		j, err := opened()
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, pgjar.ErrSchema) || !strings.Contains(err.Error(), `search_path 'jobs'`) ||
			!strings.Contains(err.Error(), `search_path '"$user", public'`) || !strings.Contains(err.Error(), "ALTER ROLE") {
			t.Errorf("%s through a pooler that drops search_path: %v; want ErrSchema naming both search_paths and ALTER ROLE", name, err)
		}
	}
	if tables := pgtest.Tables(t, dsn); strings.Contains(tables, "public.") {
		t.Errorf("tables %s after the opens; want none in public", tables)
	}

	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER ROLE CURRENT_USER IN DATABASE `+pgx.Identifier{db}.Sanitize()+` SET search_path = jobs`); err != nil {
		t.Fatal(err)
	}
	for name, opened := range openers(t, dropped) {
		j, err := opened()
		if err != nil {
			t.Errorf("%s with the role's search_path the DSN's: %v", name, err)
			continue
		}
		if rec, err := j.Get(ctx, "pending"); err != nil || rec.Key != "key-pending" {
			t.Errorf("%s: Get of the pending operation = %+v, %v; want it", name, rec, err)
		}
		j.Close()
	}
}
