// Package pgmigrate brings a PostgreSQL schema up to date, once among the
// processes that open it together, and checks that a schema is whole: the
// schemas of pgstore and pgjar. It also checks the options those two
// share (Limits) and a caller's pool (CheckPool), and tells pgx's errors
// for a connection string it cannot parse (ParseError) and a connection
// that failed (Unreachable) without their noise.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/reconnect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Schema is a set of tables whose versions are recorded in a table of
// their own. Migrate creates them in current_schema(), the first schema of
// the search path that exists, as the connection it runs on reads it, and
// Migrate and Check look for them there alone: tables of the same names in
// another schema of the path are not the schema's. Both return that
// schema's name, which the statements that use the tables qualify them
// with (see Qualify): a connection whose search path is another, or a
// temporary table of the same name (pg_temp is searched first), would
// otherwise lead them to other tables. Migrate refuses, though, to create
// them where the search path leads past them (see elsewhere).
type Schema struct {
	// Lock is the key of the transaction-scoped advisory lock that
	// serialises migrations, so that processes starting together do not
	// race to create the tables.
	Lock int64
	// Table records each version applied.
	Table string
	// Migrations[i] brings the schema from version i to version i+1.
	// Versions are only ever appended: a released migration is never
	// edited. Each statement names the tables it creates or uses as
	// {schema}.name, and Migrate runs it through Qualify.
	Migrations [][]string
	// TooNew is returned, wrapped with the schema's name (in schema
	// "jobs") and its version, for a database at a later version than
	// len(Migrations).
	TooNew error
	// Older, when not nil, is returned by Check in place of its absent
	// error, wrapped as that one is, for a database at an earlier version
	// than len(Migrations): a schema that Migrate would upgrade, not one
	// that is missing.
	Older error
	// Objects are the tables and indexes (primary keys' included) that the
	// schema holds at version len(Migrations) and its statements use.
	Objects []string
	// Incomplete is returned, wrapped with the schema's name and the names
	// of those missing, for a database that records version
	// len(Migrations) without one of Objects: it was dropped, and nothing
	// re-creates it, since a dropped table took its rows with it and its
	// operator must know. It is returned too, wrapped with the schema's
	// name and the names of those found, for a database that records no
	// version (Table dropped or emptied) but holds one of Objects: what
	// remains is not a schema to create from scratch.
	Incomplete error
	// Indexes are the secondary indexes among Objects, each with the
	// statement that creates it ({schema}.name, as in Migrations). One
	// missing loses no row: when only such indexes are missing, Incomplete
	// wraps ErrIndexOnly too, and says how to create them again.
	Indexes map[string]string
	// NoSchema is returned, wrapped with the search path, when
	// current_schema() is null: no schema of the search path exists, and
	// there is nowhere to look for the tables or to create them.
	NoSchema error
	// Privilege is returned by Migrate, wrapped (see Denied), when the
	// role may not create or upgrade the schema: the creation of Table or
	// a migration failed with SQLSTATE 42501; when it may not take
	// Lock: EXECUTE on pg_advisory_xact_lock(bigint), which PUBLIC has by
	// default, was revoked from it; and when it could never write Writes:
	// its transactions are read-only, or it lacks one of SELECT, INSERT,
	// UPDATE and DELETE on Writes.
	Privilege error
	// Writes is the table of Objects that the package's statements write.
	Writes string
	// Timeout, when set, is returned by Migrate, wrapped with what it
	// was doing, that nothing was lost and what to do, when a statement
	// of the migration's transaction ran out of time before the commit
	// (see Timeouts). Nil leaves such an error as the server or the
	// context gave it.
	Timeout error
}

// Placeholder stands, in a statement, for the schema's name; Qualify
// replaces it.
const Placeholder = "{schema}"

// Qualify returns stmt with each Placeholder replaced by schema as a
// quoted identifier, so that {schema}.name names the table name of that
// schema whatever the schema's name holds (quotes, dots, spaces, upper
// case) and whatever the search path of the connection that runs stmt.
func Qualify(stmt, schema string) string {
	return strings.ReplaceAll(stmt, Placeholder, pgx.Identifier{schema}.Sanitize())
}

// Timeouts bound Migrate. The zero Timeouts leave each statement to ctx
// and to the session's statement_timeout.
type Timeouts struct {
	// Query bounds, on the client, the wait for a connection and the
	// transaction's start, and each statement that reads the schema or
	// records a version. Zero means ctx alone.
	Query time.Duration
	// Migration is the statement_timeout of the migration's transaction,
	// set with SET LOCAL whatever the session's: it bounds, on the
	// server, the wait for another process's migration (the lock), the
	// creation of the table of versions and each migration's statement,
	// such as an index built on a large table. The client waits for
	// those, and for the commit, twice as long. Zero means the session's
	// statement_timeout and ctx alone.
	Migration time.Duration
}

// Migrate brings the schema to len(s.Migrations) in one transaction, in
// current_schema() as the transaction's connection reads it, and returns
// that schema's name. A database that records no version but holds one of
// s.Objects is left as it is: Migrate returns s.Incomplete. A search path
// that names no schema that exists is s.NoSchema, and nothing is created;
// so is one that leads past the tables in another schema of it
// (s.Privilege or s.Incomplete, see elsewhere). When s.Timeout is set, a
// statement that ran out of time before the commit (the server's
// statement_timeout, SQLSTATE 57014, or a deadline of t or ctx) is
// s.Timeout, wrapped with what was being done and err (see timedOut).
//
// A statement the server refuses as a mix-up of pgx's prepared statements
// (see reconnect.MixedUp) ends the transaction, rolled back: Migrate then
// runs it all again at once, every statement in pgx's exec mode.
func (s Schema) Migrate(ctx context.Context, pool *pgxpool.Pool, t Timeouts) (schema string, err error) {
	schema, err = s.migrate(ctx, pool, t, false)
	if reconnect.MixedUp(err) {
		schema, err = s.migrate(ctx, pool, t, true)
	}
	return schema, err
}

// migrate is Migrate, its statements in pgx's exec mode when exec is true.
func (s Schema) migrate(ctx context.Context, pool *pgxpool.Pool, t Timeouts, exec bool) (schema string, err error) {
	within := func(d time.Duration) (context.Context, context.CancelFunc) {
		if d <= 0 {
			return context.WithCancel(ctx)
		}
		return context.WithTimeout(ctx, d)
	}
	quick := func() (context.Context, context.CancelFunc) { return within(t.Query) }
	// long runs stmt under twice t.Migration, and returns its error as
	// timedOut says, step saying what it did and from the version the
	// schema was at (-1 before it was read).
	long := func(tx pgx.Tx, step string, from int, stmt string, args ...any) error {
		lctx, cancel := within(2 * t.Migration)
		defer cancel()
		_, err := tx.Exec(lctx, stmt, args...)
		return s.timedOut(err, step, schema, from, t.Migration)
	}
	qctx, cancel := quick()
	defer cancel()
	conn, err := pool.Acquire(qctx)
	if err != nil {
		return "", err
	}
	defer conn.Release()
	// READ COMMITTED whatever the database's default: under REPEATABLE
	// READ or SERIALIZABLE the snapshot would be taken before the lock
	// wait, and a process that waited for another's migration would not
	// see it.
	tx, err := conn.BeginTx(qctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return "", err
	}
	if exec {
		tx = execTx{tx}
	}
	defer func() {
		if err != nil {
			// pgx closes the connection when this fails too, and the
			// server then ends the transaction.
			rctx, cancel := quick()
			defer cancel()
			tx.Rollback(rctx)
		}
	}()
	if t.Migration > 0 {
		ms := strconv.FormatInt(max(1, t.Migration.Milliseconds()), 10)
		if _, err := tx.Exec(qctx, `SELECT pg_catalog.set_config('statement_timeout', $1, true)`, ms); err != nil {
			return "", err
		}
	}
	// The wait for another's migration is bounded by the deadline,
	// not by a lock_timeout the database or the role may set to keep
	// DDL from queueing: under it, of instances starting together all
	// but one would fail. The DDL itself keeps that lock_timeout.
	if _, err := tx.Exec(qctx, `SET LOCAL lock_timeout = 0`); err != nil {
		return "", err
	}
	cancel()
	if err := long(tx, "waiting for the lock under which another process migrates it", -1,
		`SELECT pg_advisory_xact_lock($1)`, s.Lock); err != nil {
		return "", s.lockDenied(err)
	}
	rctx, cancel := quick()
	defer cancel()
	if _, err := tx.Exec(rctx, `SET LOCAL lock_timeout TO DEFAULT`); err != nil {
		return "", err
	}
	if schema, err = s.current(rctx, tx, pool); err != nil {
		return "", err
	}
	if err := s.readOnly(rctx, tx); err != nil {
		return "", err
	}
	table := pgx.Identifier{schema, s.Table}.Sanitize()
	// CREATE TABLE IF NOT EXISTS needs the CREATE privilege even when
	// the table exists: it only runs when the table is not in the
	// schema it would create it in, so that a role that may only read
	// and write the tables opens a schema that is current.
	v, exists, err := s.version(rctx, tx, schema)
	if err != nil {
		return "", err
	}
	if v == 0 {
		found, err := s.found(rctx, tx, schema)
		if err != nil {
			return "", err
		}
		if len(found) > 0 {
			return "", s.unrecorded(schema, exists, found)
		}
	}
	if !exists {
		m, err := s.elsewhere(rctx, tx, schema)
		if err != nil {
			return "", err
		}
		if m != nil {
			return "", fmt.Errorf("%w; nothing was created in %s", m, quote(schema))
		}
		cancel()
		if err := long(tx, "creating "+s.Table, -1, `CREATE TABLE IF NOT EXISTS `+table+` (
			version    integer     PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return "", Denied(err, s.Privilege, schema)
		}
	}
	cancel()
	if v > len(s.Migrations) {
		return "", s.tooNew(schema, v)
	}
	from := v
	for ; v < len(s.Migrations); v++ {
		for i, stmt := range s.Migrations[v] {
			stmt = Qualify(stmt, schema)
			step := fmt.Sprintf("migrating it to version %d, statement %d of %d (%s)", v+1, i+1, len(s.Migrations[v]), head(stmt))
			if err := long(tx, step, from, stmt); err != nil {
				if s.Timeout != nil && errors.Is(err, s.Timeout) {
					return "", err
				}
				if denied := Denied(err, s.Privilege, schema); denied != err {
					return "", denied
				}
				return "", fmt.Errorf("version %d: %w", v+1, err)
			}
		}
		qctx, cancel := quick()
		_, err := tx.Exec(qctx, `INSERT INTO `+table+` (version) VALUES ($1)`, v+1)
		cancel()
		if err != nil {
			return "", err
		}
	}
	cctx, cancel := quick()
	defer cancel()
	if err := s.whole(cctx, tx, schema); err != nil {
		return "", err
	}
	if err := s.writable(cctx, tx, schema); err != nil {
		return "", err
	}
	// Under twice t.Migration: the commit of a large migration writes
	// its WAL. An error here leaves the outcome unknown, and is returned
	// as it is.
	cancel()
	lctx, cancel := within(2 * t.Migration)
	defer cancel()
	if err := tx.Commit(lctx); err != nil {
		return "", err
	}
	return schema, nil
}

// head returns the first line of stmt up to its first parenthesis,
// trimmed: what it creates or alters, and where.
func head(stmt string) string {
	stmt, _, _ = strings.Cut(stmt, "\n")
	stmt, _, _ = strings.Cut(stmt, "(")
	return strings.TrimSpace(stmt)
}

// timedOut returns err, when s.Timeout is set and err says that the
// migration's statement of step ran out of time (the server canceled it,
// SQLSTATE 57014, as statement_timeout does, or a deadline passed), as
// s.Timeout wrapped with step, the schema and the version it was at
// (from, or -1 before it was read), that the transaction rolled back,
// what to do, and err; otherwise err itself. Nothing was committed: the
// commit is the transaction's last statement.
func (s Schema) timedOut(err error, step, schema string, from int, migration time.Duration) error {
	var pgErr *pgconn.PgError
	if s.Timeout == nil ||
		!errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &pgErr) && pgErr.Code == "57014") {
		return err
	}
	where := ""
	if schema != "" {
		where = " in schema " + quote(schema)
	}
	as := "as it was"
	if from >= 0 {
		as = fmt.Sprintf("at version %d as it was", from)
	}
	within := ""
	if migration > 0 {
		within = " (" + migration.String() + " now)"
	}
	return fmt.Errorf("%w%s while %s; its transaction rolled back, so nothing was lost, and the schema is %s; "+
		"open it again, with a longer MigrationTimeout%s if the table is large or another transaction holds a lock on it: %w",
		s.Timeout, where, step, as, within, err)
}

// Denied returns privilege, wrapped with schema, what to do and err, when
// err is the server's refusal of a statement that creates tables in schema
// for want of a privilege (SQLSTATE 42501, insufficient_privilege: CREATE
// on the schema, or the ownership of a table to alter), and err otherwise.
func Denied(err, privilege error, schema string) error {
	if !Insufficient(err) {
		return err
	}
	return fmt.Errorf("%w in schema %s; open it once as a role that may, such as the schema's owner: %w",
		privilege, quote(schema), err)
}

// lockDenied returns s.Privilege, wrapped with the function, what to do
// and err, when err is the server's refusal to let the role take s.Lock
// (SQLSTATE 42501: EXECUTE on pg_advisory_xact_lock revoked from PUBLIC),
// and err otherwise. Migrate takes the lock whether or not the schema is
// current, so the role needs it on every Open.
func (s Schema) lockDenied(err error) error {
	if !Insufficient(err) {
		return err
	}
	return fmt.Errorf("%w: it may not execute pg_catalog.pg_advisory_xact_lock(bigint), the lock under which "+
		"the processes that open the database together migrate it once; GRANT EXECUTE ON FUNCTION "+
		"pg_catalog.pg_advisory_xact_lock(bigint) to the role: %w", s.Privilege, err)
}

// readOnly returns s.Privilege, saying what to do, when the transaction
// q runs in is read-only, as each of the connection's would be: a hot
// standby, or default_transaction_read_only set for the role, the
// database or in the DSN. Such a connection opens a current schema, and
// every statement that writes it then fails.
func (s Schema) readOnly(ctx context.Context, q querier) error {
	return ReadOnly(q.QueryRow(ctx, ReadOnlyQuery).Scan, s.Privilege)
}

// ReadOnlyQuery reads whether the transaction is read-only, for ReadOnly.
const ReadOnlyQuery = `SELECT pg_catalog.current_setting('transaction_read_only')`

// ReadOnly returns privilege, saying what to do, when scan, the Scan
// method of ReadOnlyQuery's row (pgx's or database/sql's), reads that the
// transaction it ran in is read-only.
func ReadOnly(scan func(dest ...any) error, privilege error) error {
	var ro string
	if err := scan(&ro); err != nil {
		return err
	}
	if ro != "off" {
		return fmt.Errorf("%w: its transactions are read-only (a hot standby, or default_transaction_read_only "+
			"set for the role, the database or in the DSN); connect to the primary, with transactions that may write", privilege)
	}
	return nil
}

// writable returns s.Privilege, naming what to grant, unless the role may
// select, insert, update and delete in s.Writes (in schema), which a role
// that may use the tables is granted on them rather than create them.
func (s Schema) writable(ctx context.Context, q querier, schema string) error {
	if s.Writes == "" {
		return nil
	}
	return Grants(func(query string, args ...any) func(dest ...any) error { return q.QueryRow(ctx, query, args...).Scan },
		s.Privilege, schema, s.Writes, "SELECT", "INSERT", "UPDATE", "DELETE")
}

// grantsQuery reads which of the privileges $2 (comma-separated) the
// role lacks on the table $1, in their order, comma-separated: "" for
// none.
const grantsQuery = `SELECT coalesce(string_agg(p, ', ' ORDER BY n), '')
	FROM unnest(pg_catalog.string_to_array($2, ',')) WITH ORDINALITY AS o(p, n)
	WHERE NOT CASE p WHEN 'DELETE' THEN pg_catalog.has_table_privilege($1, p)
		ELSE pg_catalog.has_any_column_privilege($1, p) END`

// Grants returns privilege, naming what the role lacks and what to grant,
// unless it has each of privileges (SELECT, INSERT, UPDATE or DELETE) on
// table in schema. A grant on some of the table's columns counts as one
// on the table. query runs a statement that returns one row and returns
// the row's Scan method: pgx's QueryRow or database/sql's QueryRowContext,
// on the connection or transaction whose role is checked.
func Grants(query func(stmt string, args ...any) func(dest ...any) error, privilege error, schema, table string, privileges ...string) error {
	name := pgx.Identifier{schema, table}.Sanitize()
	var missing string
	if err := query(grantsQuery, name, strings.Join(privileges, ","))(&missing); err != nil {
		return err
	}
	if missing != "" {
		return fmt.Errorf("%w: it may not %s on %s; GRANT %s ON %s to the role",
			privilege, missing, name, strings.Join(privileges, ", "), name)
	}
	return nil
}

// Insufficient reports whether err is the server's SQLSTATE 42501,
// insufficient_privilege.
func Insufficient(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Check checks, creating nothing, that the database holds the schema at
// version len(s.Migrations), whole, in current_schema() as one connection
// of pool reads it, and returns that schema's name. It returns absent,
// wrapped with the schema's name (in schema "jobs") and what is missing in
// parentheses, for a database without the
// table of versions or at an earlier version (s.Older for that one, when
// set; when the search path leads past the tables in another schema of
// it, as elsewhere finds, the error matches elsewhere's sentinel too,
// s.Privilege or s.Incomplete, and elsewhere's reason, which names both
// schemas, and what to do follow absent instead), s.TooNew for a later one,
// s.Incomplete for one missing one of s.Objects, or recording no version
// but holding one, and s.NoSchema for a search path that names no schema
// that exists.
func (s Schema) Check(ctx context.Context, pool *pgxpool.Pool, absent error) (schema string, err error) {
	err = onPool(pool, func(q poolQuerier) error {
		schema, err = s.check(ctx, q, pool, absent)
		return err
	})
	return schema, err
}

// check is Check, its statements run on q.
func (s Schema) check(ctx context.Context, q poolQuerier, pool *pgxpool.Pool, absent error) (string, error) {
	schema, err := s.current(ctx, q, pool)
	if err != nil {
		return "", err
	}
	// Looked for before the version: a migration commits the objects and
	// the version together, so objects found here and no version read
	// after are a version lost, not a migration that committed between.
	found, err := s.found(ctx, q, schema)
	if err != nil {
		return "", err
	}
	v, versions, err := s.version(ctx, q, schema)
	if err != nil {
		return "", err
	}
	switch {
	case v == 0 && len(found) > 0:
		return "", s.unrecorded(schema, versions, found)
	case !versions:
		m, err := s.elsewhere(ctx, q, schema)
		if err != nil {
			return "", err
		}
		if m != nil {
			return "", &absentMisplaced{msg: fmt.Sprintf("%v: %s", absent, m.why), errs: []error{absent, m.sentinel}}
		}
		return "", fmt.Errorf("%w in schema %s (no table %s)", absent, quote(schema), s.Table)
	case v > len(s.Migrations):
		return "", s.tooNew(schema, v)
	case v < len(s.Migrations):
		if s.Older != nil {
			absent = s.Older
		}
		return "", fmt.Errorf("%w in schema %s (%s records version %d, not %d)", absent, quote(schema), s.Table, v,
			len(s.Migrations))
	}
	if err := s.whole(ctx, q, schema); err != nil {
		return "", err
	}
	return schema, nil
}

// current returns current_schema(), the schema that the migrations create
// their tables in, or s.NoSchema when it is null. When pool's config sets
// a search_path (the DSN's search_path=…) that the session on q does not
// run with, it returns s.Incomplete instead (see Kept).
func (s Schema) current(ctx context.Context, q querier, pool *pgxpool.Pool) (string, error) {
	return Current(func(dest ...any) error {
		if err := q.QueryRow(ctx, CurrentQuery).Scan(dest...); err != nil {
			return err
		}
		return Kept(pool.Config().ConnConfig.RuntimeParams, *dest[1].(*string), s.Incomplete)
	}, s.NoSchema)
}

// literal returns v as an SQL string literal.
func literal(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }

// Kept returns nil unless params, the RuntimeParams of a pool's config,
// set a search_path other than path, the one its session runs with: a
// pooler between them dropped the connection string's, as PgBouncer drops
// a startup parameter that its ignore_startup_parameters lists, and the
// session runs with the role's or the database's. The tables would then
// be looked for, and created, in another schema than the one the
// connection string names, leaving those there, and their keys, behind.
// The error wraps incomplete and ErrPathDropped, with both search_paths
// and what to do.
func Kept(params map[string]string, path string, incomplete error) error {
	want, set := params["search_path"]
	if !set || want == path {
		return nil
	}
	if w, ok := splitPath(want); ok {
		if p, ok := splitPath(path); ok && slices.Equal(w, p) {
			return nil
		}
	}
	return &absentMisplaced{msg: fmt.Sprintf("%v: the connection string sets search_path %s, but the session runs with search_path %s: "+
		"a pooler between them dropped it (as PgBouncer drops the startup parameters its ignore_startup_parameters lists), "+
		"and the tables would be looked for in another schema; set it on the role instead "+
		"(ALTER ROLE … IN DATABASE … SET search_path = …), or connect to the server directly", incomplete, literal(want), literal(path)),
		errs: []error{incomplete, ErrPathDropped}}
}

// ErrPathDropped is wrapped, with a Schema's Incomplete, in Kept's error:
// nothing is wrong with the tables, which are elsewhere.
var ErrPathDropped = errors.New("the session does not run with the connection string's search_path")

// CurrentQuery reads current_schema() and the search_path, for Current.
const CurrentQuery = `SELECT pg_catalog.current_schema(), pg_catalog.current_setting('search_path')`

// Current returns the schema that scan, the Scan method of CurrentQuery's
// row (pgx's or database/sql's), reads: current_schema(), the first schema
// of the search_path that exists and that the role may use (USAGE). When
// there is none, it returns noSchema,
// wrapped with the search_path and, after "; ", what to do.
func Current(scan func(dest ...any) error, noSchema error) (string, error) {
	var (
		schema *string
		path   string
	)
	if err := scan(&schema, &path); err != nil {
		return "", err
	}
	if schema == nil {
		return "", fmt.Errorf("%w: search_path %q names no schema that exists, or none that this role may use; create one it names (CREATE SCHEMA), or GRANT USAGE on the schema that holds the tables to the role, or set search_path=… in the connection string to a schema that exists", noSchema, path)
	}
	return *schema, nil
}

// version returns the version that s.Table records, and whether schema
// holds s.Table: 0 when it does not, whatever another schema of the search
// path holds.
func (s Schema) version(ctx context.Context, q querier, schema string) (v int, exists bool, err error) {
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_tables
		WHERE schemaname = $2 AND tablename = $1)`, s.Table, schema).Scan(&exists); err != nil || !exists {
		return 0, false, err
	}
	table := pgx.Identifier{schema, s.Table}.Sanitize()
	err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&v)
	if Insufficient(err) {
		// A role granted the tables it writes but not this one: it is
		// read on every Open, current schema or not.
		return 0, true, fmt.Errorf("%w: it may not SELECT on %s, which records the schema's version; GRANT SELECT ON %s to the role: %w",
			s.Privilege, table, table, err)
	}
	return v, true, err
}

// elsewhereQuery reads, for each schema of the search path $1 (its
// entries, in order; "$user" for the role's own) that exists, its name,
// whether it is the role's own through "$user", whether the role may use
// it and whether it holds one of the relations $2.
const elsewhereQuery = `SELECT ns.nspname, p.name = '$user', pg_catalog.has_schema_privilege(ns.oid, 'USAGE'),
		EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.relnamespace = ns.oid AND c.relname = ANY($2))
	FROM unnest($1::text[]) WITH ORDINALITY AS p(name, n)
	JOIN pg_catalog.pg_namespace ns
		ON ns.nspname = CASE p.name WHEN '$user' THEN current_user ELSE p.name END
	ORDER BY p.n`

// elsewhere is called before Migrate creates the tables from scratch in
// schema, current_schema(), which holds none of them, and by Check when
// schema lacks the table of versions. It returns why, with a sentinel,
// when the search path leads there past the tables, which hold what was
// written before and would be left for an empty schema: s.Privilege when
// a schema of the path before schema holds them and the role may not use
// it (current_schema() skips a schema without USAGE), and s.Incomplete
// when schema is the role's own, reached through "$user", and a schema
// after it holds them (a schema named after the role was created since
// the tables were, under the default search path "$user", public). A
// search path that names schema before the tables' schema chooses it: the
// tables are created there. pg_namespace and pg_class are read whatever
// the role may use. It returns nil, nil when the search path leads to
// the tables or to none.
func (s Schema) elsewhere(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (*misplaced, error) {
	var path string
	if err := q.QueryRow(ctx, `SELECT pg_catalog.current_setting('search_path')`).Scan(&path); err != nil {
		return nil, err
	}
	entries, ok := splitPath(path)
	if !ok {
		return nil, nil
	}
	rows, err := q.Query(ctx, elsewhereQuery, entries, append([]string{s.Table}, s.Objects...))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type entry struct {
		name              string
		user, usage, hold bool
	}
	var list []entry
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.name, &e.user, &e.usage, &e.hold); err != nil {
			return nil, err
		}
		list = append(list, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	at := slices.IndexFunc(list, func(e entry) bool { return e.name == schema })
	if at < 0 {
		return nil, nil
	}
	for i, e := range list {
		if !e.hold || e.name == schema {
			continue
		}
		switch {
		case i < at && !e.usage:
			return &misplaced{s.Privilege, fmt.Sprintf("schema %s of the search_path (%s) holds the tables, "+
				"but the role may not use it, so current_schema() is %s, which holds none; GRANT USAGE ON SCHEMA %s to the role",
				quote(e.name), path, quote(schema), quote(e.name))}, nil
		case i > at && list[at].user:
			do := "set search_path to " + quote(e.name) + " (in the DSN or for the role)"
			if !e.usage {
				do += ", and GRANT USAGE ON SCHEMA " + quote(e.name) + " to the role"
			}
			return &misplaced{s.Incomplete, fmt.Sprintf("in schema %s, the role's own, which \"$user\" of the search_path (%s) "+
				"names first, no %s, but schema %s holds the tables; %s", quote(schema), path, s.Table, quote(e.name), do)}, nil
		}
	}
	return nil, nil
}

// misplaced is elsewhere's error: sentinel (s.Privilege or s.Incomplete),
// and why the search path leads past the tables and what to do.
type misplaced struct {
	sentinel error
	why      string
}

func (m *misplaced) Error() string { return m.sentinel.Error() + ": " + m.why }
func (m *misplaced) Unwrap() error { return m.sentinel }

// absentMisplaced is Check's error for a schema without the table of
// versions where elsewhere found the tables past it: absent, followed by
// elsewhere's reason, wrapping both absent and elsewhere's sentinel.
type absentMisplaced struct {
	msg  string
	errs []error
}

func (e *absentMisplaced) Error() string   { return e.msg }
func (e *absentMisplaced) Unwrap() []error { return e.errs }

// splitPath returns the entries of a search_path setting as PostgreSQL
// reads them: comma-separated identifiers, in double quotes or folded to
// lower case, each cut to maxIdentifier bytes, with space, tab, newline,
// carriage return and form feed around them (its scanner_isspace: not a
// vertical tab, which is part of a name). It returns false for a
// setting PostgreSQL refuses. An empty entry in double quotes ("") is
// one, which names no schema.
func splitPath(path string) ([]string, bool) {
	var entries []string
	for rest := strings.TrimLeft(path, " \t\n\r\f"); rest != ""; {
		var name string
		if rest[0] == '"' {
			var b strings.Builder
			i := 1
			for ; ; i++ {
				if i >= len(rest) {
					return nil, false
				}
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					break
				}
				b.WriteByte(rest[i])
			}
			name, rest = b.String(), rest[i+1:]
		} else {
			i := strings.IndexAny(rest, ", \t\n\r\f")
			if i < 0 {
				i = len(rest)
			}
			if i == 0 {
				return nil, false // an empty entry: "a,,b", "a,"
			}
			name, rest = strings.Map(lowerASCII, rest[:i]), rest[i:]
		}
		entries = append(entries, truncate(name))
		rest = strings.TrimLeft(rest, " \t\n\r\f")
		if rest == "" {
			break
		}
		if rest[0] != ',' {
			return nil, false
		}
		rest = strings.TrimLeft(rest[1:], " \t\n\r\f")
		if rest == "" {
			return nil, false
		}
	}
	return entries, true
}

// maxIdentifier is the longest identifier, in bytes, that PostgreSQL
// keeps (NAMEDATALEN-1, as it is built by default): it cuts a longer one,
// in a search_path as in a CREATE SCHEMA.
const maxIdentifier = 63

// truncate cuts name to maxIdentifier bytes, at the start of a character,
// as PostgreSQL's truncate_identifier does in a UTF-8 database.
func truncate(name string) string {
	if len(name) <= maxIdentifier {
		return name
	}
	n := maxIdentifier
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// lowerASCII folds r to lower case as PostgreSQL folds an unquoted
// identifier in UTF-8: ASCII letters alone.
func lowerASCII(r rune) rune {
	if 'A' <= r && r <= 'Z' {
		return r + 'a' - 'A'
	}
	return r
}

// querier is a pool, a connection or a transaction.
type querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// found returns those of s.Objects that schema holds. It reads pg_class
// with the statement's snapshot.
func (s Schema) found(ctx context.Context, q querier, schema string) ([]string, error) {
	var found []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY n), '{}')
		FROM unnest($1::text[]) WITH ORDINALITY AS o(name, n)
		WHERE EXISTS (SELECT FROM pg_catalog.pg_class c
			JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
			WHERE ns.nspname = $2 AND c.relname = o.name)`,
		s.Objects, schema).Scan(&found)
	return found, err
}

// quote returns schema as a quoted identifier: in double quotes, each
// double quote in it doubled, as PostgreSQL reads it in a search_path. The
// errors that say what a schema lacks or holds name it so: an operator
// whose search path led elsewhere than expected sees where they looked.
func quote(schema string) string {
	return pgx.Identifier{schema}.Sanitize()
}

// tooNew returns s.TooNew for schema, which records version v.
func (s Schema) tooNew(schema string, v int) error {
	return fmt.Errorf("%w: in schema %s, version %d, this package knows up to %d", s.TooNew, quote(schema), v,
		len(s.Migrations))
}

// unrecorded returns s.Incomplete for a schema that records no version
// (versions: it has the table of versions, empty) but holds found.
func (s Schema) unrecorded(schema string, versions bool, found []string) error {
	what := "no " + s.Table
	if versions {
		what = s.Table + " records no version"
	}
	return fmt.Errorf("%w: in schema %s, %s, but the database holds %s", s.Incomplete, quote(schema), what,
		strings.Join(found, ", "))
}

// whole returns s.Incomplete, wrapped with the names of those missing,
// unless schema holds each of s.Objects.
func (s Schema) whole(ctx context.Context, q querier, schema string) error {
	found, err := s.found(ctx, q, schema)
	if err != nil {
		return err
	}
	missing := slices.DeleteFunc(slices.Clone(s.Objects), func(o string) bool { return slices.Contains(found, o) })
	if len(missing) == 0 {
		return nil
	}
	var create []string
	for _, o := range missing {
		if stmt, ok := s.Indexes[o]; ok {
			create = append(create, Qualify(stmt, schema))
		}
	}
	if len(create) == len(missing) {
		// An index dropped took no row with it: a restore from a backup
		// would lose what was written since.
		return fmt.Errorf("%w: in schema %s, no %s (%w: create it again, as the owner: %s)", s.Incomplete, quote(schema),
			strings.Join(missing, ", "), ErrIndexOnly, strings.Join(create, "; "))
	}
	return fmt.Errorf("%w: in schema %s, no %s", s.Incomplete, quote(schema), strings.Join(missing, ", "))
}

// ErrIndexOnly is wrapped, with a Schema's Incomplete, in the error for a
// schema that lacks only some of its Indexes.
var ErrIndexOnly = errors.New("only an index is missing, no row is lost")

// Opened checks, on one connection of pool, the settings that pgjar's and
// pgstore's Open set as startup parameters and rely on, which a pooler
// between them and the server may have dropped (PgBouncer drops those its
// ignore_startup_parameters lists, and the session then runs with the
// role's or the database's): default_transaction_isolation must be read
// committed, and synchronous_commit on (or remote_apply) unless chosen,
// the connection string's own choice. It returns errPool, wrapped with the
// setting and what to do, when either is not.
func Opened(ctx context.Context, pool *pgxpool.Pool, chosen bool, errPool error) error {
	var isolation, commit string
	if err := onPool(pool, func(q poolQuerier) error {
		return q.QueryRow(ctx, `SELECT pg_catalog.current_setting('default_transaction_isolation'),
			pg_catalog.current_setting('synchronous_commit')`).Scan(&isolation, &commit)
	}); err != nil {
		return OneLine(err)
	}
	const dropped = "not what Open sets as a startup parameter: a pooler between it and the server dropped it " +
		"(as PgBouncer drops those its ignore_startup_parameters lists); set it on the role (ALTER ROLE … IN DATABASE … SET %s = %s)"
	switch {
	case isolation != "read committed":
		return fmt.Errorf("%w: default_transaction_isolation is %q, "+dropped, errPool, isolation, "default_transaction_isolation", "'read committed'")
	case !chosen && commit != "on" && commit != "remote_apply":
		return fmt.Errorf("%w: synchronous_commit is %q, "+dropped, errPool, commit, "synchronous_commit", "on")
	}
	return nil
}

// CheckPool checks, on one connection of a caller's pool, that it runs
// READ COMMITTED by default and synchronous_commit on (or remote_apply),
// unless the pool's config sets synchronous_commit: the operator's choice,
// which it returns ("" when the config sets none). A pool that does not is
// refused with errPool, wrapped with the setting to change.
func CheckPool(ctx context.Context, pool *pgxpool.Pool, errPool error) (commit string, err error) {
	if pool == nil {
		return "", fmt.Errorf("%w: nil pool", errPool)
	}
	var isolation string
	if err := onPool(pool, func(q poolQuerier) error {
		return q.QueryRow(ctx, `SELECT current_setting('default_transaction_isolation'),
			current_setting('synchronous_commit')`).Scan(&isolation, &commit)
	}); err != nil {
		return "", err
	}
	if isolation != "read committed" {
		return "", fmt.Errorf("%w: default_transaction_isolation is %q; set it to read committed in the pool's RuntimeParams",
			errPool, isolation)
	}
	if v, set := pool.Config().ConnConfig.RuntimeParams["synchronous_commit"]; set {
		return v, nil
	}
	if commit != "on" && commit != "remote_apply" {
		return "", fmt.Errorf("%w: synchronous_commit is %q and the pool's RuntimeParams do not choose it; set it there (on: a write is on stable storage when it returns)",
			errPool, commit)
	}
	return "", nil
}

// poolQuerier is a pool, or a pool whose statements run in pgx's exec
// mode (execPool).
type poolQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// onPool runs f on pool and, when the server refused a statement of f as
// a mix-up of pgx's prepared statements (see reconnect.MixedUp), which it
// did before running it, runs f again at once with pool's statements in
// pgx's exec mode, which prepares none by name.
func onPool(pool *pgxpool.Pool, f func(q poolQuerier) error) error {
	err := f(pool)
	if reconnect.MixedUp(err) {
		err = f(execPool{pool})
	}
	return err
}

// execPool is a pool whose statements run in pgx's exec mode.
type execPool struct{ pool *pgxpool.Pool }

func (p execPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return p.pool.Query(ctx, sql, reconnect.ExecArgs(args...)...)
}

func (p execPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return p.pool.QueryRow(ctx, sql, reconnect.ExecArgs(args...)...)
}

// execTx is a transaction whose statements run in pgx's exec mode.
type execTx struct{ pgx.Tx }

func (t execTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, sql, reconnect.ExecArgs(args...)...)
}

func (t execTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, sql, reconnect.ExecArgs(args...)...)
}

func (t execTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, sql, reconnect.ExecArgs(args...)...)
}
