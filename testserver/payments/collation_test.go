package payments_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
)

// ledgerKeys describes the ledger's tables as the catalog holds them (see
// pgtest.Layout).
func ledgerKeys(t *testing.T, dsn string) []string {
	t.Helper()
	return pgtest.Layout(t, pgtest.Connect(t, dsn), "payco_calls", "payco_charges")
}

// TestLedgerKeysCollateBytewise: a ledger that NewPayCo creates on
// PostgreSQL keeps its unique and indexed ids (a charge's id, its dedup
// key, the order's id) in the "C" collation, which no upgrade of the
// operating system's C library reorders, so that its indexes find every
// row they hold; dedup on a key with hyphens then works as before. Before,
// they were in the database's default collation.
func TestLedgerKeysCollateBytewise(t *testing.T) {
	dsn := pgtest.DB(t)
	p := ledger(t, dsn)
	want := []string{
		"payco_calls.order_id text collate C not null",
		"payco_calls.calls integer collate - not null",
		"payco_charges.id text collate C not null",
		"payco_charges.dedup_key text collate C",
		"payco_charges.order_id text collate C not null",
		"payco_charges.amount bigint collate - not null",
		"payco_charges.currency text collate default not null",
		"payco_charges.created bigint collate - not null",
		"index CREATE INDEX payco_charges_order ON public.payco_charges USING btree (order_id) collate C",
		"index CREATE UNIQUE INDEX payco_calls_pkey ON public.payco_calls USING btree (order_id) collate C",
		"index CREATE UNIQUE INDEX payco_charges_dedup_key_key ON public.payco_charges USING btree (dedup_key) collate C",
		"index CREATE UNIQUE INDEX payco_charges_pkey ON public.payco_charges USING btree (id) collate C",
	}
	if got := ledgerKeys(t, dsn); !slices.Equal(got, want) {
		t.Errorf("the ledger's keys:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	first := charge(t, p, "charge:3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f", "o-1 a")
	if again := charge(t, p, "charge:3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f", "o-1 a"); again != first {
		t.Errorf("second charge with the same key = %+v; want the first, %+v", again, first)
	}
}

// TestLedgerCreatedBefore: NewPayCo opens a ledger whose tables were
// created before its keys were in the "C" collation as it finds it:
// nothing is altered, and the ledger works.
func TestLedgerCreatedBefore(t *testing.T) {
	dsn := pgtest.DB(t)
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `
		CREATE TABLE payco_calls (
			order_id TEXT PRIMARY KEY,
			calls    INTEGER NOT NULL
		);
		CREATE TABLE payco_charges (
			id        TEXT PRIMARY KEY,
			dedup_key TEXT UNIQUE,
			order_id  TEXT NOT NULL,
			amount    BIGINT NOT NULL,
			currency  TEXT NOT NULL,
			created   BIGINT NOT NULL
		);
		CREATE INDEX payco_charges_order ON payco_charges (order_id);`); err != nil {
		t.Fatal(err)
	}
	before := ledgerKeys(t, dsn)
	if !slices.Contains(before, "payco_charges.dedup_key text collate default") {
		t.Fatalf("the ledger created before: %v; want dedup_key in the default collation", before)
	}
	p := ledger(t, dsn)
	first := charge(t, p, "charge:o-1", "o-1")
	if again := charge(t, p, "charge:o-1", "o-1"); again != first {
		t.Errorf("second charge with the same key = %+v; want the first, %+v", again, first)
	}
	if after := ledgerKeys(t, dsn); !slices.Equal(after, before) {
		t.Errorf("the ledger after NewPayCo:\n%s\nwant it as it was:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
}
