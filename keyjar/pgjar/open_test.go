package pgjar_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/nocreate"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
)

// TestOpenWithoutCreating: an Open marked by internal/nocreate (idemctl's)
// opens a database that holds the jar and creates nothing in one that
// does not: not the tables, not one table dropped from a jar, not the
// record of a version.
func TestOpenWithoutCreating(t *testing.T) {
	ctx := nocreate.Mark(t.Context())
	dsn := pgtest.DB(t)
	conn := connect(t, dsn)
	tables := func() string {
		t.Helper()
		var names string
		if err := conn.QueryRow(t.Context(), `SELECT coalesce(string_agg(tablename, ',' ORDER BY tablename), '')
			FROM pg_tables WHERE schemaname = current_schema()`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	refused := func(what, missing string) {
		t.Helper()
		before := tables()
		j, err := pgjar.Open(ctx, dsn, nil)
		if err == nil {
			j.Close()
		}
		if !errors.Is(err, nocreate.ErrNoJar) || !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: Open = %v; want nocreate.ErrNoJar saying %q", what, err, missing)
		}
		if after := tables(); after != before {
			t.Errorf("%s: tables %q after the Open; want %q, as before", what, after, before)
		}
	}

	refused("an empty database", "(no table idem_operations)")

	open(t, dsn, nil).Close() // creates the jar
	j, err := pgjar.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatalf("a database with a jar: %v", err)
	}
	if _, _, err := j.Begin(ctx, record("op")); err != nil {
		t.Fatalf("Begin in the jar opened: %v", err)
	}
	j.Close()

	for _, c := range []struct{ what, sql, missing string }{
		{"a newer schema", `INSERT INTO idem_operations_schema (version) VALUES (99)`, ""},
		{"no version recorded", `TRUNCATE idem_operations_schema`, "(idem_operations_schema records version 0, not 1)"},
		{"no table of versions", `DROP TABLE idem_operations_schema`, "(no table idem_operations_schema)"},
		{"no table of records", `DROP TABLE idem_operations; CREATE TABLE idem_operations_schema (version integer);
			INSERT INTO idem_operations_schema VALUES (1)`, "(no table idem_operations)"},
	} {
		if _, err := conn.Exec(t.Context(), c.sql); err != nil {
			t.Fatal(err)
		}
		if c.missing != "" {
			refused(c.what, c.missing)
			continue
		}
		if _, err := pgjar.Open(ctx, dsn, nil); !errors.Is(err, pgjar.ErrVersion) {
			t.Errorf("%s: Open = %v; want ErrVersion", c.what, err)
		}
		if _, err := conn.Exec(t.Context(), `DELETE FROM idem_operations_schema WHERE version = 99`); err != nil {
			t.Fatal(err)
		}
	}
}
