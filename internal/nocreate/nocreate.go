// Package nocreate marks the opening of a jar file that must exist
// already (idemctl's), so that keyjar.Open creates neither the file nor
// its schema, without exported API for it.
//
// A command that operates a jar checks nothing before it opens it: the
// file may be removed between the check and the open, and an open that
// creates it would show an empty new jar instead of saying there is none.
// The open itself refuses what is missing.
package nocreate

import "context"

type mark struct{}

// Mark returns a copy of ctx that tells keyjar.Open to open only an
// existing jar.
func Mark(ctx context.Context) context.Context { return context.WithValue(ctx, mark{}, true) }

// Marked reports whether ctx tells keyjar.Open to open only an existing
// jar.
func Marked(ctx context.Context) bool {
	marked, _ := ctx.Value(mark{}).(bool)
	return marked
}
