// Package presend lets a Base that runs code of its caller's before it
// sends an attempt (package client's Options.Header) tell idem.Transport
// that this code is running, without exported API for it: a panic there
// ends the call with nothing of the attempt sent, and the Transport gives
// the attempt back as it does one whose OnAttempt hook panicked (not
// counted; an operation without a name abandoned).
package presend

import "context"

// A Guard says whether a call's Base is running the code before its send.
type Guard interface {
	// Running reports whether it is.
	Running() bool
}

type key struct{}

// With returns a copy of ctx that carries g, for the Transport and the
// Base of the call made with it.
func With(ctx context.Context, g Guard) context.Context {
	return context.WithValue(ctx, key{}, g)
}

// From returns the Guard that ctx carries, or nil.
func From(ctx context.Context) Guard {
	g, _ := ctx.Value(key{}).(Guard)
	return g
}

// Running reports whether the Guard that ctx carries says that the code
// before the send is running: false when ctx carries none.
func Running(ctx context.Context) bool {
	g := From(ctx)
	return g != nil && g.Running()
}
