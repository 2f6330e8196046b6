package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/idemkit/idem/testserver/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// keys returns the scope:key:status of each row of the table
// idempotency_keys of schema, in order, comma-separated.
func keys(t *testing.T, admin *pgx.Conn, schema string) string {
	t.Helper()
	var s string
	if err := admin.QueryRow(t.Context(), `SELECT coalesce(string_agg(scope || ':' || key || ':' || status, ','
		ORDER BY scope, key), '') FROM `+pgx.Identifier{schema, "idempotency_keys"}.Sanitize()).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// claimSave claims key in scope s with token 1 and saves an answer.
func claimSave(t *testing.T, s testserver.Store, key string) {
	t.Helper()
	if _, claimed, err := s.Claim(t.Context(), "s", key, "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Fatalf("Claim of %s = %v, %v; want claimed", key, claimed, err)
	}
	if err := s.Save(t.Context(), "s", key, testserver.Fence{Token: 1}, testserver.Response{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatalf("Save of %s: %v", key, err)
	}
}

// TestTempTableDoesNotShadow: a temporary table named idempotency_keys on
// every connection of the pool (pg_temp is searched first) neither hides
// the store's entries nor receives its writes. Before, the store's
// statements named the table without its schema: a key claimed and saved
// by another instance was claimed again, and the claim went to the
// temporary table.
func TestTempTableDoesNotShadow(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	claimSave(t, open(t, dsn, nil), "before")
	pool := pgtest.ShadowingPool(t, dsn, "idempotency_keys")
	s, err := pgstore.New(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	if e, claimed, err := s.Claim(ctx, "s", "before", "fp", testserver.Fence{Token: 2}, t0); err != nil || claimed || e.Status != testserver.StatusDone {
		t.Errorf("Claim of the key saved before = %+v, %v, %v; want its entry, done", e, claimed, err)
	}
	claimSave(t, s, "after")
	if _, claimed, err := s.Claim(ctx, "s", "released", "fp", testserver.Fence{Token: 3}, t0); err != nil || !claimed {
		t.Fatalf("Claim = %v, %v; want claimed", claimed, err)
	}
	if ok, err := s.Release(ctx, "s", "released", testserver.Fence{Token: 3}); err != nil || !ok {
		t.Fatalf("Release = %v, %v; want released", ok, err)
	}
	admin := pgtest.Connect(t, dsn)
	if got, want := keys(t, admin, "public"), "s:after:done,s:before:done"; got != want {
		t.Errorf("the store's table holds %q; want %q", got, want)
	}
	if n := pgtest.TempRows(t, pool, "idempotency_keys"); n != 0 {
		t.Errorf("the temporary tables hold %d entries; want none", n)
	}
}

// TestQuotedSchemaName: a store in a schema whose name needs quoting (a
// double quote, upper case, a space, a dot) is created there by Open and
// claims and saves there after the search_path of later connections moved
// to public, which holds another store. Before, the claim went to public's.
func TestQuotedSchemaName(t *testing.T) {
	for _, schema := range []string{`Idem "x"`, `a.b c`} {
		t.Run(schema, func(t *testing.T) {
			dsn := pgtest.DB(t)
			admin := pgtest.Connect(t, dsn)
			open(t, dsn, nil) // public's store
			var s *pgstore.Store
			pgtest.InSchema(t, admin, schema, func() *pgxpool.Pool {
				s = open(t, dsn, nil)
				return s.Pool()
			})

			claimSave(t, s, "k")
			if in, public := keys(t, admin, schema), keys(t, admin, "public"); in != "s:k:done" || public != "" {
				t.Errorf("entries: %q in %q, %q in public; want s:k:done in %q, the store's schema, and none in public",
					in, schema, public, schema)
			}
		})
	}
}

// TestSearchPathChangedAfterOpen runs the conformance suite on stores
// opened in a schema, first, that the role's search_path named at Open, on
// connections that the pool made after the role's search_path was reset
// (public, which holds no store). Before, every statement ran in public
// and failed: relation "idempotency_keys" does not exist.
func TestSearchPathChangedAfterOpen(t *testing.T) {
	storetest.Run(t, func(t *testing.T) testserver.Store {
		dsn := pgtest.DB(t)
		var s *pgstore.Store
		pgtest.InSchema(t, pgtest.Connect(t, dsn), "first", func() *pgxpool.Pool {
			s = open(t, dsn, nil)
			return s.Pool()
		})
		return s
	})
}

// TestOpenNoSchema: a search_path that names no schema that exists leaves
// current_schema() null: Open and New return ErrNoSchema naming the
// search_path and what to do, and create nothing. Before, they failed with PostgreSQL's
// "no schema has been selected to create in".
func TestOpenNoSchema(t *testing.T) {
	dsn := pgtest.DB(t)
	opens, _ := openers(t, dsn+"&search_path=nowhere")
	for name, opened := range opens {
		s, err := opened()
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, pgstore.ErrNoSchema) || !strings.Contains(err.Error(), `"nowhere"`) || !strings.Contains(err.Error(), "CREATE SCHEMA") {
			t.Errorf("%s: %v; want ErrNoSchema naming the search_path and what to do", name, err)
		}
	}
	if tables := pgtest.Tables(t, dsn); tables != "" {
		t.Errorf("tables %s after the opens; want none", tables)
	}
}

// TestOpenRefusesAStoreInAnotherSchema: a fleet runs under the default
// search_path ("$user", public), the store in public; then a schema named
// after the role is created (CREATE SCHEMA <role> AUTHORIZATION <role>,
// PostgreSQL 15's advice). Open and New, which would create the store
// there, return ErrSchema naming both schemas and create nothing, and a
// retry of a saved key on the running instance still gets its answer.
// Before, an instance that restarted opened a second, empty store in the
// role's schema, and claimed a saved key afresh: its handler ran again.
func TestOpenRefusesAStoreInAnotherSchema(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	running := open(t, dsn, nil)
	claimSave(t, running, "charge-1")
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA postgres AUTHORIZATION postgres`); err != nil {
		t.Fatal(err)
	}
	opens, _ := openers(t, dsn)
	for name, opened := range opens {
		s, err := opened()
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, pgstore.ErrSchema) || !strings.Contains(err.Error(), `schema "postgres"`) ||
			!strings.Contains(err.Error(), `set search_path to "public"`) {
			t.Errorf("%s: %v; want ErrSchema naming postgres and saying to set search_path to public", name, err)
		}
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'postgres'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d tables in schema postgres after the opens; want none", tables)
	}
	if e, claimed, err := running.Claim(ctx, "s", "charge-1", "fp", testserver.Fence{Token: 2, ClaimID: "retry"}, t0); err != nil ||
		claimed || e.Status != testserver.StatusDone {
		t.Errorf("retry of the saved key: %+v, claimed=%v, %v; want its saved answer", e, claimed, err)
	}
}

// TestSearchPathDroppedByPooler: a pooler in front of the server that drops
// the DSN's search_path (PgBouncer with search_path among its
// ignore_startup_parameters, as the hint of its refusal once said to list
// it) leaves the session on the role's search_path. Open and New refuse it
// with ErrSchema naming both search_paths and what to do, and create
// nothing; once the role's search_path is the DSN's, they open the store,
// and a retry of a saved key gets its answer. Before, Open created an
// empty store in public, where the saved key was claimed afresh: its
// handler would have run again.
func TestSearchPathDroppedByPooler(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA keys`); err != nil {
		t.Fatal(err)
	}
	claimSave(t, open(t, dsn+"&search_path=keys", nil), "charge-1")
	dropped := pgtest.Dropping(t, dsn+"&search_path=keys", "search_path")
	opens, _ := openers(t, dropped)
	for name, opened := range opens {
		s, err := opened()
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, pgstore.ErrSchema) || !strings.Contains(err.Error(), `search_path 'keys'`) ||
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
	if _, err := admin.Exec(ctx, `ALTER ROLE CURRENT_USER IN DATABASE `+pgx.Identifier{db}.Sanitize()+` SET search_path = keys`); err != nil {
		t.Fatal(err)
	}
	opens, _ = openers(t, dropped)
	for name, opened := range opens {
		s, err := opened()
		if err != nil {
			t.Errorf("%s with the role's search_path the DSN's: %v", name, err)
			continue
		}
		if e, claimed, err := s.Claim(ctx, "s", "charge-1", "fp", testserver.Fence{Token: 2, ClaimID: "retry"}, t0); err != nil ||
			claimed || e.Status != testserver.StatusDone {
			t.Errorf("%s: retry of the saved key: %+v, claimed=%v, %v; want its saved answer", name, e, claimed, err)
		}
		s.Close()
	}
}

// TestOpenSettingsDroppedByPooler: a pooler in front of the server that
// drops the startup parameters Open sets (PgBouncer with them in its
// ignore_startup_parameters, as README's Behind PgBouncer says to list them)
// leaves the session on the role's settings: Open refuses one whose
// default_transaction_isolation is not read committed, or whose
// synchronous_commit is off while the DSN chose none, with ErrPool saying
// which and what to do; with the role's settings as Open needs them, it
// opens the store. Before, Open opened it, its claims committed without a
// flush of the WAL (a crash could lose a claim whose handler ran), or run
// SERIALIZABLE.
func TestOpenSettingsDroppedByPooler(t *testing.T) {
	pgtest.SettingsDropped(t, func(ctx context.Context, dsn string) error {
		s, err := pgstore.Open(ctx, dsn, nil)
		if err != nil {
			return err
		}
		return s.Close()
	}, pgstore.ErrPool)
}
