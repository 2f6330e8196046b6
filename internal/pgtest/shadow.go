package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ShadowingPool returns a pool of at most two connections to the database
// dsn names, closed when t ends, each of which gets, as it connects, a
// temporary table named table, made LIKE public's table of that name
// (which must exist), indexes included. pg_temp is searched first: a
// statement on the pool that names the table without its schema reads and
// writes the temporary one.
func ShadowingPool(t testing.TB, dsn, table string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `CREATE TEMP TABLE `+pgx.Identifier{table}.Sanitize()+
			` (LIKE `+pgx.Identifier{"public", table}.Sanitize()+` INCLUDING ALL)`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TempRows returns how many rows the temporary tables named table hold,
// summed over the idle connections of pool, which ShadowingPool made. It
// fails t when pool has no idle connection.
func TempRows(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	conns := pool.AcquireAllIdle(t.Context())
	if len(conns) == 0 {
		t.Fatal("pgtest: no idle connection in the pool")
	}
	total := 0
	for _, c := range conns {
		var n int
		err := c.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{"pg_temp", table}.Sanitize()).Scan(&n)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}
