package pgjar_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestReadOnlyWindowEnds: a session made while the database's transactions
// were read-only (default_transaction_read_only set for the database or the
// role, later reset) keeps that default for its life. A write that such a
// session refuses (SQLSTATE 25006) fails, as it must, but neither a method
// of the jar nor its applier gives the connection back to the pool: once
// the setting is reset, the jar writes again from its next statement,
// rather than fail every write on the connections made meanwhile until the
// pool retires them (an hour later, for one in use).
func TestReadOnlyWindowEnds(t *testing.T) {
	dsn := pgtest.DB(t)
	var logged syncBuffer
	j := open(t, dsn, &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if _, _, err := j.Begin(t.Context(), record("before")); err != nil {
		t.Fatal(err)
	}
	admin := pgtest.Connect(t, dsn)
	db := pgx.Identifier{admin.Config().Database}.Sanitize()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`ALTER DATABASE ` + db + ` SET default_transaction_read_only = on`)
	exec(`SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid()`, admin.Config().Database)

	_, _, err := j.Begin(t.Context(), record("during"))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("Begin while transactions are read-only: %v; want SQLSTATE 25006", err)
	}
	// The applier's batch meets such a session too, and drops its change.
	if err := j.Defer("before", "h", idem.Change{Now: t0}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logged.String(), "25006"); {
		if time.Now().After(deadline) {
			t.Fatalf("the applier logged %q; want the change dropped on SQLSTATE 25006", logged.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	exec(`ALTER DATABASE ` + db + ` RESET default_transaction_read_only`)
	for _, op := range []string{"after", "after2"} {
		if _, _, err := j.Begin(t.Context(), record(op)); err != nil {
			t.Errorf("Begin %q once transactions may write again: %v", op, err)
		}
	}
}
