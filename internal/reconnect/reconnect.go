// Package reconnect is what the PostgreSQL stores need to ride out a brief
// outage of their server: telling a pooled connection that the server has
// closed from one that is idle, without a round trip, and running a write
// again, for a bounded time, when the connection it was sent on was lost.
package reconnect

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Stale reports whether c, a connection idle since its last exchange, has
// something waiting to be read: a server that ends a session (PostgreSQL on
// a restart or pg_terminate_backend) sends an error and closes it, and a
// broken socket holds its error. An idle connection the server is still
// serving has nothing. Stale reads nothing: it peeks at the socket without
// waiting, one system call. It reports false when it cannot peek: c (or the
// connection under a *tls.Conn) is not a socket, or the platform has no
// MSG_PEEK.
func Stale(c net.Conn) bool {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		c = t.NetConn()
	}
	return peek(c)
}

// Bounds of the waits between Retry's attempts.
const (
	firstWait = 50 * time.Millisecond
	maxWait   = time.Second
)

// Retry calls attempt until it succeeds, fails for good (again is false),
// or the next attempt would start after until: an attempt that starts in
// time runs to its end, under its own deadline. Between attempts it waits,
// 50 ms first and twice as long each time, at most a second and never past
// until, and it stops when ctx ends. It returns the last attempt's error
// as it is, or, when ctx ended while it waited, an error that wraps both
// ctx's error and the last attempt's.
func Retry(ctx context.Context, until time.Time, attempt func() (again bool, err error)) error {
	// Every pass but the last waits, and the waits end at until.
	for wait := firstWait; ; wait = min(2*wait, maxWait) {
		again, err := attempt()
		left := time.Until(until)
		if err == nil || !again || left <= 0 {
			return err
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w, after: %w", context.Cause(ctx), err)
		}
	}
}

// An Outage is when a writer's run of lost connections began, so that the
// retries of its successive writes share one bound: a server down for
// longer costs each later write one attempt, until one gets through. Its
// zero value is no outage. It is not safe for concurrent use: it serves
// one writer, such as a jar's applier.
type Outage struct{ since time.Time }

// Until returns when the retries of a write that starts at now end (see
// Retry): bound after the outage began, or after now when there is none.
func (o *Outage) Until(now time.Time, bound time.Duration) time.Time {
	if o.since.IsZero() {
		return now.Add(bound)
	}
	return o.since.Add(bound)
}

// Note records how a write that started at now ended: lost when its last
// attempt lost the connection, which begins an outage at now unless one
// is on; not lost, which ends it.
func (o *Outage) Note(now time.Time, lost bool) {
	switch {
	case !lost:
		o.since = time.Time{}
	case o.since.IsZero():
		o.since = now
	}
}
