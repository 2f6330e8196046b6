package idem

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/internal/canon"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/keyhdr"
	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/internal/presend"
	"github.com/idemkit/idem/internal/resume"
	"github.com/idemkit/idem/internal/secrethdr"
	"github.com/idemkit/idem/internal/sendable"
	"github.com/idemkit/idem/internal/stopped"
	"github.com/idemkit/idem/internal/unwritten"
	"github.com/idemkit/idem/retry"
)

// call is one RoundTrip of a keyed request: one logical operation, sent
// once or more.
type call struct {
	t      *Transport
	req    *http.Request
	body   reqBody
	policy retry.Policy
	op     string

	callerKey string // the key the caller set in the header, or ""
	resuming  bool   // a resume (internal/resume): sends only the operation it found
	bodyless  bool   // a resume without the body (resume.WithoutBody): sends nothing

	key      string
	holder   string // this call's lease holder id
	rec      Record
	sched    retry.Schedule
	attempts int  // attempts sent by this call
	cost     int  // what Transport.Budget charged for this call's last retry
	costDue  bool // that retry is not sent yet: the cost goes back if it never is
	tookOver bool // released a dead holder's lease once already
	created  bool // Begin created the operation (and counted its first attempt)
	lastCode int
	lastErr  error

	// What unwind gives back when the call ends without returning (a
	// panic in a hook): the lease, an attempt counted but not sent, and
	// the response in hand. returned is set once run has returned.
	//
	// held is true while the jar gave the call the lease (Begin, Acquire)
	// and nothing since took it away or gave it back; unsure while a
	// write that would have given it (Begin, Acquire) failed without
	// saying whether it was made, its answer lost (see mayHold).
	held     bool
	unsure   bool
	unsent   bool
	reached  bool // an attempt may have reached the server: it did more than fail to dial
	resp     *http.Response
	returned bool
}

// pending is the error of a call that stopped, for why, without a final
// answer.
func (c *call) pending(err error, next time.Time, why string) *PendingError {
	return &PendingError{Op: c.op, Key: c.key, Attempts: c.attempts, LastStatus: c.lastCode,
		Elapsed: c.sched.Elapsed(), NextAttempt: next, Err: err, State: c.rec.State,
		Reason: why, unnamed: c.unnamed()}
}

// unnamed reports whether the call was sent without a name (neither
// WithOperation nor a key of the caller's): its operation's name was
// generated, and no later call can name it.
func (c *call) unnamed() bool {
	return c.callerKey == "" && !c.resuming && Operation(c.req.Context()) == ""
}

// update records the outcome so far, fenced by this call's lease. A failed
// update is not fatal once a send happened: the record stays pending and a
// resume gets the server's replay. So the call does not wait for it when
// the jar can defer it.
func (c *call) update(ctx context.Context, ch Change) {
	c.fill(&ch)
	if ch.Release {
		c.held, c.unsure = false, false
	}
	if d, ok := c.t.Jar.(Deferrer); ok && d.Defer(c.op, c.holder, ch) == nil {
		return
	}
	if _, err := c.t.Jar.Update(detach(ctx), c.op, c.holder, ch); err != nil {
		// Said, not returned: the caller gets the answer all the same.
		c.log(ctx, slog.LevelWarn, "idem: the jar did not record the call's progress; the operation stays as the jar last recorded it", c.event(c.lastCode, err))
	}
}

// detach returns ctx without its cancellation, for a write that must
// outlive it. A context that can never be cancelled (its Done is nil, as
// context.Background's) is returned as it is, at no cost.
func detach(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// countAttempt adds the attempt about to be sent to the record, and waits
// until it is written: an attempt cut off by a crash shows in the jar. It
// returns ErrLeaseLost when the jar says another holder took the lease
// meanwhile (this call stalled past it: a pause, a slow jar), and so may
// be sending the operation; another error of the jar is ignored, and the
// attempt goes uncounted.
func (c *call) countAttempt(ctx context.Context) error {
	ch := Change{Attempts: 1}
	c.fill(&ch)
	if _, err := c.t.Jar.Update(detach(ctx), c.op, c.holder, ch); errors.Is(err, ErrLeaseLost) {
		return err
	}
	return nil
}

func (c *call) fill(ch *Change) {
	ch.Now = time.Now()
	if c.keepsOutcome(ch.State) {
		ch.LastStatus, ch.LastError, ch.NextAttempt = c.rec.LastStatus, c.rec.LastError, time.Time{}
		return
	}
	ch.LastStatus = c.lastCode
	if c.lastErr != nil {
		ch.LastError = errorText(c.lastErr)
	}
}

// keepsOutcome reports whether a change of this call to state ("": none,
// the call goes on or stops without the operation's answer) leaves the
// outcome of a settled operation, one called again for the server's saved
// answer, as the jar records it: what this call met on the way (a 503, a
// proxy's 502, a reset) is not the operation's outcome, and a done
// operation that succeeded (2xx) stays so whatever final answer the call
// gets (a 500 or a 404 of a proxy, a 422 of the server that compared this
// request with the one it applied). A failed operation, or a done one
// whose answer was not a success, takes the call's final answer: the
// server's latest for the key.
func (c *call) keepsOutcome(state State) bool {
	switch c.rec.State {
	case StateDone:
		return state == "" || success(c.rec.LastStatus) && !success(c.lastCode)
	case StateFailed:
		return state == ""
	}
	return false
}

func success(status int) bool { return status >= 200 && status <= 299 }

// errorText is err's message as a record keeps it: the passwords it
// quotes masked (dsn.MaskPasswords: a URL's, a connection string's, and
// the secrets of a URL's query, ?api_key=xxxxx), and valid UTF-8 without
// a NUL byte, which every jar can store (PostgreSQL's text holds neither).
// A base transport's error may quote any bytes, and a URL with its
// password or its query's secrets: net/http's for a malformed proxy URL
// (HTTPS_PROXY), a *url.Error, which quotes the request's URL whole.
func errorText(err error) string {
	s := dsn.MaskPasswords(err.Error())
	if pgtext.Holds(s) {
		return s
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// storedError is rec's LastError as the call's last error, or nil for
// none: its passwords masked, as errorText masks them, since an earlier
// version stored it as it was. A *PendingError, OnGiveUp's Event and the
// record written next get it.
func storedError(rec Record) error {
	if rec.LastError == "" {
		return nil
	}
	return errors.New(dsn.MaskPasswords(rec.LastError))
}

func (c *call) run(ctx context.Context) (*http.Response, error) {
	c.sched.Reset(c.policy)
	named := c.op != "" // from ctx, by WithOperation
	// Each attempt's body is opened before the attempt is counted: the
	// first one before Begin, which counts a new operation's first attempt,
	// so that a body that cannot be produced leaves no record at all.
	nextBody, err := c.openBody()
	if err != nil {
		return nil, err
	}
	defer func() {
		if nextBody != nil {
			nextBody.Close()
		}
	}()
	if err := c.begin(ctx); err != nil {
		return nil, err
	}
	if !named {
		ctx = WithOperation(ctx, c.op) // Base sees the name begin gave it
	}
	// leased is true while the call holds a lease taken with no wait since:
	// the one Begin gave a new operation. Any other attempt, and any after
	// a wait, renews it first.
	leased := c.rec.Holder == c.holder
	c.held = leased
	for {
		if err := retry.CtxErr(ctx); err != nil {
			return nil, c.stop(ctx, err)
		}
		now := time.Now()
		if !leased {
			rec, err := c.t.Jar.Acquire(ctx, c.op, c.holder, now, c.t.lease(c.policy))
			switch {
			case errors.Is(err, ErrLeased):
				c.rec, c.held, c.unsure = rec, false, false
				if err := c.notOurs(); err != nil {
					return nil, err
				}
				if !c.tookOver && HolderGone(rec.Holder) {
					// Its holder was killed: release its lease with its own
					// id (fenced: if anyone took it meanwhile, nothing
					// changes) and take it, rather than wait it out.
					c.tookOver = true
					_, _ = c.t.Jar.Update(ctx, c.op, rec.Holder, releasing(rec, now))
					continue
				}
				c.lastErr = err
				if !c.wait(ctx, rec.LeaseUntil.Sub(now), rec.Holder, rec.LeaseUntil) {
					const why = "operation leased by another holder"
					c.giveUp(ctx, c.lastErr, why, time.Time{})
					// The earliest a call can take it, unless its holder
					// ends first: the lease's end, or the server's
					// Retry-After when it comes later.
					next := rec.LeaseUntil
					if rec.NextAttempt.After(next) {
						next = rec.NextAttempt
					}
					return nil, c.pending(c.lastErr, next, why)
				}
				continue
			case errors.Is(err, ErrNotFound) && c.resuming && c.attempts == 0:
				// Forgotten since Resume read it: a resume creates nothing.
				return nil, &resume.StateError{Op: c.op, Key: c.key}
			case errors.Is(err, ErrNotFound) && c.attempts == 0:
				// Settled by the holder it waited for and pruned, or
				// forgotten: the jar did not fail, and a call that begins
				// it again does so under a new key, which the server
				// takes for a new request.
				return nil, fmt.Errorf("idem: operation %q (key %q): %w: pruned or forgotten while this call waited "+
					"for its lease; nothing was sent. Another call may have sent it under this key: ask the server "+
					"before calling under its name again, which begins it anew under a new key", c.op, c.key, ErrNotFound)
			case err != nil:
				// The jar may have taken the lease all the same, its answer
				// lost (pgjar's connection dropped after the statement ran),
				// unless it says the write was never made (keyjar's, withdrawn
				// as the context ended while it waited for another process's
				// write lock): given back, fenced by this call's holder id,
				// unless it is surely not this call's.
				c.unsure = c.unsure || !unwritten.Is(err)
				if ctxErr := retry.CtxErr(ctx); ctxErr != nil {
					return nil, c.stop(ctx, ctxErr) // the caller's context, not the jar, ended the call
				}
				if c.attempts == 0 {
					c.release(ctx)
					return nil, &JarError{Op: c.op, Err: err}
				}
				return nil, c.stopFor(ctx, err, "the jar failed")
			}
			c.rec, leased, c.held, c.unsure = rec, true, true, false
			if c.attempts == 0 {
				// What other holders learnt meanwhile is the latest outcome.
				c.lastCode, c.lastErr = rec.LastStatus, storedError(rec)
			}
			if err := c.notOurs(); err != nil {
				// Given back as it was taken, last update included.
				c.held = false
				_, _ = c.t.Jar.Update(context.Background(), c.op, c.holder, releasing(rec, rec.Updated))
				return nil, err
			}
		}
		// Checked under the lease, before every attempt, against the
		// stored first-send time: a restart does not reset it.
		if c.policy.Expired(c.rec.Created, now) {
			return nil, c.reconcile(ctx)
		}
		if c.bodyless {
			// Under the horizon a resume sends the body, which its caller
			// must give.
			c.release(ctx)
			return nil, fmt.Errorf("idem: operation %q: %w (%d bytes)", c.op, ErrBodyNotStored, c.rec.BodySize)
		}
		if !c.rec.NextAttempt.IsZero() && now.Before(c.rec.NextAttempt) {
			wait := c.rec.NextAttempt.Sub(now)
			if wait > c.policy.MaxRetryAfter || c.sched.Elapsed()+wait > c.policy.MaxElapsed {
				return nil, c.stopFor(ctx, nil, "the operation's next attempt time, stored in the jar (the server's Retry-After), is past MaxRetryAfter or the call's budget: nothing sent")
			}
			if pastDeadline(ctx, c.rec.NextAttempt) {
				// Nothing can be sent before the deadline (see sleepUntil):
				// the call stops now, its context still running.
				return nil, c.stopFor(ctx, context.DeadlineExceeded, "the operation's next attempt time, stored in the jar (the server's Retry-After), would come past the context's deadline")
			}
			e := c.event(0, nil)
			e.Wait, e.Reason = wait, "the server's Retry-After, stored in the jar"
			c.log(ctx, slog.LevelInfo, "idem: waiting for the operation's next attempt time", e)
			if err := sleepUntil(ctx, c.rec.NextAttempt); err != nil {
				return nil, c.stop(ctx, err)
			}
			c.rec.NextAttempt = time.Time{}
			leased = false // the lease may have run out during the wait
			continue
		}

		if nextBody == nil {
			if nextBody, err = c.openBody(); err != nil {
				return nil, c.stopFor(ctx, err, "GetBody could not give the body again")
			}
		}
		// Count the attempt before it is sent, so that one cut off by a
		// crash shows in the jar. Begin counted a new operation's first.
		if !c.created || c.attempts > 0 {
			if c.countAttempt(ctx) != nil {
				// Not sent: the lease is taken again, or waited for,
				// as before any attempt. The jar refused the count
				// because another holder has the lease (Update is fenced
				// by the holder alone): this call holds none.
				leased, c.held = false, false
				continue
			}
		}
		c.attempts++
		leased = false
		c.unsent = true
		e := c.event(0, nil)
		fire(c.t.Hooks.OnAttempt, e)
		c.log(ctx, slog.LevelDebug, "idem: attempt", e)
		c.unsent, c.costDue = false, false
		sent := nextBody
		resp, err := c.send(ctx, sent)
		nextBody = nil // the base transport closes it
		if err != nil && errors.Is(err, ErrNotSent) {
			return nil, c.notSent(ctx, err)
		}
		c.lastErr, c.resp = err, resp
		if err == nil || !connectFailed(err) || !c.unread(sent) {
			c.reached = true
		}
		if resp != nil {
			c.lastCode = resp.StatusCode
			if retry.Replayed(resp) {
				fire(c.t.Hooks.OnReplay, c.event(resp.StatusCode, nil))
			}
		}
		if err != nil && retry.CtxErr(ctx) != nil {
			// The caller's context ended: its error, not the transport's.
			return nil, c.stop(ctx, retry.CtxErr(ctx))
		}
		if err == nil && retry.NotApplied(resp.StatusCode) {
			// The credentials were refused before the request was
			// looked at: this answer says nothing of an earlier attempt's
			// outcome, which a resume without the first credential meets.
			// Not retried, and the operation stays as it was.
			if c.t.Budget != nil {
				c.t.Budget.Deposit(c.cost)
			}
			if c.unnamed() && c.attempts == 1 {
				// Refused at its only send, so never applied, and no call
				// can name it again: its caller has the answer, and may
				// send the request again (a token refreshed outside the
				// Transport) as an operation of its own. Pending, a resume
				// of every pending operation would send it once more.
				// Final, as another 4xx.
				c.update(ctx, Change{State: StateDone, Release: true})
				return resp, nil
			}
			c.update(ctx, Change{Release: true, NextAttempt: c.rec.NextAttempt})
			why := "credentials refused: " + reason(resp, nil)
			stopped.Mark(resp, why)
			if c.rec.State == StatePending {
				c.giveUp(ctx, nil, why, time.Time{})
			}
			return resp, nil
		}
		if err != nil {
			if be := asBodyError(err); be != nil {
				// The body's source failed as it was sent: every attempt
				// reads it alike. The server got a body cut short, which it
				// does not apply; the operation stays pending.
				return nil, c.stopFor(ctx, be, "the request body failed")
			}
		}
		switch retry.Classify(resp, err) {
		case retry.Final:
			if c.t.Budget != nil {
				c.t.Budget.Deposit(c.cost)
			}
			c.update(ctx, Change{State: StateDone, Release: true})
			return resp, nil
		case retry.Stop:
			if err != nil {
				if err, ok := c.abandonNeverConnected(ctx, err); ok {
					return nil, err
				}
				return nil, c.stopFor(ctx, err, "an error not retried")
			}
			if c.t.Budget != nil {
				c.t.Budget.Deposit(c.cost) // a final answer too, 422
			}
			state := StateFailed
			if c.rec.State == StateDone {
				// A server replays a done operation's answer: a 422 to a
				// call made again refuses this request (another body
				// under the key, as the server compares bodies), not
				// the operation, which it applied.
				state = StateDone
			}
			c.update(ctx, Change{State: state, Release: true})
			return resp, nil
		}
		// The wait runs from now: what the call does before it sleeps (the
		// record, the hooks, the drain) comes out of it, so that it ends
		// where Next measured it against MaxElapsed.
		decided := time.Now()
		ra, hasRA := retry.RetryAfter(resp, decided)
		wait, more, deferred := c.sched.Next(ra, hasRA)
		var why string
		switch {
		case deferred:
			why = "the server's Retry-After, longer than MaxRetryAfter, stored as the next attempt time, after "
		case c.attempts >= c.policy.MaxAttempts:
			more = false
			why = "MaxAttempts (" + strconv.Itoa(c.policy.MaxAttempts) + ") reached after "
		case !more:
			why = "the next wait would pass the call's MaxElapsed (" + c.policy.MaxElapsed.String() + ") after "
		case c.policy.Expired(c.rec.Created, decided.Add(wait)):
			// The attempt after the wait would not be sent but
			// reconciled: the call stops now, the operation pending, and
			// a later call under its name reconciles it past the horizon.
			more = false
			why = "the next wait would end past the retry horizon (" + c.policy.Horizon.String() + ") after "
		case c.t.Budget != nil:
			if c.cost, more = c.t.Budget.Withdraw(err); more {
				c.costDue = true
			} else {
				why = "retry budget empty after "
			}
		}
		if !more {
			if resp == nil {
				if err, ok := c.abandonNeverConnected(ctx, err); ok {
					return nil, err
				}
			}
			// The server's Retry-After, when it sent one, is when the
			// operation may be sent again, whatever stopped this call.
			var next time.Time
			if deferred {
				next = decided.Add(wait)
			} else if hasRA {
				next = decided.Add(ra)
			}
			// Past the horizon, counted from the first send, the
			// operation is reconciled, not sent: a later time means
			// nothing more, and a jar may not hold it. Nor may it hold
			// one past a century under a longer Horizon (keyjar stores
			// Unix nanoseconds, which end in 2262): a change it refuses
			// would leave the lease held and the Retry-After unknown.
			from := time.Now()
			if c.rec.Created.Before(from) {
				from = c.rec.Created
			}
			if limit := from.Add(min(c.policy.Horizon, maxNextAttempt)); next.After(limit) {
				next = limit
			}
			c.update(ctx, Change{NextAttempt: next, Release: true})
			why += reason(resp, err)
			c.giveUp(ctx, err, why, next)
			if resp != nil {
				stopped.Mark(resp, why) // for package client's *PendingError
				return resp, nil        // the last answer; the operation stays pending
			}
			return nil, c.pending(err, next, why)
		}
		// The server's Retry-After is recorded before the wait: a call
		// stopped during it (its context, the process) leaves it behind.
		c.rec.NextAttempt = time.Time{}
		if hasRA {
			c.rec.NextAttempt = decided.Add(ra)
		}
		c.update(ctx, Change{NextAttempt: c.rec.NextAttempt})
		end := decided.Add(wait)
		if pastDeadline(ctx, end) {
			// Nothing can be sent before the deadline (see sleepUntil):
			// the call stops now, and is no retry for the hooks and the
			// log to count.
			if resp != nil {
				c.resp = nil
				body.Drain(resp.Body)
			}
			if err, ok := c.abandonNeverConnected(ctx, context.DeadlineExceeded); ok {
				return nil, err
			}
			return nil, c.stopFor(ctx, context.DeadlineExceeded, "the next wait would end past the context's deadline")
		}
		e = c.event(0, err) // the attempt's own status: none after a network error
		if resp != nil {
			e.Status = resp.StatusCode
		}
		e.Wait, e.Reason = wait, reason(resp, err)
		fire(c.t.Hooks.OnRetry, e)
		c.log(ctx, slog.LevelInfo, "idem: retrying", e)
		if resp != nil {
			c.resp = nil
			body.Drain(resp.Body)
		}
		if err := sleepUntil(ctx, end); err != nil {
			if err, ok := c.abandonNeverConnected(ctx, err); ok {
				return nil, err
			}
			return nil, c.stop(ctx, err)
		}
	}
}

// pastDeadline reports whether a wait until end would end at or after
// ctx's deadline.
func pastDeadline(ctx context.Context, end time.Time) bool {
	dl, ok := ctx.Deadline()
	return ok && !end.Before(dl)
}

// sleepUntil sleeps until end, or until ctx is done, and returns ctx's
// error then. A wait that would end at or after ctx's deadline is not
// slept through: nothing can be sent before the deadline, so it returns at
// once the error the deadline ending the wait would give,
// context.DeadlineExceeded, and the call stops as it would then, rather
// than sleep until it. So does golang.org/x/time/rate's Limiter.Wait for a
// wait past the deadline, with an error of its own. (A cause given to
// context.WithDeadlineCause is not known until the deadline: it is not in
// the error.)
func sleepUntil(ctx context.Context, end time.Time) error {
	if pastDeadline(ctx, end) {
		return context.DeadlineExceeded
	}
	return retry.Sleep(ctx, time.Until(end))
}

// notOurs checks that the operation, as the jar just returned it, is still
// one this call may send: while the call waited for its lease, it may have
// been abandoned, even begun again under a new key by another call, marked
// for reconciliation by a holder with a shorter horizon, or, for a resume,
// settled by the holder it waited for or by anyone since Resume read it. In
// each case nothing may be sent.
func (c *call) notOurs() error {
	switch rec := c.rec; {
	case rec.Key != c.key || (!c.bodyless && !c.body.same(rec, c.req.Method)):
		return &MismatchError{Op: c.op, Key: rec.Key, Stored: rec.Fingerprint, Got: c.body.fp, GotKey: c.callerKey, State: rec.State}
	case rec.State == StateReconcile:
		return c.reconcileError(rec)
	case rec.State != StatePending && c.resuming:
		return &resume.StateError{Op: c.op, Key: c.key, State: string(rec.State)}
	case rec.State == StateAbandoned:
		return fmt.Errorf("idem: operation %q (key %q): %w while this call waited for its lease; nothing was sent", c.op, c.key, ErrAbandoned)
	}
	return nil
}

// releasing is the change that gives rec's lease back and leaves the rest
// of it as it is, but for the passwords its LastError quotes, masked as
// storedError masks them: an earlier version stored it as it was.
func releasing(rec Record, now time.Time) Change {
	return Change{Now: now, LastStatus: rec.LastStatus, LastError: dsn.MaskPasswords(rec.LastError), NextAttempt: rec.NextAttempt, Release: true}
}

// reconcileError is the error of a call that finds rec in StateReconcile.
func (c *call) reconcileError(rec Record) error {
	return &ReconcileError{Op: c.op, Key: c.key, Created: rec.Created, Horizon: c.policy.Horizon, at: time.Now(),
		Attempts: rec.Attempts, LastStatus: rec.LastStatus, State: rec.State}
}

// wait sleeps before trying to take a lease again, at most until the lease
// ends, within the call's budget. It reports false when the budget or the
// context (its deadline before the wait's end included) does not allow
// another try. Its record names the lease's holder and end (until), which
// an operator reads to tell a live process from one on another host or in
// another container whose lease is waited out.
func (c *call) wait(ctx context.Context, leaseLeft time.Duration, holder string, until time.Time) bool {
	wait, more, _ := c.sched.Next(0, false)
	if leaseLeft > 0 && (leaseLeft < wait || !more && leaseLeft <= c.policy.MaxElapsed-c.sched.Elapsed()) {
		// The lease ends at a known time: wait for it when the budget
		// allows, even where the next backoff interval would not fit.
		// A lease as long as the budget (both a minute by default)
		// would otherwise be given up on a few seconds before its end.
		wait, more = leaseLeft, true
	}
	if !more {
		return false
	}
	e := c.event(0, nil)
	e.Wait, e.Reason = wait, "operation leased by another holder"
	c.log(ctx, slog.LevelInfo, "idem: waiting for another holder's lease", e,
		slog.String("holder", holder), slog.Time("lease_until", until.UTC()))
	if err := sleepUntil(ctx, time.Now().Add(wait)); err != nil {
		c.lastErr = err
		return false
	}
	return true
}

// stop ends the call without a response, as its context ended: the
// operation stays pending.
func (c *call) stop(ctx context.Context, err error) error {
	return c.stopFor(ctx, err, "the call's context ended")
}

// stopFor is stop, giving why to OnGiveUp and the log.
func (c *call) stopFor(ctx context.Context, err error, why string) error {
	if err == nil {
		err = c.lastErr
	}
	c.rec.NextAttempt = upcoming(c.rec.NextAttempt)
	c.release(ctx)
	next := upcoming(c.rec.NextAttempt)
	c.giveUp(ctx, err, why, next)
	return c.pending(err, next, why)
}

// upcoming returns next, an operation's next attempt time, or the zero
// time when it has passed: the server's Retry-After that a longer backoff,
// or the attempt sent after it, outlived asks for no more wait, and a
// record, a *PendingError or OnGiveUp's Wait that gave it would tell the
// caller to wait until a time already past.
func upcoming(next time.Time) time.Time {
	if !next.After(time.Now()) {
		return time.Time{}
	}
	return next
}

// notSent ends the call whose attempt the base transport says it did not
// send (ErrNotSent): the attempt is given back, uncounted in the jar and
// its retry's cost to the Budget, and not retried. The operation keeps
// its state and last outcome, as stop leaves it; but one that no call can
// name (unnamed) and that was never sent is abandoned, durably: nothing of
// it happened, and a resume of every pending operation would send what
// its caller was told failed.
func (c *call) notSent(ctx context.Context, err error) error {
	c.attempts--
	c.unsent = true
	c.costDue = c.attempts > 0 && c.t.Budget != nil
	if c.unnamed() && c.created && c.attempts == 0 {
		if err, ok := c.abandonedUnsent(ctx, -1, err); ok {
			return err
		}
	}
	c.rec.NextAttempt = upcoming(c.rec.NextAttempt)
	c.release(ctx)
	c.giveUp(ctx, err, "not sent", time.Time{})
	return c.pending(err, upcoming(c.rec.NextAttempt), "not sent")
}

// abandonUnsent abandons, durably, the operation of a call that sent
// nothing of it, and whose first attempt Begin counted, when no call can
// name it (unnamed): nothing of it happened, and a resume of every pending
// operation would send what its caller was told failed. attempts is
// added to the record's count. It reports whether the jar took the
// change, which gives the lease back.
func (c *call) abandonUnsent(ctx context.Context, attempts int, why string) bool {
	_, err := c.t.Jar.Update(detach(ctx), c.op, c.holder, Change{Now: time.Now(), State: StateAbandoned,
		Attempts: attempts, Release: true, Note: "never sent: " + why})
	if err == nil {
		c.held, c.unsure = false, false
	}
	return err == nil
}

// abandonedUnsent abandons the operation as abandonUnsent does, for err,
// and reports it to OnGiveUp, the log and the caller: the error it returns
// wraps err, and is no *PendingError.
func (c *call) abandonedUnsent(ctx context.Context, attempts int, err error) (error, bool) {
	if !c.abandonUnsent(ctx, attempts, errorText(err)) {
		return nil, false
	}
	e := c.event(c.lastCode, err)
	e.Reason = "not sent"
	fire(c.t.Hooks.OnGiveUp, e)
	c.log(ctx, slog.LevelWarn, "idem: giving up; the operation, without a name and never sent, is abandoned", e)
	return fmt.Errorf("idem: operation %q (key %q): nothing was sent, and the operation, which no call can name, is abandoned: %w",
		c.op, c.key, err), true
}

// connectFailed reports whether err is a connection that could not be
// made, as net/http reports it before it writes anything of the request to
// the connection: a dial's error; through a proxy, the *net.OpError
// "proxyconnect" in which it wraps what failed as it dialled the proxy or
// set up TLS with it, or the "socks connect" of a SOCKS5 proxy that could
// not open the way to the host; or the server's certificate, which the
// client refused in the TLS handshake. It is not enough to tell that
// nothing was sent: net/http's Transport sends a request with an
// Idempotency-Key again, on a new connection, when the idle one it was
// written to closes before any answer (a server that crashed as it ran
// it), and reports only the new connection's error (see unread).
func connectFailed(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) && (oe.Op == "dial" || oe.Op == "proxyconnect" || oe.Op == "socks connect") {
		return true
	}
	var ce *tls.CertificateVerificationError
	return errors.As(err, &ce)
}

// unread reports whether the body rc of an attempt that failed to connect is
// whole: net/http read none of it, so it wrote the request to no
// connection. It cannot tell for a request without a body, an empty one,
// or one not in memory (as body.Len does not), and reports false; nor for
// one that expects 100-continue, whose header net/http writes before it
// reads the body, which it closes unread when the connection ends first.
func (c *call) unread(rc io.ReadCloser) bool {
	n, ok := body.Len(rc)
	return ok && n > 0 && n == c.body.size && !expectsContinue(c.req.Header)
}

// expectsContinue reports whether h has an Expect header that asks for
// 100-continue: net/http looks for the token under the canonical name
// (HTTP/1.1 in the first value, HTTP/2 in every one); any value under any
// spelling that holds the text counts here, the safe side.
func expectsContinue(h http.Header) bool {
	for name, vs := range h {
		if !strings.EqualFold(name, "Expect") {
			continue
		}
		for _, v := range vs {
			if strings.Contains(strings.ToLower(v), "100-continue") {
				return true
			}
		}
	}
	return false
}

// abandonNeverConnected abandons, as notSent does, an operation without a
// name, begun by this call, whose every attempt failed to connect: the
// call stops, and nothing of it reached the server. Pending, a resume of
// every pending operation would send it once the host answers, after its
// caller was told it failed (and may have sent it anew, under a new key).
func (c *call) abandonNeverConnected(ctx context.Context, err error) (error, bool) {
	if !c.unnamed() || !c.created || !c.neverConnected() {
		return nil, false
	}
	return c.abandonedUnsent(ctx, 0, err)
}

// neverConnected reports whether every attempt of the call failed to
// connect (a dial refused, a host name that does not exist, directly or
// to the proxy, a SOCKS5 proxy that could not reach the host, a server's
// certificate refused) through net/http's own Transport (Base, or
// package client's wrapper of one, which sends through it once), with its
// body unread, so that no byte of the request left: a base of another kind
// may have sent an attempt of its own before the error it returns.
func (c *call) neverConnected() bool {
	if c.reached {
		return false
	}
	return sendable.NetHTTP(c.t.base())
}

// unwind runs when the call ends. A retry it paid for but did not send
// (its context ended, or a lease it waited for, or a hook panicked) put no
// load on the server, and the Budget gets its cost back. When the call
// ends without returning, by a panic in a hook or the Logger (or
// runtime.Goexit), which goes on to the caller of RoundTrip as it is,
// unwind also gives back what it holds. The operation stays pending, as
// stop leaves it, or keeps the outcome recorded before the panic; the
// response in hand, which the caller never gets, is closed. An operation
// without a name whose first attempt was not sent is abandoned, as
// notSent does; so is one whose Base panicked in the code it runs before
// it sends (presend: package client's Options.Header), which sent nothing
// of that attempt.
func (c *call) unwind(ctx context.Context) {
	if c.costDue {
		c.t.Budget.Deposit(c.cost)
	}
	if c.returned {
		return
	}
	if c.attempts > 0 && !c.unsent && presend.Running(ctx) {
		// Base panicked in the code it runs before it sends (package
		// client's Options.Header): nothing of the attempt was sent, as
		// when its OnAttempt hook panics, and a retry's cost goes back.
		c.unsent = true
		c.costDue = c.attempts > 1 && c.t.Budget != nil
		if c.costDue {
			c.t.Budget.Deposit(c.cost)
		}
	}
	firstUnsent := c.created && (c.attempts == 0 || c.attempts == 1 && c.unsent)
	if c.mayHold() && !(firstUnsent && c.unnamed() && c.abandonUnsent(ctx, -1, "the call ended before its first send (a hook, the Logger or the code its Base runs before it sends panicked)")) {
		c.release(ctx)
	}
	if c.resp != nil {
		c.resp.Body.Close()
		c.resp = nil
	}
}

// release gives the lease back and leaves the operation pending, with an
// attempt that was counted but never sent uncounted: the first, which Begin
// counted, or one whose OnAttempt hook panicked. A call that holds no lease
// (see mayHold) writes nothing: the change, fenced by its holder id, would
// change nothing, but the jar would still have to write it, and a
// Deferrer's Close would wait for it (keyjar's, for another process's
// write lock, up to its BusyTimeout).
func (c *call) release(ctx context.Context) {
	if !c.mayHold() {
		return
	}
	if c.rec.Op == "" {
		// A resume whose Acquire failed without saying whether it was
		// made has not read the record: a release built from nothing
		// would clear its last outcome and the server's next attempt
		// time (a Change's zero values clear them). It is read first: a
		// lease held by another holder, or by none, is not this call's
		// to give back, and one it cannot read runs out on its own.
		r, err := c.t.Jar.Get(detach(ctx), c.op)
		if err != nil || r.Holder != c.holder {
			c.held, c.unsure = false, false
			return
		}
		c.rec, c.lastCode, c.lastErr = r, r.LastStatus, storedError(r)
	}
	ch := Change{Release: true, NextAttempt: c.rec.NextAttempt}
	if c.unsent || c.created && c.attempts == 0 {
		ch.Attempts = -1
	}
	c.update(ctx, ch)
}

// mayHold reports whether the operation's lease may be this call's: the
// jar gave it (held), or a Begin or an Acquire failed without saying
// whether it was made (unsure). Where neither, the call never took the
// lease (it stopped before it took it, or as it waited for another
// holder's, or for the jar's write lock), or the jar said another holder
// has it (Acquire's ErrLeased, an attempt's count refused with
// ErrLeaseLost), or the call gave it back.
func (c *call) mayHold() bool { return c.held || c.unsure }

// giveUp runs OnGiveUp and logs it; the event's Wait is how long until
// next, the operation's next attempt time, unless it is zero.
func (c *call) giveUp(ctx context.Context, err error, why string, next time.Time) {
	e := c.event(c.lastCode, err)
	e.Reason = why
	if !next.IsZero() {
		e.Wait = max(time.Until(next), 0) // a Retry-After of 0 asks for no wait
	}
	fire(c.t.Hooks.OnGiveUp, e)
	c.log(ctx, slog.LevelWarn, "idem: giving up; operation stays pending", e)
}

// reason names why an attempt is retried, for hooks and logs.
func reason(resp *http.Response, err error) string {
	switch {
	case err != nil:
		return "network error"
	case resp != nil:
		return "status " + strconv.Itoa(resp.StatusCode)
	}
	return ""
}

func (c *call) reconcile(ctx context.Context) error {
	ch, state := Change{Release: true}, c.rec.State
	if state == StatePending { // an outcome that is known stays known
		ch.State, ch.Note = StateReconcile, "first send older than the horizon, or ahead of this clock: ask the server what happened, then abandon or forget"
		state = StateReconcile
	}
	c.update(ctx, ch)
	e := c.event(c.lastCode, nil)
	fire(c.t.Hooks.OnReconcile, e)
	c.log(ctx, slog.LevelWarn, "idem: past the horizon; reconcile", e)
	return &ReconcileError{Op: c.op, Key: c.key, Created: c.rec.Created, Horizon: c.policy.Horizon, at: time.Now(),
		Attempts: c.rec.Attempts, LastStatus: c.lastCode, State: state}
}

// begin finds or creates the operation in the jar, durably, before the
// first send; for a resume, it leaves finding it to the run's Acquire.
func (c *call) begin(ctx context.Context) (err error) {
	now := time.Now()
	var op string
	c.key, c.resuming = resume.Key(ctx)
	if c.resuming || c.callerKey != "" {
		c.holder, err = NewHolder()
	} else {
		c.key, op, c.holder, err = newIDs(now)
	}
	if err != nil {
		return err
	}
	if c.resuming {
		c.bodyless = resume.BodyMissing(ctx)
		// A resume takes up the operation it found, under its key, and
		// never begins one: Begin would create a name forgotten since, or
		// replace one abandoned since, and send it under a new key. The
		// run's Acquire finds it under its lease, or fails.
		return nil
	}
	if c.callerKey != "" {
		c.key = c.callerKey
	}
	switch {
	case c.op != "": // named by WithOperation
	case c.callerKey != "":
		c.op = c.key // named by the caller's key
	default:
		c.op = op
	}
	r := Record{
		Op: c.op, Key: c.key, Fingerprint: c.body.fp, State: StatePending,
		Method: c.req.Method, URL: c.body.url, Header: storedHeader(c.req, secrethdr.AddsCredentials(c.req.Context())),
		Body: c.body.saved, BodySize: c.body.size,
		Created: now, Updated: now, Attempts: 1, // the first send follows at once
		Holder: c.holder, LeaseUntil: now.Add(c.t.lease(c.policy)),
	}
	rec, created, err := c.t.Jar.Begin(ctx, r)
	if err != nil {
		if ctxErr := retry.CtxErr(ctx); ctxErr != nil {
			// The caller's context ended, not the jar: nothing is sent, but
			// the record may be written all the same (a commit outlives
			// the wait for it). Give back its lease and the first attempt
			// it counts, fenced by this call's holder id: where Begin
			// wrote nothing, nothing changes; where the jar says it wrote
			// nothing (a write withdrawn: unwritten), nothing is written.
			c.rec, c.created, c.unsure = r, true, !unwritten.Is(err)
			return c.stopFor(ctx, ctxErr, "the call's context ended as the jar stored the operation, which it may not hold: nothing sent")
		}
		// Nothing is sent. The jar may have written the record all the
		// same (a commit whose answer was lost): it would stay pending,
		// leased to this call, and a resume would send what the caller
		// was told never went. So it is abandoned, fenced by this call's
		// holder id, which only a record this Begin wrote holds: where
		// Begin wrote nothing, nothing changes. (Under ctx: a jar that is
		// down may take as long again to fail.)
		_, _ = c.t.Jar.Update(ctx, c.op, c.holder, Change{Now: time.Now(), State: StateAbandoned,
			Attempts: -1, Release: true, Note: "the jar failed as it began the operation; nothing was sent"})
		return &JarError{Op: c.op, Err: err}
	}
	c.rec, c.created = rec, created
	if created {
		return nil
	}
	c.lastCode, c.lastErr = rec.LastStatus, storedError(rec)
	gotKey := c.callerKey
	if !c.body.same(rec, c.req.Method) || (gotKey != "" && gotKey != rec.Key) {
		err := &MismatchError{Op: c.op, Key: rec.Key, Stored: rec.Fingerprint, Got: c.body.fp, GotKey: gotKey, State: rec.State}
		if from := c.req.Response; from != nil && from.Request != nil {
			// An http.Client following a redirect sends the request again,
			// to another URL: a new name is not the fix its caller needs.
			err.redirect = fmt.Sprintf("%d redirect of %s %s", from.StatusCode, from.Request.Method, from.Request.URL.Redacted())
		}
		return err
	}
	// The same bytes under another media type: the reference server's
	// fingerprint counts it, and would refuse the request with 422, which
	// marks a pending operation failed although its first send may have
	// been applied. Refused here, nothing sent. (A record with no header
	// at all, from a Jar that does not keep one, says nothing of its type.)
	if rec.Header != nil {
		if st, gt := canon.MediaType(canon.ContentType(rec.Header)), canon.MediaType(canon.ContentType(c.req.Header)); st != gt {
			return &MismatchError{Op: c.op, Key: rec.Key, Stored: rec.Fingerprint, Got: c.body.fp, StoredType: st, GotType: gt, State: rec.State}
		}
	}
	c.key = rec.Key
	if rec.State == StateReconcile {
		return c.reconcileError(rec)
	}
	return nil
}

// storedHeader returns the request header as a record keeps it: without
// the values of credentials (SecretHeader: their names stay, with no
// values, for Record.Withheld) or the key, and with a Host entry when the
// request's Host is not its URL's (Record.NewRequest sets it back). A Host
// entry of the caller's, in any case ("host" too), is not kept: net/http
// takes the Host from Request.Host, and a resume would send the entry as
// an ordinary header (as HTTP/1.1 sends a "host" entry, not canonical, on
// the first send: a second Host line, which servers refuse; HTTP/2 drops
// it). With added (the request's context marked by secrethdr.MarkAdded:
// client.Options.Header adds credentials to each attempt), it holds
// AddedCredentials too. A header that needs none of this is returned as it is, not copied:
// a Jar copies what it keeps.
func storedHeader(req *http.Request, added bool) http.Header {
	h, host := req.Header, req.Host
	if host == req.URL.Host {
		host = ""
	}
	if host == "" && !added {
		clean := true
		for name := range h {
			if SecretHeader(name) || keyhdr.Is(name) || isHostHeader(name) {
				clean = false
				break
			}
		}
		if clean {
			return h
		}
	}
	h = secrethdr.Withhold(h)
	for name := range h {
		if keyhdr.Is(name) || isHostHeader(name) {
			delete(h, name)
		}
	}
	if host != "" {
		h[hostHeader] = []string{host}
	}
	if added {
		h[secrethdr.Added] = nil
	}
	return h
}

// hostHeader is the entry of a record's Header that holds the request's
// Host, when it is not its URL's.
const hostHeader = "Host"

// isHostHeader reports whether name is Host in any case.
func isHostHeader(name string) bool {
	return len(name) == len(hostHeader) && strings.EqualFold(name, hostHeader)
}

// send sends one attempt: a copy of the caller's request with the key and
// body, a fresh one.
func (c *call) send(ctx context.Context, rc io.ReadCloser) (*http.Response, error) {
	d := c.policy.AttemptTimeout
	if lease := c.t.lease(c.policy); d <= 0 || d > lease/2 {
		// The attempt may outlast its lease: renewed while it runs.
		k := c.keepLease(ctx, lease)
		defer k.stop()
	}
	if d <= 0 {
		// No timeout: the attempt needs no context of its own.
		return c.roundTrip(c.attempt(ctx, rc))
	}
	// The attempt timeout covers sending and the response headers, not
	// the caller's reading of the body: its timer stops once headers come.
	actx, cancel := context.WithCancel(ctx)
	var timedOut atomic.Bool
	timer := time.AfterFunc(d, func() { timedOut.Store(true); cancel() })
	handedOff := false // to the response's body, which cancels at EOF or Close
	defer func() {
		if !handedOff { // a Base that panicked too: not held for d
			timer.Stop()
			cancel()
		}
	}()
	resp, err := c.roundTrip(c.attempt(actx, rc))
	if err == nil {
		if timer.Stop() {
			if resp.Body == http.NoBody {
				cancel() // nothing to read, and NoBody stays itself, as callers compare it
			} else {
				resp.Body, handedOff = body.OnClose(resp.Body, cancel), true
			}
			return resp, nil
		}
		// The timer fired as the headers came: the attempt's context is
		// cancelled, and the body cannot be read. The attempt timed out;
		// it is sent again with the same key.
		resp.Body.Close()
		timedOut.Store(true)
		cancel()
		err = actx.Err()
	}
	timer.Stop()
	cancel()
	if timedOut.Load() && ctx.Err() == nil && !errors.Is(err, ErrNotSent) {
		// A Base that says it sent nothing (ErrNotSent: a token it could
		// not get in time) is taken at its word, as before the timeout:
		// neither counted nor retried.
		return nil, &attemptTimeoutError{d: d, err: err}
	}
	return nil, err
}

// roundTrip sends out through the base transport, holding it to the
// RoundTripper contract, as http.Client does: a response and an error
// together are the error (the response's body is closed), neither is an
// error, and a nil Body is http.NoBody. A response without a Request gets
// out, as net/http's Transport sets the request it sent: package client
// reads the key there. The error of the Proxy function of a Base that is
// an *http.Transport wraps ErrNotSent (sendable.ProxyRefused).
func (c *call) roundTrip(out *http.Request) (*http.Response, error) {
	base := c.t.base()
	resp, err := base.RoundTrip(out)
	if err != nil && sendable.ProxyRefused(base, out, err) {
		err = fmt.Errorf("%w: http.Transport's Proxy: %w", ErrNotSent, err)
	}
	switch {
	case err != nil && resp != nil:
		if resp.Body != nil {
			resp.Body.Close()
		}
		return nil, err
	case err == nil && resp == nil:
		return nil, fmt.Errorf("idem: %T.RoundTrip returned a nil *http.Response and a nil error", base)
	case err == nil && resp.Body == nil:
		resp.Body = http.NoBody
	}
	if err == nil && resp.Request == nil {
		resp.Request = out
	}
	return resp, err
}

// openBody produces the body of the next attempt, or nil for a request
// without one.
func (c *call) openBody() (io.ReadCloser, error) {
	if c.body.open == nil {
		return nil, nil
	}
	rc, err := getBody(c.body.open)
	if err != nil {
		return nil, err
	}
	n, ok := body.Len(rc)
	if !ok {
		if f, isFile := rc.(*os.File); isFile {
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
				// Left as it is, for net/http to send with sendfile over
				// HTTP/1.1 (a wrapper hides the file from it): its read
				// errors are *fs.PathErrors, which asBodyError tells.
				return rc, nil
			}
		}
		// A reader that may fail: its errors are told from the network's.
		return &sourceReader{rc}, nil
	}
	if n != c.body.size {
		// A reader GetBody gave before, read in part or whole: over HTTP/2
		// net/http would send what is left of it, under the key, as the
		// body of the declared length.
		rc.Close()
		return nil, fmt.Errorf("%w: GetBody gave a body with %d bytes left to read, the request's has %d; it must return a new reader on each call",
			ErrRequestBody, n, c.body.size)
	}
	return rc, nil
}

// sourceReader is an attempt's body read from GetBody's reader, not from
// memory: its read errors are bodyErrors, which the call tells from the
// network's. net/http reports them as it sends the body, over HTTP/1.1 in
// the *net.OpError of a write to the connection, which would retry.
type sourceReader struct{ io.ReadCloser }

func (r *sourceReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		err = &bodyError{err}
	}
	return n, err
}

// bodyError is an error of reading the request's body for an attempt: it
// matches ErrRequestBody.
type bodyError struct{ err error }

func (e *bodyError) Error() string   { return ErrRequestBody.Error() + ": " + e.err.Error() }
func (e *bodyError) Unwrap() []error { return []error{ErrRequestBody, e.err} }

// asBodyError returns the bodyError in err's tree, or one of the failure
// to read a file there (an attempt's body, a regular file passed on
// unwrapped): a read's *fs.PathError, which the network has none of, or a
// sendfile that failed on its file's side (EIO, EBADF), where it fails on
// the connection's with EPIPE or ECONNRESET; or nil. (Its variables, which
// errors.As takes the address of, are on the heap: only a failed attempt
// pays for them.)
func asBodyError(err error) *bodyError {
	var be *bodyError
	if errors.As(err, &be) {
		return be
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "read" {
		return &bodyError{pe}
	}
	var se *os.SyscallError
	if errors.As(err, &se) && se.Syscall == "sendfile" && (errors.Is(se.Err, syscall.EIO) || errors.Is(se.Err, syscall.EBADF)) {
		return &bodyError{se}
	}
	return nil
}

// attempt returns the request of one attempt, with ctx and the body rc: a
// shallow copy of the caller's with a Header of its own that carries the
// key. The copy shares the caller's URL and header values, which nothing
// on the way writes to; each value is clipped, so that an Add by a base
// transport copies it rather than write past its end. (req.Clone would
// copy them all: four more allocations per attempt, and a map that grows
// for the key.)
func (c *call) attempt(ctx context.Context, rc io.ReadCloser) *http.Request {
	out := c.req.WithContext(ctx)
	h := make(http.Header, len(c.req.Header)+1)
	for k, v := range c.req.Header {
		if !keyhdr.Is(k) {
			h[k] = v[:len(v):len(v)]
		}
	}
	h[KeyHeader] = []string{c.key}
	out.Header = h
	if rc != nil {
		out.Body, out.GetBody, out.ContentLength = rc, c.body.open, c.body.size
		if len(c.req.Trailer) > 0 {
			out.ContentLength = -1 // net/http sends trailers after a chunked body only
		}
	}
	return out
}

// attemptTimeoutError is an attempt that ran out of Policy.AttemptTimeout:
// a net.Error with Timeout true, so that retry.Classify retries it. It does
// not unwrap to the context.Canceled that ended the attempt, which would
// read as the caller's cancellation.
type attemptTimeoutError struct {
	d   time.Duration
	err error
}

func (e *attemptTimeoutError) Error() string {
	if errors.Is(e.err, context.Canceled) {
		// The timer's own cancel, as net/http reports it: saying it
		// would read as the caller's cancellation.
		return fmt.Sprintf("idem: attempt timed out after %v", e.d)
	}
	return fmt.Sprintf("idem: attempt timed out after %v: %v", e.d, e.err)
}
func (e *attemptTimeoutError) Timeout() bool   { return true }
func (e *attemptTimeoutError) Temporary() bool { return true }
