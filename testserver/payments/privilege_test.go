package payments_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// TestNewPayCoWithoutCreatePrivilege opens, as a role that may read and
// write the ledger's tables but create nothing (an application role, the
// tables created by their owner), a database that holds the ledger: NewPayCo
// must create nothing, and the ledger works. Before, its CREATE TABLE IF NOT
// EXISTS, which needs CREATE on the schema even when the table exists,
// failed with SQLSTATE 42501, and idemserver could not start as that role.
func TestNewPayCoWithoutCreatePrivilege(t *testing.T) {
	dsn := pgtest.DB(t)
	first := charge(t, ledger(t, dsn), "charge:o-1", "o-1") // creates the tables, as the superuser
	p := ledger(t, pgtest.AppRole(t, dsn, `GRANT SELECT, INSERT, UPDATE, DELETE ON payco_calls, payco_charges`))
	if again := charge(t, p, "charge:o-1", "o-1"); again != first {
		t.Errorf("charge with the same key as that role = %+v; want the first, %+v", again, first)
	}
	charge(t, p, "charge:o-2", "o-2")
	st, err := p.Stats(t.Context())
	if err != nil || st.Charges != 3 || st.Settled != 2 || st.DoubleCharged != 1 {
		t.Errorf("Stats = %+v, %v; want 3 calls, 2 charges, 1 order called twice", st, err)
	}
	if c, err := p.Get(t.Context(), first.ID); err != nil || c != first {
		t.Errorf("Get = %+v, %v; want %+v", c, err, first)
	}
	if cs, err := p.Order(t.Context(), "o-1"); err != nil || len(cs) != 1 || cs[0] != first {
		t.Errorf("Order = %+v, %v; want [%+v]", cs, err, first)
	}
}

// TestNewPayCoWithoutCreatePrivilegeNoLedger opens, as a role that may not
// create tables, a database without the ledger: NewPayCo returns
// ErrPrivilege, naming the schema and saying to create the ledger once as a
// role that may, with the server's error (42501) still in it, and creates
// nothing. Before, it was a bare "payments: creating the PayCo ledger:
// ERROR: permission denied for schema public (SQLSTATE 42501)".
func TestNewPayCoWithoutCreatePrivilegeNoLedger(t *testing.T) {
	dsn := pgtest.DB(t)
	cfg, err := pgx.ParseConfig(pgtest.AppRole(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	_, err = payments.NewPayCo(t.Context(), db)
	pgtest.RefusedCreate(t, dsn, err, payments.ErrPrivilege, "public")
}

// TestNewPayCoWithoutWritePrivilege opens the ledger, created by its
// owner, as a role that may not write one of its tables: NewPayCo returns
// ErrPrivilege naming the table and what to grant. Before, it opened, and
// every charge then failed ("permission denied for table payco_calls"),
// which idemserver answered 502, having started as if all was well.
func TestNewPayCoWithoutWritePrivilege(t *testing.T) {
	for _, c := range []struct{ grant, want string }{
		{`GRANT SELECT ON payco_calls, payco_charges`, "GRANT SELECT, INSERT, UPDATE ON \"public\".\"payco_calls\""},
		{`GRANT SELECT, INSERT, UPDATE ON payco_calls, payco_charges`, ""}, // what a charge needs
		{`GRANT SELECT, UPDATE ON payco_calls, payco_charges`, "may not INSERT on \"public\".\"payco_calls\""},
		{`GRANT SELECT, INSERT, UPDATE ON payco_calls; GRANT SELECT ON payco_charges`, "GRANT SELECT, INSERT ON \"public\".\"payco_charges\""},
	} {
		dsn := pgtest.DB(t)
		ledger(t, dsn) // the tables, created by the superuser
		cfg, err := pgx.ParseConfig(pgtest.AppRole(t, dsn, strings.Split(c.grant, "; ")...))
		if err != nil {
			t.Fatal(err)
		}
		db := stdlib.OpenDB(*cfg)
		defer db.Close()
		p, err := payments.NewPayCo(t.Context(), db)
		if c.want == "" {
			if err != nil {
				t.Fatalf("%s: NewPayCo = %v; want the ledger opened", c.grant, err)
			}
			charge(t, p, "charge:o-1", "o-1")
			continue
		}
		if !errors.Is(err, payments.ErrPrivilege) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%s: NewPayCo = %v; want %v saying %q", c.grant, err, payments.ErrPrivilege, c.want)
		}
	}
}

// TestNewPayCoReadOnly: a connection whose transactions are read-only (a
// hot standby, or default_transaction_read_only) is refused with
// ErrPrivilege saying so, on a database without the ledger (and creates
// nothing) and on one that holds it. Before, the first failed with the
// server's bare "cannot execute CREATE TABLE in a read-only transaction",
// and the second opened, and every charge then failed, which idemserver
// answered 502.
func TestNewPayCoReadOnly(t *testing.T) {
	const readOnly = "&default_transaction_read_only=on"
	empty, full := pgtest.DB(t), pgtest.DB(t)
	ledger(t, full)
	for _, dsn := range []string{empty, full} {
		cfg, err := pgx.ParseConfig(dsn + readOnly)
		if err != nil {
			t.Fatal(err)
		}
		db := stdlib.OpenDB(*cfg)
		defer db.Close()
		if _, err := payments.NewPayCo(t.Context(), db); !errors.Is(err, payments.ErrPrivilege) || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("NewPayCo over read-only transactions: %v; want %v saying read-only", err, payments.ErrPrivilege)
		}
	}
	if tables := pgtest.Tables(t, empty); tables != "" {
		t.Errorf("tables %s after that; want none", tables)
	}
}
