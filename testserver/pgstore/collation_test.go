package pgstore_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// layout describes the store's table as the catalog holds it (see
// pgtest.Layout).
func layout(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return pgtest.Layout(t, pool, "idempotency_keys")
}

// atVersion1 returns a database that the package created at version 1, a
// pool on it, closed when t ends, and a store on it as that version ran
// it, holding one claim in flight: key "k-1" of scope "s", token 1.
func atVersion1(t *testing.T) (dsn string, pool *pgxpool.Pool, old *pgstore.EarlierStore) {
	t.Helper()
	dsn = pgtest.DB(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.MigrateTo(t.Context(), pool, 1); err != nil {
		t.Fatalf("migrating to version 1: %v", err)
	}
	if l := layout(t, pool); !slices.Contains(l, "idempotency_keys.key text collate default not null") {
		t.Fatalf("at version 1 the key's column is not in the default collation:\n%s", strings.Join(l, "\n"))
	}
	old = pgstore.OnSchema(pool, "public")
	if _, claimed, err := old.Claim(t.Context(), "s", "k-1", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Fatalf("claim at version 1 = %v, %v", claimed, err)
	}
	return dsn, pool, old
}

// versions returns the versions idempotency_keys_schema records, in order.
func versions(t *testing.T, pool *pgxpool.Pool) []int32 {
	t.Helper()
	var v []int32
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(version ORDER BY version), '{}')
		FROM idempotency_keys_schema`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The columns of the store's primary key, and its index, sort bytewise
// whatever the database's default collation.
var byteOrdered = []string{
	"idempotency_keys.scope text collate C not null",
	"idempotency_keys.key text collate C not null",
	"index CREATE UNIQUE INDEX idempotency_keys_pkey ON public.idempotency_keys USING btree (scope, key) collate C,C",
}

// TestKeysCollateBytewise: a store created at the current version keeps
// scope and key, and its primary key's index, in the "C" collation, which
// no upgrade of the operating system's C library reorders. Before, they
// were in the database's default collation (a libc one, often), whose
// order changes with glibc: the index then misses keys it holds, and a
// retry's claim of an existing key succeeds.
func TestKeysCollateBytewise(t *testing.T) {
	s := open(t, pgtest.DB(t), nil)
	l := layout(t, s.Pool())
	for _, want := range byteOrdered {
		if !slices.Contains(l, want) {
			t.Errorf("the store's table lacks %q; it has:\n%s", want, strings.Join(l, "\n"))
		}
	}
	if v := versions(t, s.Pool()); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("schema versions = %v; want [1 2 3]", v)
	}
}

// TestMigrateToBytewiseKeys opens, with this package, a database that an
// earlier one created at version 1 and filled: saved answers and claims
// in flight, under keys with hyphens and spaces (whose order glibc 2.28
// changed) and letters beyond ASCII. The migration leaves the table as a
// store created at the current version has it, and every entry is found
// again: each request is replayed, its handler not run again, and a claim
// in flight is still in flight under its token. A store of the earlier
// version that was running keeps working; one that opens the database
// then refuses it as newer.
func TestMigrateToBytewiseKeys(t *testing.T) {
	want := layout(t, open(t, pgtest.DB(t), nil).Pool())

	dsn, pool, old := atVersion1(t)

	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d of %s", runs.Add(1), b)
	})
	serve := func(s testserver.Store) *httptest.Server {
		mw := &testserver.Middleware{Store: s, Scope: func(r *http.Request) string { return r.Header.Get("Account") }}
		srv := httptest.NewServer(mw.Wrap(handler))
		t.Cleanup(srv.Close)
		return srv
	}
	accounts := []string{"acct-1", "acct 1", "acct1"}
	keys := []string{"3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f", "3f1c2a9e8b7d4c6e9f102a3b4c5d6e7f",
		"a-b", "ab", "a b", "a-c", "A-b", "-ab", "a_b", "a.b", "a--b", "a - b"}

	srv := serve(old)
	first := map[string]answer{}
	n := 0
	for _, account := range accounts {
		for _, key := range keys {
			n++
			a := post(t, srv, key, account, fmt.Sprintf(`{"n":%d}`, n))
			if a.status != http.StatusCreated || a.replayed != "" {
				t.Fatalf("first request of %q in %q: %+v; want 201, run", key, account, a)
			}
			first[account+"\x00"+key] = a
		}
	}
	inFlight := [][2]string{{"acct-1", "in-flight-1"}, {"acct 1", "in flight 1"}, {"é-1", "straße-ü"}, {"e-1", "strasse-u"}}
	for i, c := range inFlight {
		if _, claimed, err := old.Claim(t.Context(), c[0], c[1], "fp", testserver.Fence{Token: int64(100 + i)}, t0); err != nil || !claimed {
			t.Fatalf("claim of %q in %q at version 1 = %v, %v; want claimed", c[1], c[0], claimed, err)
		}
	}
	var entries int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&entries); err != nil {
		t.Fatal(err)
	}

	s := open(t, dsn, nil)
	if v := versions(t, pool); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("schema versions after Open = %v; want [1 2 3]", v)
	}
	if got := layout(t, pool); !slices.Equal(got, want) {
		t.Errorf("the table migrated from version 1:\n%s\nwant it as created at the current version:\n%s",
			strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var after int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != entries {
		t.Errorf("%d entries after the migration; want the %d before", after, entries)
	}

	runsBefore := runs.Load()
	srv = serve(s)
	n = 0
	for _, account := range accounts {
		for _, key := range keys {
			n++
			a := post(t, srv, key, account, fmt.Sprintf(`{"n":%d}`, n))
			if w := first[account+"\x00"+key]; a.status != w.status || a.body != w.body || a.replayed != "true" {
				t.Errorf("retry of %q in %q after the migration: %+v; want the replay of %+v", key, account, a, w)
			}
		}
	}
	if r := runs.Load(); r != runsBefore {
		t.Errorf("the handler ran %d times more after the migration; want 0: every key was found", r-runsBefore)
	}
	for i, c := range inFlight {
		e, claimed, err := s.Claim(t.Context(), c[0], c[1], "fp", testserver.Fence{Token: 1}, t0)
		if err != nil || claimed || e.Status != "in_flight" || e.Token != int64(100+i) {
			t.Errorf("claim of %q in %q after the migration = %+v, claimed %v, %v; want the claim in flight under token %d",
				c[1], c[0], e, claimed, err, 100+i)
		}
	}
	if a := post(t, srv, "a-d", "acct-1", `{"n":0}`); a.status != http.StatusCreated || a.replayed != "" {
		t.Errorf("a new key after the migration: %+v; want 201, run", a)
	}
	// An instance of the earlier version that was running keeps working
	// on its connections: its statements name no column the migrations
	// changed or added.
	if e, claimed, err := old.Claim(t.Context(), "é-1", "straße-ü", "fp", testserver.Fence{Token: 1}, t0); err != nil || claimed || e.Token != 102 {
		t.Errorf("claim by the earlier version after the migration = %+v, claimed %v, %v; want the claim in flight under token 102",
			e, claimed, err)
	}
	if _, claimed, err := old.Claim(t.Context(), "acct-1", "a-e", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Errorf("claim of a new key by the earlier version after the migration = %v, %v; want claimed", claimed, err)
	}

	err := pgstore.MigrateTo(t.Context(), pool, 1)
	if !errors.Is(err, pgstore.ErrSchemaTooNew) || !strings.Contains(err.Error(), "version 3, this package knows up to 1") {
		t.Errorf("version 1 of the package opening the migrated database: %v; want ErrSchemaTooNew, version 3", err)
	}
}

// TestMigrateWithoutOwnership: a role that may read and write the store's
// table but does not own it opens a database at version 1. The migration,
// which alters the table, is refused with ErrPrivilege wrapping the
// server's refusal (SQLSTATE 42501), and the database stays at version 1
// with its entries.
func TestMigrateWithoutOwnership(t *testing.T) {
	dsn, pool, _ := atVersion1(t)
	before := layout(t, pool)
	app := pgtest.AppRole(t, dsn, `GRANT SELECT ON idempotency_keys_schema`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys`)
	s, err := pgstore.Open(t.Context(), app, nil)
	if err == nil {
		s.Close()
	}
	var pgErr *pgconn.PgError
	if !errors.Is(err, pgstore.ErrPrivilege) || !strings.Contains(err.Error(), `in schema "public"`) ||
		!errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("Open of a version-1 database as a role that does not own the table: %v; want ErrPrivilege, 42501", err)
	}
	if v := versions(t, pool); !slices.Equal(v, []int32{1}) {
		t.Errorf("schema versions after the refused Open = %v; want [1]", v)
	}
	if got := layout(t, pool); !slices.Equal(got, before) {
		t.Errorf("the table after the refused Open:\n%s\nwant as before:\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE key = 'k-1'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the entry after the refused Open: %d, %v; want 1", n, err)
	}
}

// TestMigrateRefusesKeysTwice: a database at version 1 whose primary key's
// index lost rows (as an index built in a collation's old order does: a
// claim missed the key's entry and inserted a second one) holds a key
// twice. The migration's rebuild of the index finds it and fails with the
// server's unique_violation (SQLSTATE 23505), naming the index; the
// database stays at version 1, both entries kept for the operator to
// resolve.
func TestMigrateRefusesKeysTwice(t *testing.T) {
	dsn, pool, _ := atVersion1(t)
	// The index stops receiving rows, and a second entry of the key goes
	// in unchecked, as it does past an index whose order is no longer its
	// collation's: the lookup misses the first.
	setReady := `UPDATE pg_catalog.pg_index SET indisready = $1 WHERE indexrelid = 'idempotency_keys_pkey'::regclass`
	if _, err := pool.Exec(t.Context(), setReady, false); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // no connection keeps the index's old state cached
	if _, err := pool.Exec(t.Context(), `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created)
		VALUES ('s', 'k-1', 'fp', 'in_flight', 2, 0)`); err != nil {
		t.Fatalf("second entry of the key with the index out of use: %v", err)
	}
	if _, err := pool.Exec(t.Context(), setReady, true); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
	s, err := pgstore.Open(t.Context(), dsn, nil)
	if err == nil {
		s.Close()
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || !strings.Contains(err.Error(), "pgstore: migrate: version 2:") ||
		!strings.Contains(err.Error(), "idempotency_keys_pkey") {
		t.Errorf("Open of a database holding a key twice: %v; want the migration to version 2 refused, 23505 on idempotency_keys_pkey", err)
	}
	if v := versions(t, pool); !slices.Equal(v, []int32{1}) {
		t.Errorf("schema versions after the refused migration = %v; want [1]", v)
	}
	rows, err := pool.Query(t.Context(), `SELECT locked_at FROM idempotency_keys WHERE key = 'k-1' ORDER BY locked_at`)
	if err != nil {
		t.Fatal(err)
	}
	if tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || !slices.Equal(tokens, []int64{1, 2}) {
		t.Errorf("entries of the key after the refused migration: tokens %v, %v; want both, 1 and 2", tokens, err)
	}
}

// TestMigrateAddsClaimID opens, with this package, a database at version
// 2, which kept no claim IDs, holding a claim in flight: Open adds
// claim_id (version 3), the claim is found under its token with the empty
// ID, refuses a release under its token with another ID, and is taken
// over and saved as any other. A store of version 2 still running claims
// a new key, which the current one takes over.
func TestMigrateAddsClaimID(t *testing.T) {
	dsn := pgtest.DB(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.MigrateTo(t.Context(), pool, 2); err != nil {
		t.Fatalf("migrating to version 2: %v", err)
	}
	old := pgstore.OnSchema(pool, "public")
	if _, claimed, err := old.Claim(t.Context(), "s", "held", "fp", testserver.Fence{Token: 7}, t0); err != nil || !claimed {
		t.Fatalf("claim at version 2 = %v, %v", claimed, err)
	}

	s := open(t, dsn, nil)
	if v := versions(t, pool); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("schema versions after Open = %v; want [1 2 3]", v)
	}
	held := testserver.Fence{Token: 7}
	e, claimed, err := s.Claim(t.Context(), "s", "held", "fp", testserver.Fence{Token: 7, ClaimID: "new"}, t0)
	if err != nil || claimed || e.Status != testserver.StatusInFlight || e.Fence != held {
		t.Fatalf("claim after the migration = %+v, claimed %v, %v; want the claim in flight under %+v", e, claimed, err, held)
	}
	if ok, err := s.Release(t.Context(), "s", "held", testserver.Fence{Token: 7, ClaimID: "new"}); ok || err != nil {
		t.Fatalf("Release under its token with another ID = %v, %v; want false", ok, err)
	}
	over := testserver.Fence{Token: 8, ClaimID: "over"}
	if ok, err := s.TakeOver(t.Context(), "s", "held", held, over); !ok || err != nil {
		t.Fatalf("TakeOver of the claim with the empty ID = %v, %v; want true", ok, err)
	}
	if err := s.Save(t.Context(), "s", "held", over, testserver.Response{Status: 201}); err != nil {
		t.Fatalf("Save after the take-over: %v", err)
	}

	if _, claimed, err := old.Claim(t.Context(), "s", "new", "fp", testserver.Fence{Token: 7}, t0); err != nil || !claimed {
		t.Fatalf("claim by the store of version 2 after the migration = %v, %v; want claimed", claimed, err)
	}
	if ok, err := s.TakeOver(t.Context(), "s", "new", held, over); !ok || err != nil {
		t.Fatalf("TakeOver of its claim = %v, %v; want true", ok, err)
	}
}
