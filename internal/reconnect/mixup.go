package reconnect

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MixedUp reports whether err is the server's refusal of a statement by the
// name pgx's statement cache gave it: SQLSTATE 42P05 (prepared statement
// "stmtcache_…" already exists) or 26000 (… does not exist). The server
// keeps prepared statements per session, and pgx caches which it prepared
// on each of its connections: a pooler in transaction mode (PgBouncer's
// pool_mode = transaction) hands one server session to many clients, and
// one client's transactions to many sessions, and the two disagree. The
// server refused the statement before running it: nothing of it, or of the
// implicit or explicit transaction it was part of, was applied.
func MixedUp(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P05" || pe.Code == "26000") && strings.Contains(pe.Message, `"stmtcache_`)
}

// A Conn is a connection of a pool as Fallback hands it to a statement:
// its Exec, Query and QueryRow are pgx's, with pgx.QueryExecModeExec as
// the first argument when Fallback runs the statement again (Exec reports
// whether it does; Args gives the arguments for a pgx.Tx the statement
// begins on it).
type Conn struct {
	conn *pgxpool.Conn
	exec bool
}

// Args returns args as c's Exec passes them: after pgx.QueryExecModeExec
// when Fallback runs the statement again.
func (c Conn) Args(args ...any) []any {
	if !c.exec {
		return args
	}
	return ExecArgs(args...)
}

// ExecArgs returns args after pgx.QueryExecModeExec: a statement's
// arguments for running it in pgx's exec mode (see Fallback).
func ExecArgs(args ...any) []any { return append([]any{pgx.QueryExecModeExec}, args...) }

// Again reports whether Fallback runs the statement again, in pgx's exec
// mode, which prepares no statement by name.
func (c Conn) Again() bool { return c.exec }

// Pool returns the connection of the pool.
func (c Conn) Pool() *pgxpool.Conn { return c.conn }

// Exec runs sql as pgxpool.Conn.Exec does, with Args(args...).
func (c Conn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.conn.Exec(ctx, sql, c.Args(args...)...)
}

// Query runs sql as pgxpool.Conn.Query does, with Args(args...).
func (c Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.conn.Query(ctx, sql, c.Args(args...)...)
}

// QueryRow runs sql as pgxpool.Conn.QueryRow does, with Args(args...).
func (c Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return c.conn.QueryRow(ctx, sql, c.Args(args...)...)
}

// Begin begins a transaction on the connection (BEGIN and COMMIT take no
// arguments: pgx sends them without a prepared statement). Its statements
// take c.Args.
func (c Conn) Begin(ctx context.Context) (pgx.Tx, error) { return c.conn.Begin(ctx) }

// Fallback runs statement on conn and, when the server refused it as a
// mix-up of pgx's prepared statements (see MixedUp), at once again on
// conn, in pgx's exec mode (see Conn), which prepares no statement by
// name and so cannot meet one. The refusal proves that nothing was
// applied, so that running the statement again runs it once. It returns
// the last run's error. pgx forgets the statement it named on such an
// error (the next run in its mode prepares it again), but not the others
// of its cache: each costs one refused round trip more when it meets
// another server session, as it would without Fallback.
// default_query_exec_mode=exec in a DSN, which prepares nothing by name,
// spares those round trips.
func Fallback(conn *pgxpool.Conn, statement func(c Conn) error) error {
	err := statement(Conn{conn: conn})
	if MixedUp(err) && !conn.Conn().PgConn().IsClosed() {
		err = statement(Conn{conn: conn, exec: true})
	}
	return err
}
