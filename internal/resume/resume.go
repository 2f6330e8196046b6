// Package resume marks the call that resumes a pending operation
// (client.Resume), so that idem.Transport sends it only while the
// operation is still pending, without exported API for it.
//
// An ordinary call of a done or failed operation is sent again, to get the
// server's saved answer, and one whose name is abandoned or unknown begins
// a new operation under a new key. A resume is sent without the first
// send's credential when its caller does not give it again, and a server
// that scopes keys by credential takes it for a new request: it must send
// only the operation it found, under its key, while its outcome is still
// unknown.
package resume

import (
	"context"
	"fmt"
)

type mark struct{}

// Mark returns a copy of ctx that marks a call of idem.Transport as the
// resume of the operation whose key is key: the call neither creates nor
// replaces a record, and sends only that key's operation while it is
// pending.
func Mark(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, mark{}, key)
}

// Key returns the key of the operation that ctx marks a resume of, and
// whether ctx marks one.
func Key(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(mark{}).(string)
	return key, ok
}

type withoutBody struct{}

// WithoutBody returns a copy of ctx that marks a resume (Mark) whose
// caller does not have the operation's body, which the jar did not store:
// the call takes up the operation as any resume does, but whatever its
// fingerprint, and sends nothing. Past its horizon, the operation is marked
// for reconciliation; before, the call returns idem.ErrBodyNotStored.
func WithoutBody(ctx context.Context) context.Context {
	return context.WithValue(ctx, withoutBody{}, true)
}

// BodyMissing reports whether ctx marks a resume without its body
// (WithoutBody).
func BodyMissing(ctx context.Context) bool {
	missing, _ := ctx.Value(withoutBody{}).(bool)
	return missing
}

// StateError is the error of a resume that finds its operation no longer
// pending, or no longer in the jar, when it takes it up or once it has the
// operation's lease (another holder settled it while the resume waited).
// Nothing was sent, and a lease the call took is given back.
type StateError struct {
	Op, Key string
	State   string // the operation's state: done, failed or abandoned; "" when it is no longer in the jar
}

func (e *StateError) Error() string {
	if e.State == "" {
		return fmt.Sprintf("idem: operation %q (key %q) is no longer in the jar: a resume sends nothing", e.Op, e.Key)
	}
	return fmt.Sprintf("idem: operation %q (key %q) is %s, no longer pending: a resume sends nothing", e.Op, e.Key, e.State)
}
