package pgjar_test

import (
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestAbandonSurvivesACrash abandons a pending operation with
// client.Abandon and stops PostgreSQL as pg_ctl stop -m immediate does,
// with what its walwriter had yet to write still in its buffers: after
// crash recovery the operation is abandoned, as Abandon reported. Before,
// the change committed with synchronous_commit=off, as Update's others:
// the crash took it back to pending, and a resume (idemctl resume --all,
// a program's Pending and Resume on start) would send an operation that
// its caller abandoned, having established that it did not happen.
func TestAbandonSurvivesACrash(t *testing.T) {
	t.Parallel()
	c, dsn := pgtest.Own(t)
	j := open(t, dsn, nil)
	ctx := t.Context()
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(ctx, "", &client.Options{Jar: j})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c.HoldWALWriter(t, dsn)
	if err := cl.Abandon(ctx, "op", "no charge in the ledger"); err != nil {
		t.Fatal(err)
	}
	if err := c.Crash(ctx, nil); err != nil {
		t.Fatal(err)
	}
	rec, err := j.Get(ctx, "op")
	if err != nil || rec.State != idem.StateAbandoned || rec.Note != "no charge in the ledger" {
		t.Errorf("after the crash: %s, note %q, %v; want abandoned, as Abandon reported", rec.State, rec.Note, err)
	}
}
