package idem

import (
	"context"
	"errors"
	"sync"
	"time"
)

// leaseKeeper renews a call's lease while one attempt runs longer than
// half of it, so that no other holder (a resume, another process's call,
// an abandon) takes the operation as free while its attempt still waits
// for an answer: without it, an attempt that outlasted the lease (no
// Policy.AttemptTimeout, a server that takes minutes) left the operation
// to whoever came next. Each renewal is the holder's own Acquire, which
// extends a lease it holds; the keeper stops at the first refusal (taken
// over: the attempt's outcome is then fenced out, as before) and retries a
// jar's error at the next half lease, while the lease may still hold.
//
// It costs an attempt a timer (three allocations, ≈ 0.35 µs: BENCHMARKS.md).
// Keepers pooled with their timer cost none, but a timer belongs to the
// testing/synctest bubble it was made in, and a pooled one made elsewhere
// runs on the real clock in a test's fake one: not kept.
type leaseKeeper struct {
	ctx        context.Context
	jar        Jar
	op, holder string
	lease      time.Duration

	mu    sync.Mutex // held by a renewal; stop waits for it
	done  bool
	timer *time.Timer
}

// keepLease starts renewing c's lease every half lease until stop.
func (c *call) keepLease(ctx context.Context, lease time.Duration) *leaseKeeper {
	k := &leaseKeeper{ctx: ctx, jar: c.t.Jar, op: c.op, holder: c.holder, lease: lease}
	k.mu.Lock()
	k.timer = time.AfterFunc(lease/2, k.renew)
	k.mu.Unlock()
	return k
}

func (k *leaseKeeper) renew() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return
	}
	ctx, cancel := context.WithTimeout(detach(k.ctx), k.lease/2)
	_, err := k.jar.Acquire(ctx, k.op, k.holder, time.Now(), k.lease)
	cancel()
	if errors.Is(err, ErrLeased) || errors.Is(err, ErrNotFound) {
		return // taken over, or gone: nothing left to keep
	}
	k.timer.Reset(k.lease / 2)
}

// stop ends the renewals once the attempt returned, after the one in
// progress, if any: none follows, so that none takes the lease again after
// the call released it.
func (k *leaseKeeper) stop() {
	k.mu.Lock()
	k.done = true
	k.timer.Stop()
	k.mu.Unlock()
}
