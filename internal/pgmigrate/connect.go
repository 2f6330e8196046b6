package pgmigrate

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemkit/idem/internal/reconnect"
	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable returns err, when it holds pgx's *pgconn.ConnectError (no
// connection to the database could be made), as an error that says so and
// why: "connection to the database failed (user=ops database=payments): "
// and the attempts' errors (Attempts), joined with "; ". It wraps err
// still, so that errors.As finds the *pgconn.ConnectError and the server's
// *pgconn.PgError. pgx's message says neither the password nor any other
// part of the DSN than the user and the database. A PgBouncer's refusal of
// a startup parameter is followed by what to do about it (PoolerHint). It
// returns nil for another error.
func Unreachable(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil {
		return nil
	}
	msg := fmt.Sprintf("connection to the database failed (user=%s database=%s): %s",
		ce.Config.User, ce.Config.Database, strings.Join(Attempts(ce), "; "))
	if hint := PoolerHint(err); hint != "" {
		msg += "; " + hint
	}
	return &explained{msg: msg, err: err}
}

// OneLine returns err, when it holds pgx's *pgconn.ConnectError, with that
// error's words said as Unreachable says them, the rest of err's message
// kept (a context that ended while a call waited to try again: "context
// canceled, after: connection to the database failed …"); otherwise err
// itself. It wraps err still.
func OneLine(err error) error {
	var ce *pgconn.ConnectError
	c := Unreachable(err)
	if c == nil || !errors.As(err, &ce) {
		return err
	}
	return &explained{msg: strings.Replace(err.Error(), ce.Error(), c.Error(), 1), err: err}
}

// PoolerHint returns, for err holding PgBouncer's refusal of a startup
// parameter (see reconnect.UnsupportedParameter), what to do about it, or
// "". pgjar's and pgstore's Open set three (opened): a PgBouncer refuses
// the first it does not take, and would refuse the next once that one is
// let through, so the hint names them all. Another one, of the connection
// string's own (search_path), is not to be ignored, which drops it: the
// hint says to set it on the role instead.
func PoolerHint(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	name := reconnect.UnsupportedParameter(pe)
	if name == "" {
		return ""
	}
	own := ""
	if !slices.Contains(opened, name) {
		// Ignored, it would be dropped: a search_path, the session then on
		// the role's, would have the tables looked for in another schema.
		own = "PgBouncer drops the startup parameters it ignores: set " + name + " on the role (ALTER ROLE … IN DATABASE … SET) " +
			"and take it out of the connection string; "
	}
	return "behind a PgBouncer? " + own + "list the startup parameters idem sets (" + strings.Join(opened, ", ") + ") in its ignore_startup_parameters, " +
		"and set statement_timeout on the role instead (ALTER ROLE … SET): see README, Behind PgBouncer"
}

// CacheHint returns err, when it holds the server's refusal of a statement
// pgx's statement cache named (SQLSTATE 42P05, `prepared statement
// "stmtcache_…" already exists`, or 26000, `… does not exist`), followed
// by what to do about it; otherwise err itself. The server keeps prepared
// statements per session, and pgx caches which it has prepared on each of
// its connections: a pooler in transaction mode, such as PgBouncer's
// pool_mode = transaction, hands one server session to many of them, and
// the two disagree (see reconnect.MixedUp). pgx's exec mode prepares
// nothing by name. errors.As still finds the *pgconn.PgError.
func CacheHint(err error) error {
	if !reconnect.MixedUp(err) {
		return err
	}
	return &explained{msg: err.Error() + "; behind a pooler in transaction mode? add default_query_exec_mode=exec to the DSN: see README, Behind PgBouncer", err: err}
}

// opened are the startup parameters pgjar's and pgstore's Open set.
var opened = []string{"default_transaction_isolation", "statement_timeout", "synchronous_commit"}

// explained is an error whose message says more than the one it wraps.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// Attempts returns why ce's connection failed: the error of each address
// and TLS mode pgx tried, as pgx gives them one a line after its prefix,
// each once, and a line that a kept one ends with (the cause it already
// gives) left out. pgx tries an address with TLS and then without
// (sslmode prefer, its default): the same dial error twice, or a refused
// TLS attempt before the server's own refusal (a wrong password, no such
// database). A refused TLS attempt is left out when another attempt
// followed it.
func Attempts(ce *pgconn.ConnectError) []string {
	detail := ce.Error()
	if cause := ce.Unwrap(); cause != nil {
		detail = cause.Error()
	}
	var kept []string
	for line := range strings.SplitSeq(detail, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !slices.ContainsFunc(kept, func(k string) bool { return k == line || strings.HasSuffix(k, ": "+line) }) {
			kept = append(kept, line)
		}
	}
	if others := slices.DeleteFunc(slices.Clone(kept), refusedTLS); len(others) > 0 {
		return others
	}
	return kept
}

// refusedTLS reports whether line is pgx's error for a server that
// refused TLS.
func refusedTLS(line string) bool {
	return strings.HasSuffix(line, "tls error: server refused TLS connection")
}
