package payments

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/pgtext"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

// Charge is a charge as PayCo made it and the API returns it.
type Charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"` // in the currency's minor unit
	Currency string `json:"currency"`
	OrderID  string `json:"order_id"`
}

// Stats are PayCo's counts. Charges, DoubleCharged and PerOrder count the
// charge calls PayCo received, before its own dedup: they show every time
// the server ran a charge, so a broken idempotency store shows up even
// though PayCo's dedup keeps the money right. Settled and
// SettledDoubleCharged count the charges PayCo actually made.
type Stats struct {
	Charges              int            `json:"charges"`                // charge calls received
	DoubleCharged        int            `json:"double_charged"`         // orders charged (called) more than once
	PerOrder             map[string]int `json:"per_order"`              // charge calls per order
	Settled              int            `json:"settled"`                // charges made, after dedup
	SettledDoubleCharged int            `json:"settled_double_charged"` // orders with more than one charge made
}

// ErrNoCharge is returned by PayCo.Get for an unknown charge id.
var ErrNoCharge = errors.New("payments: no such charge")

// ErrKeyReused is returned (wrapped) by PayCo.Charge when its key already
// charged an order with another amount or currency.
var ErrKeyReused = errors.New("payments: PayCo key already used with other parameters")

// ErrNoSchema is returned by NewPayCo, followed by the search_path, when
// current_schema() is null on PostgreSQL: no schema of the search_path
// exists, so there is none to find the ledger's tables in or to create
// them in. Nothing is created.
var ErrNoSchema = errors.New("payments: no schema to hold the PayCo ledger")

// ErrPrivilege is returned by NewPayCo on PostgreSQL when the ledger's
// tables are missing and the role it connects as may not create them
// (SQLSTATE 42501, insufficient_privilege). The schema, what to do and
// the server's error (a *pgconn.PgError) follow it. Create the ledger
// once as a role that may create tables in that schema, such as its owner
// (by starting idemserver once as that role). Nothing is created. It is
// returned too, naming the table and what to grant, when the tables exist
// and the role lacks a privilege that every charge needs (see NewPayCo),
// and, saying so, when the connection's transactions are read-only.
var ErrPrivilege = errors.New("payments: this role may not create or write the PayCo ledger")

// ErrDriver is returned by NewPayCo, followed by the driver's type, for a
// database/sql handle of a driver other than SQLite's (modernc.org/sqlite)
// and PostgreSQL's (github.com/jackc/pgx/v5/stdlib): NewPayCo would know
// neither its dialect nor where its tables are. Nothing is run.
var ErrDriver = errors.New("payments: the PayCo ledger needs modernc.org/sqlite or github.com/jackc/pgx/v5/stdlib")

// PayCo is the downstream payment processor of the reference server: a
// ledger in a SQL database that dedups charges on the caller's key. It
// keeps its tables (payco_calls, payco_charges) beside the server's keys,
// so several server processes on one database share one ledger, and a
// restart keeps the counts. It is safe for concurrent use.
type PayCo struct {
	// NoDedup makes PayCo charge on every call, ignoring the key: the
	// ablation that shows what the downstream key prevents. False (the
	// default) dedups.
	NoDedup bool

	db  *sql.DB
	sql statements
	pg  bool // on PostgreSQL (see holds and Stats)
}

// paycoSchema creates the ledger's tables. Its statements, as PayCo's,
// name the tables {schema}.name: on PostgreSQL, the schema NewPayCo found
// (see pgmigrate.Qualify); on SQLite, none.
//
// The ids that the ledger's unique and ordinary indexes hold (a charge's
// id, its dedup key, the order's id) are {bytewise}: on PostgreSQL, in
// the "C" collation, which compares bytes, rather than the database's
// default, often a libc collation whose order changes when the operating
// system's C library does (glibc 2.28 moved hyphens and spaces, and the
// dedup keys and order ids are the clients', "charge:<uuid>"): an index
// built in the old order misses rows it holds, and PayCo would charge a
// key it had charged. On SQLite, nothing: its default collation, BINARY,
// compares bytes already.
//
// The ledger records no version of its schema, and NewPayCo alters no
// table: a ledger created before its ids were "C" is used as it is, its
// ids in the default collation and its indexes in that collation's order,
// which serve until the order changes under them. Its owner converts it
// with ALTER TABLE payco_calls ALTER COLUMN order_id TYPE text COLLATE "C"
// and ALTER TABLE payco_charges ALTER COLUMN id TYPE text COLLATE "C",
// ALTER COLUMN dedup_key TYPE text COLLATE "C", ALTER COLUMN order_id TYPE
// text COLLATE "C", which rebuild the indexes, or drops the ledger, which
// holds only the reference server's demonstration charges and counts.
const paycoSchema = `
CREATE TABLE IF NOT EXISTS {schema}.payco_calls (
	order_id TEXT {bytewise} PRIMARY KEY,
	calls    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS {schema}.payco_charges (
	id        TEXT {bytewise} PRIMARY KEY,
	dedup_key TEXT {bytewise} UNIQUE, -- NULL when charged without dedup
	order_id  TEXT {bytewise} NOT NULL,
	amount    BIGINT NOT NULL, -- PostgreSQL's INTEGER has 32 bits
	currency  TEXT NOT NULL,
	created   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS payco_charges_order ON {schema}.payco_charges (order_id);
`

// ledgerSchema returns paycoSchema for PostgreSQL (pg) or SQLite, its ids
// collated bytewise, its tables still named {schema}.name.
func ledgerSchema(pg bool) string {
	collate := ""
	if pg {
		collate = `COLLATE "C"`
	}
	return strings.ReplaceAll(paycoSchema, "{bytewise}", collate)
}

// paycoObjects are the relations paycoSchema creates.
var paycoObjects = []string{"payco_calls", "payco_charges", "payco_charges_order"}

// paycoWrites are the privileges that PayCo's statements need on its
// tables: a charge counts its call with an upsert, and inserts its charge.
var paycoWrites = []struct {
	table      string
	privileges []string
}{
	{"payco_calls", []string{"SELECT", "INSERT", "UPDATE"}},
	{"payco_charges", []string{"SELECT", "INSERT"}},
}

// NewPayCo creates PayCo's tables in db if they are missing. db is SQLite
// through modernc.org/sqlite (sqlitestore's DB) or PostgreSQL through
// github.com/jackc/pgx/v5/stdlib; another driver, or a nil db, is
// ErrDriver. The SQL is the same on both, but for the collation of the
// ids (see paycoSchema). On PostgreSQL, tables that exist are only used,
// never altered: a role that may not create tables opens them with
// SELECT, INSERT and UPDATE on payco_calls and SELECT and INSERT on
// payco_charges, and a role without one of those is refused with
// ErrPrivilege, saying what to grant, where every charge would fail; so is
// a connection whose transactions are read-only (a hot standby, or
// default_transaction_read_only), saying so.
//
// On PostgreSQL, NewPayCo finds the tables, or creates them, in
// current_schema() of the connection it runs on: the first schema of its
// search_path that exists (search_path=… in the DSN for a schema of their
// own; one that names no schema that exists is ErrNoSchema). Every
// statement then names the tables with that schema, as a quoted
// identifier, so that the ledger stays there whatever the search_path of
// db's later connections and a temporary table of the same name (pg_temp
// is searched first) neither hides its rows nor receives them. Processes
// that may start together must not call it at the same time: a CREATE
// TABLE IF NOT EXISTS that races another fails. idemserver serialises them
// with an advisory lock.
func NewPayCo(ctx context.Context, db *sql.DB) (*PayCo, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrDriver)
	}
	var (
		q   func(string) string
		pg  bool
		err error
	)
	switch d := db.Driver().(type) {
	case *sqlite.Driver:
		q = func(stmt string) string { return strings.ReplaceAll(stmt, pgmigrate.Placeholder+".", "") }
		_, err = db.ExecContext(ctx, q(ledgerSchema(false)))
	case *stdlib.Driver:
		pg = true
		var schema string
		schema, err = createIn(ctx, db)
		q = func(stmt string) string { return pgmigrate.Qualify(stmt, schema) }
	default:
		return nil, fmt.Errorf("%w: %T", ErrDriver, d)
	}
	switch {
	case errors.Is(err, ErrNoSchema), errors.Is(err, ErrPrivilege):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("payments: creating the PayCo ledger: %w", err)
	}
	return &PayCo{db: db, sql: newStatements(q), pg: pg}, nil
}

// createIn creates PayCo's tables on PostgreSQL, if they are missing, in
// current_schema() as the transaction's connection reads it, and returns
// that schema's name, or ErrNoSchema when it is null. CREATE TABLE IF NOT
// EXISTS needs the CREATE privilege on the schema even when the table
// exists: it only runs when one of paycoObjects is not in the schema, so
// that a role that may only read and write the tables opens the ledger.
func createIn(ctx context.Context, db *sql.DB) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	schema, err := pgmigrate.Current(tx.QueryRowContext(ctx, pgmigrate.CurrentQuery).Scan, ErrNoSchema)
	if err != nil {
		return "", err
	}
	if err := pgmigrate.ReadOnly(tx.QueryRowContext(ctx, pgmigrate.ReadOnlyQuery).Scan, ErrPrivilege); err != nil {
		return "", err
	}
	var found int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
		WHERE ns.nspname = $1 AND c.relname = ANY($2)`, schema, paycoObjects).Scan(&found); err != nil {
		return "", err
	}
	if found < len(paycoObjects) {
		if _, err := tx.ExecContext(ctx, pgmigrate.Qualify(ledgerSchema(true), schema)); err != nil {
			return "", pgmigrate.Denied(err, ErrPrivilege, schema)
		}
	}
	query := func(stmt string, args ...any) func(dest ...any) error {
		return tx.QueryRowContext(ctx, stmt, args...).Scan
	}
	for _, w := range paycoWrites {
		if err := pgmigrate.Grants(query, ErrPrivilege, schema, w.table, w.privileges...); err != nil {
			return "", err
		}
	}
	return schema, tx.Commit()
}

// statements are PayCo's SQL, its tables named as NewPayCo found them: on
// PostgreSQL with their schema, since a statement that named them
// unqualified would find them through the search path of the connection
// it runs on, which may be another schema's, or a temporary table of the
// same name. They are built once per PayCo.
type statements struct {
	call, charge, byKey, byID, order, calls, charges string
}

// newStatements returns PayCo's statements, each passed through q, which
// names the tables.
func newStatements(q func(string) string) statements {
	return statements{
		call: q(`INSERT INTO {schema}.payco_calls (order_id, calls) VALUES ($1, 1)
			ON CONFLICT (order_id) DO UPDATE SET calls = payco_calls.calls + 1`),
		charge: q(`INSERT INTO {schema}.payco_charges (id, dedup_key, order_id, amount, currency, created)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (dedup_key) DO NOTHING`),
		byKey: q(`SELECT id, amount, currency, order_id FROM {schema}.payco_charges WHERE dedup_key = $1`),
		byID:  q(`SELECT id, amount, currency, order_id FROM {schema}.payco_charges WHERE id = $1`),
		order: q(`SELECT id, amount, currency, order_id FROM {schema}.payco_charges
			WHERE order_id = $1 ORDER BY created, id`),
		calls:   q(`SELECT order_id, calls FROM {schema}.payco_calls`),
		charges: q(`SELECT order_id, count(*) FROM {schema}.payco_charges GROUP BY order_id`),
	}
}

// Charge counts one call for the order, then charges it unless key already
// made a charge, in which case it returns that charge. With NoDedup every
// call charges.
func (p *PayCo) Charge(ctx context.Context, key, orderID string, amount int64, currency string) (Charge, error) {
	var id [12]byte
	rand.Read(id[:])
	c := Charge{ID: "ch_" + hex.EncodeToString(id[:]), Amount: amount, Currency: currency, OrderID: orderID}
	dedup := sql.NullString{String: key, Valid: !p.NoDedup}
	err := p.tx(ctx, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, p.sql.call, orderID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, p.sql.charge, c.ID, dedup, orderID, amount, currency, time.Now().UnixNano()); err != nil {
			return err
		}
		if p.NoDedup {
			return nil
		}
		made, err := scanCharge(tx.QueryRowContext(ctx, p.sql.byKey, key))
		if err != nil {
			return err
		}
		if made.Amount != amount || made.Currency != currency || made.OrderID != orderID {
			return fmt.Errorf("%w: key %q charged order %q %d %s", ErrKeyReused, key, made.OrderID, made.Amount, made.Currency)
		}
		c = made
		return nil
	})
	if err != nil {
		return Charge{}, err
	}
	return c, nil
}

// tx runs f in one transaction, begun with opts, and commits it when f
// returns nil.
func (p *PayCo) tx(ctx context.Context, opts *sql.TxOptions, f func(*sql.Tx) error) error {
	tx, err := p.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		if errors.Is(err, ErrKeyReused) {
			return err
		}
		return fmt.Errorf("payments: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	return nil
}

func scanCharge(row interface{ Scan(...any) error }) (Charge, error) {
	var c Charge
	err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.OrderID)
	return c, err
}

// Get returns the charge with the given id, or ErrNoCharge: also for an id
// that the database cannot hold (on PostgreSQL, one with a NUL byte or
// bytes that are not UTF-8), which names no charge.
func (p *PayCo) Get(ctx context.Context, id string) (Charge, error) {
	if !p.holds(id) {
		return Charge{}, ErrNoCharge
	}
	c, err := scanCharge(p.db.QueryRowContext(ctx, p.sql.byID, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Charge{}, ErrNoCharge
	case err != nil:
		return Charge{}, fmt.Errorf("payments: %w", err)
	}
	return c, nil
}

// Order returns the charges made for an order, oldest first; none is an
// empty slice, as for an order id that the database cannot hold (see Get).
func (p *PayCo) Order(ctx context.Context, orderID string) ([]Charge, error) {
	if !p.holds(orderID) {
		return []Charge{}, nil
	}
	rows, err := p.db.QueryContext(ctx, p.sql.order, orderID)
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	defer rows.Close()
	cs := []Charge{}
	for rows.Next() {
		c, err := scanCharge(rows)
		if err != nil {
			return nil, fmt.Errorf("payments: %w", err)
		}
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	return cs, nil
}

// holds reports whether the ledger's text columns can hold s. PostgreSQL's
// text refuses a NUL byte and bytes that are not UTF-8: a read of such an
// id would fail as if the ledger did, where it can only find nothing.
func (p *PayCo) holds(s string) bool {
	return !p.pg || pgtext.Holds(s)
}

// Stats returns the ledger's counts, as of one moment: its two queries
// read one snapshot (on SQLite, a transaction that holds the write lock;
// on PostgreSQL, a REPEATABLE READ one, where READ COMMITTED would give
// each query its own, and count a charge that committed between them
// among the charges made but not among the calls).
func (p *PayCo) Stats(ctx context.Context) (Stats, error) {
	s := Stats{PerOrder: map[string]int{}}
	var opts *sql.TxOptions
	if p.pg {
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	}
	err := p.tx(ctx, opts, func(tx *sql.Tx) error {
		if err := eachCount(ctx, tx, p.sql.calls, func(order string, n int) {
			s.PerOrder[order] = n
			s.Charges += n
			if n > 1 {
				s.DoubleCharged++
			}
		}); err != nil {
			return err
		}
		return eachCount(ctx, tx, p.sql.charges, func(_ string, n int) {
			s.Settled += n
			if n > 1 {
				s.SettledDoubleCharged++
			}
		})
	})
	return s, err
}

// eachCount calls f for each (order, count) row of query.
func eachCount(ctx context.Context, tx *sql.Tx, query string, f func(string, int)) error {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			order string
			n     int
		)
		if err := rows.Scan(&order, &n); err != nil {
			return err
		}
		f(order, n)
	}
	return rows.Err()
}
