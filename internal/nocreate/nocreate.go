// Package nocreate marks the opening of a jar that must exist already
// (idemctl's), so that keyjar.Open creates neither the file nor its
// schema and pgjar.Open creates no table, without exported API for it.
//
// A command that operates a jar checks nothing before it opens it: the
// file may be removed, or the tables dropped, between the check and the
// open, and an open that creates them would show an empty new jar instead
// of saying there is none. The open itself refuses what is missing.
package nocreate

import (
	"context"
	"errors"
)

type mark struct{}

// Mark returns a copy of ctx that tells keyjar.Open and pgjar.Open to open
// only an existing jar.
func Mark(ctx context.Context) context.Context { return context.WithValue(ctx, mark{}, true) }

// Marked reports whether ctx tells keyjar.Open and pgjar.Open to open only
// an existing jar.
func Marked(ctx context.Context) bool {
	marked, _ := ctx.Value(mark{}).(bool)
	return marked
}

// ErrNoJar is returned, wrapped, by pgjar.Open under Mark for a database
// without the jar's table of versions or at an earlier schema version
// (one at the current version without a table is pgjar.ErrSchema). What
// is missing follows it in the error's text.
var ErrNoJar = errors.New("no key jar")
