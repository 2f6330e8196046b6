package main

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestPostgresPruneSkipsLocked: a prune of a PostgreSQL jar skips the
// operations another transaction holds locked (pgjar's FOR UPDATE SKIP
// LOCKED), and says how many it left, rather than print its count alone,
// as if no other were due.
func TestPostgresPruneSkipsLocked(t *testing.T) {
	dsn := seedPostgres(t, newServer(t))
	conn := pgtest.Connect(t, dsn)
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM idem_operations WHERE op = 'charge:done' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemctl("--jar", dsn, "prune", "--older-than", "24h")
	if code != 0 || !strings.HasPrefix(out, "pruned 2 operation(s)") ||
		!strings.Contains(errOut, "1 operation(s) not updated for 24h left") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("prune with charge:done locked: exit %d, stdout %q, stderr %q; want exit 0, 2 pruned, and one line saying 1 was left", code, out, errOut)
	}
	tx.Rollback(t.Context())
	code, out, errOut = idemctl("--jar", dsn, "prune", "--older-than", "24h")
	if code != 0 || !strings.HasPrefix(out, "pruned 1 operation(s)") || errOut != "" {
		t.Fatalf("prune once unlocked: exit %d, stdout %q, stderr %q; want exit 0, 1 pruned, nothing on stderr", code, out, errOut)
	}
}
