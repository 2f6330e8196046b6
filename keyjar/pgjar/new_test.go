package pgjar_test

import (
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/jartest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newPool returns a pool on the database dsn names, closed when the test
// ends, after the jars on it.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// onPool returns a jar from New on pool, closed when the test ends.
func onPool(t *testing.T, pool *pgxpool.Pool, opts *pgjar.Options) *pgjar.Jar {
	t.Helper()
	j, err := pgjar.New(t.Context(), pool, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return closeAtEnd(t, j)
}

func TestNewConformance(t *testing.T) {
	t.Parallel()
	jartest.Run(t, func(t *testing.T) jartest.Jar { return onPool(t, newPool(t, pgtest.DB(t)), nil) })
}

// TestNewLeavesThePoolOpen: two jars on one pool share its database; the
// Close of one leaves the pool, and the other jar, working. Open's jar
// owns its pool, and its Close closes it.
func TestNewLeavesThePoolOpen(t *testing.T) {
	dsn := pgtest.DB(t)
	pool := newPool(t, dsn)
	ctx := t.Context()
	first := onPool(t, pool, nil)
	if _, created, err := first.Begin(ctx, record("op")); err != nil || !created {
		t.Fatalf("Begin = %v, %v; want created", created, err)
	}
	second := onPool(t, pool, &pgjar.Options{PruneBatch: 1})
	if rec, err := second.Get(ctx, "op"); err != nil || rec.Key != "key-op" {
		t.Fatalf("the second jar's Get = %+v, %v; want the first's record", rec, err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Get(ctx, "op"); !errors.Is(err, pgjar.ErrClosed) {
		t.Errorf("Get after Close = %v; want ErrClosed", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("the pool after the first jar's Close: %v", err)
	}
	if _, err := second.Update(ctx, "op", "", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
		t.Fatalf("the second jar's Update after the first's Close: %v", err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM idem_operations WHERE op = 'op'`).Scan(&state); err != nil || state != "done" {
		t.Fatalf("the pool after both jars closed: %q, %v; want the record done", state, err)
	}

	owner := open(t, dsn, nil)
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pgjar.PoolOf(owner).Ping(ctx); err == nil {
		t.Error("the pool of Open's jar is open after its Close")
	}
}

// TestNewPoolSettings: New refuses, creating nothing, a pool whose
// connections do not run READ COMMITTED by default or that would commit
// Begin's keys with synchronous_commit off without the pool's config
// choosing it; it takes one whose config sets either.
func TestNewPoolSettings(t *testing.T) {
	if _, err := pgjar.New(t.Context(), nil, nil); !errors.Is(err, pgjar.ErrPool) {
		t.Errorf("New(nil pool) = %v; want ErrPool", err)
	}
	dsn := pgtest.DB(t)
	setDatabaseDefault(t, dsn, "default_transaction_isolation", "repeatable read")
	setDatabaseDefault(t, dsn, "synchronous_commit", "off")
	conn := pgtest.Connect(t, dsn)
	for _, c := range []struct {
		params string // added to the DSN
		ok     bool
	}{
		{"", false},
		{"&synchronous_commit=on", false},
		{"&default_transaction_isolation=read%20committed", false},
		{"&default_transaction_isolation=read%20committed&synchronous_commit=on", true},
		{"&default_transaction_isolation=read%20committed&synchronous_commit=off", true},
	} {
		j, err := pgjar.New(t.Context(), newPool(t, dsn+c.params), nil)
		if err == nil {
			j.Close()
		}
		if c.ok != (err == nil) || !c.ok && !errors.Is(err, pgjar.ErrPool) {
			t.Errorf("New on a pool with %q = %v; want ok %v, or ErrPool", c.params, err, c.ok)
		}
		var tables bool
		if err := conn.QueryRow(t.Context(), `SELECT to_regclass('idem_operations') IS NOT NULL`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != c.ok {
			t.Fatalf("after New on a pool with %q: the jar's table exists: %v; want %v", c.params, tables, c.ok)
		}
	}
}

// TestNewBehindTransactionPooler: New, with and without MustExist, on a
// pool whose one session's prepared statements are not those of pgx's
// cache (see pgtest.MixUp) goes through, its statements run again at once
// in pgx's exec mode. Before, it failed with SQLSTATE 26000 or 42P05.
func TestNewBehindTransactionPooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		t.Run(code, func(t *testing.T) {
			pool := newPool(t, pgtest.DB(t)+"&pool_max_conns=1")
			for _, opts := range []*pgjar.Options{nil, {MustExist: true}} {
				if err := onPool(t, pool, opts).Close(); err != nil { // pgx prepares New's statements
					t.Fatal(err)
				}
				if err := pgtest.MixUp(t.Context(), pool, code); err != nil {
					t.Fatal(err)
				}
				j, err := pgjar.New(t.Context(), pool, opts)
				if err != nil {
					t.Fatalf("New (%+v) on a mixed-up session: %v; want it through", opts, err)
				}
				j.Close()
			}
		})
	}
}
