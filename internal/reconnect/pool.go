package reconnect

import (
	"context"
	"errors"
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
func Acquire(ctx context.Context, pool *pgxpool.Pool, bound time.Duration) (_ *pgxpool.Conn, _ context.Context, done func(), _ error) {
	wait, cancel := context.WithTimeout(ctx, bound)
	conn, err := pool.Acquire(wait)
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
// spent. Nor is a connection the server refused at authentication
// (SQLSTATE class 28: a wrong password, a role that may not log in, a
// pg_hba.conf rejection), which another attempt would only meet again.
func Lost(ctx context.Context, conn *pgxpool.Conn, err error) bool {
	switch {
	case err == nil || ctx.Err() != nil || pgconn.Timeout(err):
		return false
	case conn == nil:
		var (
			connectErr *pgconn.ConnectError
			pgErr      *pgconn.PgError
		)
		return errors.As(err, &connectErr) && !(errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28"))
	}
	return conn.Conn().PgConn().IsClosed()
}

// Run runs statement on a connection from pool, under the context and
// bound of Acquire, and runs it again on another connection while the
// connection was lost before the answer (see Lost), until until (see
// Retry). A statement whose connection was lost after it was taken may
// have been applied: it runs again only when resend is true, which is
// safe when running it twice does what running it once does. Run returns
// the last attempt's error and, as lost, the error of the first attempt
// so lost, or nil; statement's unsure tells it whether there was one, so
// that it can recognise its own earlier work.
func Run(ctx context.Context, pool *pgxpool.Pool, bound time.Duration, until time.Time, resend bool,
	statement func(ctx context.Context, conn *pgxpool.Conn, unsure bool) error) (lost, err error) {
	err = Retry(ctx, until, func() (bool, error) {
		conn, sctx, done, err := Acquire(ctx, pool, bound)
		if err != nil {
			return Lost(ctx, nil, err), err
		}
		defer done()
		err = statement(sctx, conn, lost != nil)
		if !Lost(sctx, conn, err) {
			return false, err
		}
		if lost == nil {
			lost = err
		}
		return resend, err
	})
	return lost, err
}
