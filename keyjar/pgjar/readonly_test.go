package pgjar_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestReadOnlyWindowEnds: a session made while the database's transactions
// were read-only (default_transaction_read_only set for the database or the
// role, later reset) keeps that default for its life. A write during the
// window fails with the server's error (SQLSTATE 25006), and the first one
// after it succeeds, a method's as the applier's, though the pool's one
// connection is a session made in the window (it read meanwhile): the jar
// drops such sessions and writes again on a new one, rather than fail every
// write on them until the pool retires them (an hour later, for one in use).
func TestReadOnlyWindowEnds(t *testing.T) {
	dsn := pgtest.DB(t)
	var logged syncBuffer
	j := open(t, dsn+"&pool_max_conns=1", &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	leased(t, j, "before")
	admin := pgtest.Connect(t, dsn) // made before the window: it may write
	db := pgx.Identifier{admin.Config().Database}.Sanitize()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// window makes transactions read-only, ends the jar's sessions, and
	// leaves in its pool one made in the window, by a read.
	window := func() {
		t.Helper()
		exec(`ALTER DATABASE ` + db + ` SET default_transaction_read_only = on`)
		exec(`SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, admin.Config().Database)
		if _, err := j.Get(t.Context(), "before"); err != nil {
			t.Fatal(err)
		}
	}
	windowEnds := func() { exec(`ALTER DATABASE ` + db + ` RESET default_transaction_read_only`) }

	window()
	_, _, err := j.Begin(t.Context(), record("during"))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("Begin while transactions are read-only: %v; want SQLSTATE 25006", err)
	}
	// The applier's batch meets such a session too, and drops its change,
	// which Get waits for (read-your-writes).
	if err := j.Defer("before", "h", idem.Change{Now: t0, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Get(t.Context(), "before"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "25006") {
		t.Fatalf("the applier logged %q; want the change dropped on SQLSTATE 25006", logged.String())
	}
	windowEnds()
	if _, _, err := j.Begin(t.Context(), record("after")); err != nil {
		t.Errorf("Begin once transactions may write again: %v", err)
	}

	window()
	windowEnds()
	if err := j.Defer("before", "h", done); err != nil {
		t.Fatal(err)
	}
	rec, err := j.Get(t.Context(), "before")
	if err != nil || rec.State != idem.StateDone || rec.LastStatus != 201 {
		t.Errorf("Get after a change deferred once transactions may write again = %s, status %d, %v; want done, 201",
			rec.State, rec.LastStatus, err)
	}
	closeDropped(t, j, "1 since", "25006") // the change of the first window alone
}
