package pgmigrate

import (
	"errors"
	"strings"

	"github.com/idemkit/idem/internal/dsn"
	"github.com/jackc/pgx/v5/pgconn"
)

// ParseError returns err, pgx's error for a connection string it could
// not parse (a *pgconn.ParseConfigError), with a message that shows the
// string with its passwords masked as dsn.MaskPasswords masks them, and
// wrapping err still. pgx masks a key=value password only to its first
// space, escaped or not: "password=sec\ ret" showed "ret". Another error
// is returned as it is.
func ParseError(err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return err
	}
	// "cannot parse `…`: " as pgx writes it, for the message's rest.
	head := (&pgconn.ParseConfigError{ConnString: pce.ConnString}).Error()
	rest, ok := strings.CutPrefix(pce.Error(), head)
	if !ok {
		rest = "pgx's message left out: it may quote the password"
	}
	return &parseError{msg: "cannot parse `" + dsn.MaskPasswords(pce.ConnString) + "`: " + dsn.MaskPasswords(rest), err: err}
}

type parseError struct {
	msg string
	err error
}

func (e *parseError) Error() string { return e.msg }
func (e *parseError) Unwrap() error { return e.err }
