// Package errprefix wraps an error with what failed, under its package's
// prefix said once.
package errprefix

import (
	"fmt"
	"strings"
)

// Wrapf returns err after prefix ("keyjar"), ": " and what format says
// happened: "keyjar: begin \"op\": jar is closed". The prefix that begins
// err's own message (a sentinel's, "keyjar: jar is closed") is left out,
// so that it is said once. errors.Is and errors.As see err.
func Wrapf(prefix string, err error, format string, args ...any) error {
	return &wrapped{prefix: prefix + ": ", what: fmt.Sprintf(format, args...), err: err}
}

type wrapped struct {
	prefix, what string
	err          error
}

func (e *wrapped) Error() string {
	return e.prefix + e.what + ": " + strings.TrimPrefix(e.err.Error(), e.prefix)
}

func (e *wrapped) Unwrap() error { return e.err }
