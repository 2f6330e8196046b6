package payments_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// ledger opens PayCo through database/sql on the database dsn names, as
// idemserver does.
func ledger(t *testing.T, dsn string) *payments.PayCo {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	p, err := payments.NewPayCo(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// onPool opens PayCo through database/sql on pool's connections.
func onPool(t *testing.T, pool *pgxpool.Pool) (*payments.PayCo, error) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	return payments.NewPayCo(t.Context(), db)
}

// charge charges order once with key, through p.
func charge(t *testing.T, p *payments.PayCo, key, order string) payments.Charge {
	t.Helper()
	c, err := p.Charge(t.Context(), key, order, 100, "usd")
	if err != nil {
		t.Fatalf("Charge of %s: %v", order, err)
	}
	return c
}

// ledgerRows returns the order:calls of each row of schema's payco_calls
// and the order of each row of its payco_charges, in order,
// comma-separated.
func ledgerRows(t *testing.T, admin *pgx.Conn, schema string) (calls, charges string) {
	t.Helper()
	q := func(table string) string { return pgx.Identifier{schema, table}.Sanitize() }
	if err := admin.QueryRow(t.Context(), `SELECT
		(SELECT coalesce(string_agg(order_id || ':' || calls, ',' ORDER BY order_id), '') FROM `+q("payco_calls")+`),
		(SELECT coalesce(string_agg(order_id, ',' ORDER BY order_id), '') FROM `+q("payco_charges")+`)`).
		Scan(&calls, &charges); err != nil {
		t.Fatal(err)
	}
	return calls, charges
}

// TestLedgerTempTableDoesNotShadow: a temporary table named as one of the
// ledger's on every connection (pg_temp is searched first) neither hides
// the ledger's rows nor receives its writes. Before, PayCo named its
// tables without their schema: a charge made before was not found, and
// the calls counted and the charges made went to the temporary table.
func TestLedgerTempTableDoesNotShadow(t *testing.T) {
	for _, table := range []string{"payco_calls", "payco_charges"} {
		t.Run(table, func(t *testing.T) {
			ctx := t.Context()
			dsn := pgtest.DB(t)
			before := charge(t, ledger(t, dsn), "charge:o-before", "o-before")
			pool := pgtest.ShadowingPool(t, dsn, table)
			p, err := onPool(t, pool)
			if err != nil {
				t.Fatal(err)
			}

			if c, err := p.Get(ctx, before.ID); err != nil || c != before {
				t.Errorf("Get of the charge made before = %+v, %v; want %+v", c, err, before)
			}
			after := charge(t, p, "charge:o-after", "o-after")
			if again := charge(t, p, "charge:o-after", "o-after"); again != after {
				t.Errorf("second charge with the key = %+v; want the first, %+v", again, after)
			}
			if cs, err := p.Order(ctx, "o-after"); err != nil || len(cs) != 1 || cs[0] != after {
				t.Errorf("Order = %+v, %v; want the one charge", cs, err)
			}
			s, err := p.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Charges != 3 || s.PerOrder["o-before"] != 1 || s.PerOrder["o-after"] != 2 || s.Settled != 2 {
				t.Errorf("Stats = %+v; want 3 calls (o-before 1, o-after 2) and 2 charges", s)
			}
			calls, charges := ledgerRows(t, pgtest.Connect(t, dsn), "public")
			if calls != "o-after:2,o-before:1" || charges != "o-after,o-before" {
				t.Errorf("the ledger's tables hold calls %q, charges %q; want o-after:2,o-before:1 and o-after,o-before",
					calls, charges)
			}
			if n := pgtest.TempRows(t, pool, table); n != 0 {
				t.Errorf("the temporary tables hold %d rows; want none", n)
			}
		})
	}
}

// TestLedgerSearchPathChangedAfterNew: a ledger created in a schema whose
// name needs quoting, current at NewPayCo, is charged, counted and read
// there by connections made after the role's search_path moved to public,
// which holds another ledger. Before, the charge went to public's ledger.
func TestLedgerSearchPathChangedAfterNew(t *testing.T) {
	ctx := t.Context()
	const schema = `Pay "co"`
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	ledger(t, dsn) // public's
	var p *payments.PayCo
	pgtest.InSchema(t, admin, schema, func() *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if p, err = onPool(t, pool); err != nil {
			t.Fatal(err)
		}
		return pool
	})

	c := charge(t, p, "charge:o-1", "o-1")
	if got, err := p.Get(ctx, c.ID); err != nil || got != c {
		t.Errorf("Get = %+v, %v; want %+v", got, err, c)
	}
	if s, err := p.Stats(ctx); err != nil || s.Charges != 1 || s.Settled != 1 {
		t.Errorf("Stats = %+v, %v; want 1 call and 1 charge", s, err)
	}
	calls, charges := ledgerRows(t, admin, schema)
	pcalls, pcharges := ledgerRows(t, admin, "public")
	if calls != "o-1:1" || charges != "o-1" || pcalls != "" || pcharges != "" {
		t.Errorf("calls %q and charges %q in %q, %q and %q in public; want o-1 in %q alone",
			calls, charges, schema, pcalls, pcharges, schema)
	}
}

// TestNewPayCoNoSchema: a search_path that names no schema that exists
// leaves current_schema() null: NewPayCo returns ErrNoSchema naming the
// search_path, and creates nothing. Before, it failed with PostgreSQL's
// "no schema has been selected to create in".
func TestNewPayCoNoSchema(t *testing.T) {
	dsn := pgtest.DB(t)
	cfg, err := pgx.ParseConfig(dsn + "&search_path=nowhere")
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	if _, err := payments.NewPayCo(t.Context(), db); !errors.Is(err, payments.ErrNoSchema) ||
		!strings.Contains(err.Error(), `"nowhere"`) {
		t.Errorf("NewPayCo = %v; want ErrNoSchema naming the search_path", err)
	}
	if tables := pgtest.Tables(t, dsn); tables != "" {
		t.Errorf("tables %s after NewPayCo; want none", tables)
	}
}

// otherDriver is a database/sql driver that is neither SQLite's nor
// pgx's, and connects to nothing.
type otherDriver struct{}

func (otherDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("otherDriver: no database")
}

// TestNewPayCoOtherDriver: NewPayCo refuses a database/sql handle of
// another driver with ErrDriver naming it, before it runs a statement: it
// would not know the database's dialect, nor where its tables are. A nil
// handle is ErrDriver too. Before, the first was the driver's own error,
// and the second a panic.
func TestNewPayCoOtherDriver(t *testing.T) {
	db := sql.OpenDB(otherConnector{})
	defer db.Close()
	if _, err := payments.NewPayCo(context.Background(), db); !errors.Is(err, payments.ErrDriver) ||
		!strings.Contains(err.Error(), "otherDriver") {
		t.Errorf("NewPayCo = %v; want ErrDriver naming the driver", err)
	}
	if _, err := payments.NewPayCo(context.Background(), nil); !errors.Is(err, payments.ErrDriver) {
		t.Errorf("NewPayCo(nil) = %v; want ErrDriver", err)
	}
}

// otherConnector connects through otherDriver.
type otherConnector struct{}

func (otherConnector) Connect(context.Context) (driver.Conn, error) { return otherDriver{}.Open("") }
func (otherConnector) Driver() driver.Driver                        { return otherDriver{} }
