package pgmigrate

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable returns err, when it holds pgx's *pgconn.ConnectError (no
// connection to the database could be made), as an error that says so and
// why: "connection to the database failed (user=ops database=payments): "
// and the attempts' errors (Attempts), joined with "; ". It wraps err
// still, so that errors.As finds the *pgconn.ConnectError and the server's
// *pgconn.PgError. pgx's message says neither the password nor any other
// part of the DSN than the user and the database. It returns nil for
// another error.
func Unreachable(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil {
		return nil
	}
	return &unreachable{msg: fmt.Sprintf("connection to the database failed (user=%s database=%s): %s",
		ce.Config.User, ce.Config.Database, strings.Join(Attempts(ce), "; ")), err: err}
}

type unreachable struct {
	msg string
	err error
}

func (e *unreachable) Error() string { return e.msg }
func (e *unreachable) Unwrap() error { return e.err }

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
