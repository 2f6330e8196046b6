package idem

import (
	"context"
	"errors"
	"sync/atomic"
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
// It costs an attempt a timer set and stopped, and three allocations (the
// keeper, its timer and the timer's function; BENCHMARKS.md). Keepers
// pooled with their timer cost none, but a timer belongs to the
// testing/synctest bubble it was made in, and a pooled one made elsewhere
// runs on the real clock inside a test's fake one: not kept.
type leaseKeeper struct {
	ctx        context.Context
	jar        Jar
	op, holder string
	lease      time.Duration
	timer      *time.Timer

	state  atomic.Int32                       // keeperStarting, keeperIdle, keeperRenewing, keeperStopped or keeperStopping
	cancel atomic.Pointer[context.CancelFunc] // the renewal's, while it runs
	wait   chan struct{}                      // closed by a renewal that stop waits for
}

const (
	keeperStarting = iota // keepLease has not set the timer yet
	keeperIdle            // the timer armed, or spent
	keeperRenewing        // a renewal runs
	keeperStopped         // stop ran; no renewal runs or will
	keeperStopping        // stop waits for the renewal in progress (wait)
)

// keepLease starts renewing c's lease every half lease until stop.
func (c *call) keepLease(ctx context.Context, lease time.Duration) *leaseKeeper {
	k := &leaseKeeper{ctx: ctx, jar: c.t.Jar, op: c.op, holder: c.holder, lease: lease}
	k.timer = time.AfterFunc(lease/2, k.renew)
	// The timer's function reads k.timer after it reads this state: a
	// function that fires before (a lease of nanoseconds) does nothing.
	k.state.Store(keeperIdle)
	return k
}

func (k *leaseKeeper) renew() {
	if !k.state.CompareAndSwap(keeperIdle, keeperRenewing) {
		return // stopped, or not started
	}
	ctx, cancel := context.WithTimeout(detach(k.ctx), k.lease/2)
	k.cancel.Store(&cancel)
	if k.state.Load() == keeperStopping {
		cancel() // stop began before the cancel was stored, and did not see it
	}
	_, err := k.jar.Acquire(ctx, k.op, k.holder, time.Now(), k.lease)
	k.cancel.Store(nil)
	cancel()
	again := !errors.Is(err, ErrLeased) && !errors.Is(err, ErrNotFound) // else taken over, or gone
	if !k.state.CompareAndSwap(keeperRenewing, keeperIdle) {
		close(k.wait) // stop waits
		return
	}
	if again {
		k.timer.Reset(k.lease / 2)
		if k.state.Load() == keeperStopped {
			k.timer.Stop() // stop came between the swap and the Reset
		}
	}
}

// stop ends the renewals once the attempt returned, after the one in
// progress, if any, which it cancels: none follows, so that none takes the
// lease again after the call released it.
func (k *leaseKeeper) stop() {
	// Each turn but the first needs a renewal to end and the timer to fire
	// again, half a lease later.
	for range 100 {
		if k.state.CompareAndSwap(keeperIdle, keeperStopped) {
			k.timer.Stop()
			return
		}
		// A renewal runs: stop is the only other writer of the state.
		if k.wait == nil {
			k.wait = make(chan struct{})
		}
		if k.state.CompareAndSwap(keeperRenewing, keeperStopping) {
			if cancel := k.cancel.Load(); cancel != nil {
				(*cancel)()
			}
			<-k.wait
			k.timer.Stop()
			return
		}
	}
	k.state.Store(keeperStopped) // not reached: a renewal ending now finds it stopped
	k.timer.Stop()
}
