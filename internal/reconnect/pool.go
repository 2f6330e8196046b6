package reconnect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ShouldPing is a pgxpool.Config.ShouldPing: the pool pings a connection
// before it hands it out when it was idle for more than a second, as
// pgxpool does by default, or when the server closed it meanwhile (Stale).
func ShouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > time.Second || Stale(p.Conn.PgConn().Conn())
}

// Acquire takes a connection from pool, waiting for one at most bound, and
// returns it with the context for one statement on it, which waits at most
// as long again, both within ctx. The wait for the pool is not taken from
// the statement's: the server's statement_timeout (half of bound) must
// remain the first to end a statement. done releases the connection.
//
// When bound passes before a connection came (the server did not answer
// a new connection, or the ping of an idle one, or every connection of
// the pool was busy), the error says so, and wraps
// context.DeadlineExceeded. When ctx ends first, its error is returned as
// it is.
func Acquire(ctx context.Context, pool *pgxpool.Pool, bound time.Duration) (_ *pgxpool.Conn, _ context.Context, done func(), _ error) {
	wait, cancel := context.WithTimeout(ctx, bound)
	conn, err := pool.Acquire(wait)
	if err != nil && wait.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("no connection to the database within %v: the server did not answer, or every connection of the pool (pool_max_conns=%d) was busy: %w",
			bound, pool.Config().MaxConns, err)
	}
	cancel()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel = context.WithTimeout(ctx, bound)
	return conn, ctx, func() { cancel(); conn.Release() }, nil
}

// Lost reports whether err, which a statement on conn returned under ctx
// (conn is nil when none could be taken from the pool), is the loss of the
// connection to the server rather than the server's answer: no connection
// could be made (the server is down, or starting), or the one in use
// closed (the server ended the session, or the network failed). An error
// that came with ctx done, or a timeout, is not: the statement's time is
// spent. Nor is a session the server refused (see refusal), which
// another attempt would only meet again.
func Lost(ctx context.Context, conn *pgxpool.Conn, err error) bool {
	switch {
	case err == nil || ctx.Err() != nil || pgconn.Timeout(err):
		return false
	case conn == nil:
		var (
			connectErr *pgconn.ConnectError
			pgErr      *pgconn.PgError
		)
		return errors.As(err, &connectErr) && !(errors.As(err, &pgErr) && refusal(pgErr))
	}
	return conn.Conn().PgConn().IsClosed()
}

// ReadOnly reports whether err, which a statement on conn (a connection of
// pool) returned under ctx, is its session refusing a write as read-only
// (SQLSTATE 25006), and then closes conn and resets pool. A session keeps
// the default_transaction_read_only it started with: those the pool made
// while the database's or the role's was on would refuse every write until
// the pool retires them, long after the setting was reset. Closed, they are
// dropped (one in use, when released), and the pool dials others, which
// start with the setting as it is then. The refused write applied nothing:
// the caller may run it once more, on a new session, which fails again
// only while transactions are still read-only (a window not yet over, a
// hot standby). Call it after Lost, which takes a closed connection for a
// lost one.
func ReadOnly(ctx context.Context, pool *pgxpool.Pool, conn *pgxpool.Conn, err error) bool {
	var pe *pgconn.PgError
	if conn == nil || !errors.As(err, &pe) || pe.Code != "25006" {
		return false
	}
	_ = conn.Conn().Close(ctx)
	pool.Reset()
	return true
}

// refusal reports whether a server that ends a new session with pe
// refuses the session itself, as it will every session made the same way
// until someone changes the role, the database or the connection string:
// SQLSTATE class 28 (invalid authorization: a wrong password, a role that
// does not exist or may not log in, a pg_hba.conf rejection), 3D000 (the
// database does not exist), 42501 (no CONNECT privilege on the database,
// or a setting in the connection string that only a superuser may set),
// 55000 (a database that does not allow connections, or that an
// interrupted DROP DATABASE left invalid), 42704, 22023 and 55P02 (a
// setting in the connection string that the server does not know, a value
// it does not accept, or one only a restart sets), and PgBouncer's refusal
// of a startup parameter (UnsupportedParameter). A server that cannot take
// a session yet is not refusing it: starting up or shutting down (57P03),
// out of connection slots (53300), a PgBouncer out of them (08P01 too).
func refusal(pe *pgconn.PgError) bool {
	switch pe.Code {
	case "3D000", "42501", "55000", "42704", "22023", "55P02":
		return true
	}
	return strings.HasPrefix(pe.Code, "28") || UnsupportedParameter(pe) != ""
}

// UnsupportedParameter returns the name of the startup parameter that pe,
// a server's refusal of a new session, says it does not take, or "": the
// refusal of PgBouncer, which takes only the parameters it tracks
// (client_encoding, DateStyle, TimeZone, standard_conforming_strings,
// application_name) and those its ignore_startup_parameters lists, with
// SQLSTATE 08P01 and "unsupported startup parameter: " and the name
// ("Unsupported" in earlier versions).
func UnsupportedParameter(pe *pgconn.PgError) string {
	const prefix = "unsupported startup parameter: "
	if pe.Code != "08P01" || len(pe.Message) < len(prefix) || !strings.EqualFold(pe.Message[:len(prefix)], prefix) {
		return ""
	}
	return pe.Message[len(prefix):]
}

// Run runs statement on a connection from pool, under the context and
// bound of Acquire, and runs it again on another connection while the
// connection was lost before the answer (see Lost), until until (see
// Retry). A statement whose connection was lost after it was taken may
// have been applied: it runs again only when resend is true, which is
// safe when running it twice does what running it once does. Run returns
// the last attempt's error and, as lost, the error of the first attempt
// so lost, or nil; statement's unsure tells it whether there was one, so
// that it can recognise its own earlier work. A statement that a session
// refused as read-only runs once more after the pool is reset (see
// ReadOnly). One refused as a mix-up of pgx's prepared statements runs
// again at once on the same connection, in pgx's exec mode (see Fallback).
func Run(ctx context.Context, pool *pgxpool.Pool, bound time.Duration, until time.Time, resend bool,
	statement func(ctx context.Context, conn Conn, unsure bool) error) (lost, err error) {
	reset := false
	err = Retry(ctx, until, func() (bool, error) {
		conn, sctx, done, err := Acquire(ctx, pool, bound)
		if err != nil {
			return Lost(ctx, nil, err), err
		}
		defer done()
		unsure := lost != nil
		err = Fallback(conn, func(c Conn) error { return statement(sctx, c, unsure) })
		if !Lost(sctx, conn, err) {
			again := ReadOnly(sctx, pool, conn, err) && !reset
			reset = reset || again
			return again, err
		}
		if lost == nil {
			lost = err
		}
		return resend, err
	})
	return lost, err
}
