package idem

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/internal/dsn"
)

// Event describes one step of an operation, for Hooks and logs.
type Event struct {
	Op      string        // the operation's name (see WithOperation)
	Key     string        // its Idempotency-Key
	Attempt int           // 1-based number of the attempt within this call; 0 before the first
	Status  int           // the attempt's status, 0 when it got no answer (OnGiveUp, OnReconcile: the last one known, 0 when none)
	Err     error         // the attempt's error, or why the call stopped
	Wait    time.Duration // OnRetry: the wait before the next attempt; OnGiveUp: until the operation's next attempt time the server asked for, when the call stored one
	Reason  string        // OnRetry and OnGiveUp: why, in a few words (OnGiveUp's is the *PendingError's Reason)
}

// Hooks are callbacks on an operation's steps, for metrics and tracing. A
// nil field is skipped. They run synchronously on the calling goroutine, so
// they must be fast and safe for concurrent use. A hook that panics ends
// the call: the panic reaches the caller of RoundTrip as it is (it is not
// recovered), after the call gave the operation's lease back, so that
// another call may send it at once, and closed the body of the response it
// held (the one OnReplay, OnRetry or OnGiveUp saw). The operation stays
// pending, as when a call stops (after OnReplay too: a later call sends
// it again and gets the replay), or keeps what was recorded before
// OnGiveUp or OnReconcile ran. An attempt whose OnAttempt panicked is
// neither sent nor counted; when it was the first of an operation without
// a name, which no call can name to resume, the operation is abandoned
// (nothing of it was sent), as one that Base refused with ErrNotSent. A panic in the Transport's Logger is handled
// the same way.
type Hooks struct {
	// OnAttempt runs before each attempt is sent. One that Base then
	// refuses with ErrNotSent was not sent, and OnGiveUp follows with its
	// error.
	OnAttempt func(Event)
	// OnRetry runs after an attempt that will be retried, before the wait;
	// not when the wait would end at or after the context's deadline: the
	// call stops then, and OnGiveUp runs.
	OnRetry func(Event)
	// OnGiveUp runs when a call stops without a final answer: the
	// operation stays pending. A 401 or 407 that leaves a pending
	// operation pending is such a stop, and so is an attempt Base did not
	// send (ErrNotSent; Reason "not sent"), which abandons an unnamed
	// operation never sent. An unnamed operation whose every attempt
	// failed to connect is abandoned too when the call stops (see
	// PendingError): OnGiveUp then has Reason "not sent", whatever
	// stopped the call (MaxAttempts, the budget, the context's end, which
	// a named one's Reason gives), and Err the dial's error, or the
	// context's.
	OnGiveUp func(Event)
	// OnReplay runs when the server answered with Idempotent-Replayed: true.
	OnReplay func(Event)
	// OnReconcile runs when a call finds its operation past its horizon;
	// not for one that an earlier call already marked StateReconcile,
	// which returns a *ReconcileError all the same.
	OnReconcile func(Event)
}

func (c *call) event(status int, err error) Event {
	return Event{Op: c.op, Key: c.key, Attempt: c.attempts, Status: status, Err: err}
}

func (c *call) log(ctx context.Context, level slog.Level, msg string, e Event, extra ...slog.Attr) {
	l := c.t.Logger
	if l == nil || !l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("op", e.Op), slog.String("key", e.Key), slog.Int("attempt", e.Attempt)}
	if e.Status != 0 {
		attrs = append(attrs, slog.Int("status", e.Status))
	}
	if e.Err != nil {
		// As a record keeps it: a URL it quotes without its password and
		// its query's secrets.
		attrs = append(attrs, slog.String("err", dsn.MaskPasswords(e.Err.Error())))
	}
	if e.Wait != 0 {
		attrs = append(attrs, slog.Duration("wait", e.Wait))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", e.Reason))
	}
	l.LogAttrs(ctx, level, msg, append(attrs, extra...)...)
}

func fire(fn func(Event), e Event) {
	if fn != nil {
		fn(e)
	}
}
