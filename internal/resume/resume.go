// Package resume marks the call that resumes a pending operation
// (client.Resume), so that idem.Transport sends it only while the
// operation is still pending, without exported API for it.
//
// An ordinary call of a done or failed operation is sent again, to get the
// server's saved answer. A resume is sent without the first send's
// credential when its caller does not give it again, and a server that
// scopes keys by credential takes it for a new request: it must send only
// an operation whose outcome is still unknown.
package resume

import (
	"context"
	"fmt"
)

type key struct{}

// Mark returns a copy of ctx that marks a call of idem.Transport as a
// resume.
func Mark(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, true) }

// Marked reports whether ctx marks a resume.
func Marked(ctx context.Context) bool {
	marked, _ := ctx.Value(key{}).(bool)
	return marked
}

// StateError is the error of a resume that finds its operation no longer
// pending: at Begin, or once it has the operation's lease (another holder
// settled it while the resume waited). Nothing was sent, and a lease the
// call took is given back.
type StateError struct {
	Op, Key string
	State   string // the operation's state: done, failed or abandoned
}

func (e *StateError) Error() string {
	return fmt.Sprintf("idem: operation %q (key %q) is %s, no longer pending: a resume sends nothing", e.Op, e.Key, e.State)
}
