package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartTogether runs open n times at once against the database of dsn, as
// n processes starting together would, and returns their errors. Each
// open's migration takes the transaction-scoped advisory lock key:
// StartTogether holds that lock until all n wait for it, so that they
// migrate one after the other, each having started before the previous
// one committed. The database's default_transaction_isolation is set to
// REPEATABLE READ first, a common setting under which a transaction's
// snapshot can predate the lock it waited for.
func StartTogether(t testing.TB, dsn string, key int64, n int, open func() error) []error {
	t.Helper()
	ctx := t.Context()
	admin := locked(t, dsn, key)
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_isolation = 'repeatable read'`,
		pgx.Identifier{admin.Config().Database}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	for range n {
		go func() { errs <- open() }()
	}
	const polls = 100_000 // each a round trip: seconds, not forever
	for i := 0; ; i++ {
		if i == polls {
			t.Fatalf("after %d polls, fewer than %d sessions wait for the advisory lock", polls, n)
		}
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			break
		}
	}
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	out := make([]error, n)
	for i := range out {
		out[i] = <-errs
	}
	return out
}

// HoldLock runs open while it holds the advisory lock key, as a process that
// migrates would, and releases the lock once open has waited for it longer
// than wait (as the server measures it). It returns open's error, and fails
// t when open returns while the lock is held.
func HoldLock(t testing.TB, dsn string, key int64, wait time.Duration, open func() error) error {
	t.Helper()
	ctx := t.Context()
	admin := locked(t, dsn, key)
	defer admin.Close(context.Background())
	opened := make(chan error, 1)
	go func() { opened <- open() }()
	const polls = 100_000 // each a round trip: seconds, not forever
	for i := 0; ; i++ {
		select {
		case err := <-opened:
			t.Fatalf("returned while another session held the advisory lock: %v", err)
		default:
		}
		if i == polls {
			t.Fatalf("after %d polls, no session has waited %v for the advisory lock", polls, wait)
		}
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'
			AND clock_timestamp() - query_start > $1`, wait).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
	}
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	return <-opened
}

// locked connects to dsn and takes the advisory lock key in that session,
// until it ends or unlocks it.
func locked(t testing.TB, dsn string, key int64) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `SELECT pg_advisory_lock($1)`, key); err != nil {
		conn.Close(context.Background())
		t.Fatal(err)
	}
	return conn
}
