package testserver

import "context"

// Claim is what the Middleware holds for the request whose handler it
// runs. The handler's request carries it in its context; ClaimFrom reads
// it back.
type Claim struct {
	// Scope is the request's scope: what Middleware.Scope (by default
	// CredentialScope) returned for it.
	Scope string

	// Key is the request's Idempotency-Key as ParseKey returns it: a
	// quoted key unquoted. With Scope it names the operation: when a
	// handler writes it with its own row, under a UNIQUE constraint on
	// (scope, key), a second run finds the first run's row there instead
	// of adding one; a handler that calls a service downstream can derive
	// the key it sends there from it.
	Key string

	// Token is the fencing token of this run's claim: the time the claim
	// was taken, in Unix nanoseconds of Middleware.Now (Fence.Token).
	// Requests whose clocks read alike hold the same token, on one server
	// or many. The Middleware's own writes after the handler, Store.Save
	// and Store.Release, change the key only while it still holds this
	// token and the claim's random ID (Fence.ClaimID), which is this run's
	// alone. A handler fences its own writes by the token: it stores the
	// token with what it writes, and changes a row only while the token
	// stored there is not greater than its own (and, to tell its own rows
	// from those of a run whose token equals its own, stores ClaimID with
	// it). A run that takes a stale
	// claim over gets a token greater than the one it took over, so that
	// the run it took over, waking late, cannot overwrite what its
	// successor wrote; the Middleware then answers that run's caller 409
	// (ProblemTakenOver) in its place, unless the answer was streamed
	// already (see MaxSavedResponse). A claim made afresh after a release
	// takes its token from the clock again, which may be behind the
	// released run's or equal to it (a clock stepped back, another
	// server's running behind, a coarse one): a handler whose write is
	// refused answers 503, so that, under ReleaseClaim, the claim is
	// released and the caller's retry comes back with a later token.
	Token int64

	// ClaimID is the claim's random ID (Fence.ClaimID): this run's alone,
	// on one server or many, where Token may be another run's too (a claim
	// made afresh after a release, on a clock that reads as the released
	// run's did). A handler that stores it with the token changes a row
	// only while the token stored there is less than its own, or equal to
	// it with its own ClaimID, as the Middleware's Save and Release do.
	ClaimID string

	// TakenOver reports that this run took the key over from a stale
	// claim: an earlier run with the same key neither saved nor released
	// it within LockTimeout, because its server died or because it is
	// still running past its lease (its later writes through the
	// Middleware are fenced). That run may have done part of the work,
	// or all of it. The handler reconciles before acting: it looks up
	// what was done under Key (its own rows, or the service it called
	// downstream with a key of its own) and finishes that, instead of
	// doing the work a second time. TakenOver is false for a first
	// claim, including one made after an earlier run failed and its
	// claim was released (ReleaseClaim): that run, too, may have done
	// part of the work, which is why ReleaseClaim is safe only for work
	// that is idempotent downstream.
	TakenOver bool
}

type claimKey struct{}

// ClaimFrom returns the Claim under which the Middleware runs the handler
// of the request whose context is ctx, or false when ctx is not such a
// handler's: outside the Middleware, and in a handler it passes a request
// through to unprotected (a method it does not protect, or a request
// without a key when Optional). The Middleware answers replays, 409s,
// 422s and its other refusals itself, without running the handler.
func ClaimFrom(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}
