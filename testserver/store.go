package testserver

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Status is the state of a key on the server.
type Status string

const (
	// StatusInFlight: a worker claimed the key and runs the handler.
	StatusInFlight Status = "in_flight"
	// StatusDone: the first answer is saved and is replayed.
	StatusDone Status = "done"
)

// Response is a saved answer: replayed byte for byte to every retry.
type Response struct {
	Status int // the status the handler wrote
	// Header holds only the replay-safe headers (see ReplayHeaders), and
	// a HEAD's Content-Length. A ProblemResponseTooLarge marker saved
	// before its answer streamed also holds Idempotent-Streamed-By, a
	// random ID of the Middleware that streams it, which is never
	// replayed: while the handler may run, a retry is answered 409
	// instead of the marker (see Middleware.MaxSavedResponse).
	Header http.Header
	// Body is the body the handler wrote, whole. A Store reads an empty
	// body back as nil, whether it was saved nil or empty.
	Body []byte
}

// Entry is one row of the idempotency_keys table.
type Entry struct {
	Scope       string // the tenant; keys of two scopes never meet
	Key         string // the Idempotency-Key, as the client sent it
	Fingerprint string // of the request that claimed the key (see Fingerprint)
	Status      Status
	// Fence is the claim's, in flight, or the last one's, done (its
	// columns locked_at and claim_id). Every write after the claim is
	// conditioned on it.
	Fence
	Response *Response // nil while in flight
	Created  time.Time
}

// Fence is what fences the writes of one claim: Store.Save, Store.Release
// and Store.TakeOver change an entry only while it is in flight with the
// caller's Fence, both fields equal.
type Fence struct {
	// Token is the time the claim was taken, in Unix nanoseconds of
	// Middleware.Now (see Claim.Token): the claim's age, and its place
	// among the claims of its key (a take-over's is greater than the one
	// it took over). Claims whose clocks read alike hold the same Token.
	Token int64
	// ClaimID is the claim's own: random (crypto/rand.Text, 130 bits), so
	// that no two claims, on one server or many, hold one Fence, however
	// their clocks read. A claim made by an earlier version of a store,
	// which kept no ID, has the empty one.
	ClaimID string
}

// LockedAt returns the time the claim was taken, from its token.
func (e Entry) LockedAt() time.Time { return time.Unix(0, e.Token) }

// Store persists keys for the Middleware. Every method must be safe for
// concurrent use by many goroutines and, for shared storage, by many server
// processes; each is atomic: one statement, or one transaction (sqlitestore's
// Claim reads back the entry its INSERT met), never a SELECT-then-INSERT.
//
// Conformance: testserver/storetest runs the same cases against every Store.
type Store interface {
	// Claim inserts an in-flight entry for (scope, key) with the given
	// fingerprint and fence, created at now, if none exists
	// (INSERT … ON CONFLICT DO NOTHING). claimed reports whether this call
	// inserted it, durably; when it did not, Claim returns the existing
	// entry. When err is not nil, claimed is false and e is the zero Entry,
	// whatever step failed (the commit included): a caller never runs the
	// operation on a claim the store could not confirm. A claim that was
	// made nonetheless (the store lost the answer, or the caller hung up
	// while the store wrote) is released by the Middleware at once, fenced
	// by its fence, whose ClaimID no other claim holds; when that fails
	// too, it stays in flight, and is taken over once its token is older
	// than the lock timeout.
	Claim(ctx context.Context, scope, key, fingerprint string, f Fence, now time.Time) (e Entry, claimed bool, err error)

	// TakeOver replaces the fence of an in-flight entry by compare-and-set:
	// it succeeds only if the entry is still in flight with fence old. Of
	// many concurrent callers with the same old fence, exactly one wins.
	// The caller chooses a new fence, its token greater than old's and its
	// ClaimID its own. A take-over that
	// failed may have been made all the same: the Middleware leaves it in
	// flight, to be taken over again once stale, and never releases it,
	// which would let the retry run the handler without Claim.TakenOver.
	TakeOver(ctx context.Context, scope, key string, old, new Fence) (bool, error)

	// Save marks the entry done with resp, fenced: only if it is in flight
	// with f. Otherwise nothing changes and Save returns ErrFenced. It
	// must save a body as large as the Middleware's MaxSavedResponse, up to
	// MaxSavedResponseLimit: a Save that fails leaves the key in flight.
	Save(ctx context.Context, scope, key string, f Fence, resp Response) error

	// Release deletes the entry, fenced: only if it is in flight with f.
	// It reports whether it deleted it; false means someone took over (or
	// the claim is another's), and the entry is left alone.
	Release(ctx context.Context, scope, key string, f Fence) (bool, error)

	// Prune deletes at most limit entries created before before, done or
	// abandoned in flight, and returns how many it deleted. An in-flight
	// entry is abandoned when its token, too, is older than before: a
	// claim taken over since is in use, and stays. A limit <= 0 deletes
	// nothing (unlike the client's jars, where it means no limit: a store
	// is pruned in bounded batches, see Middleware.Prune).
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// ErrFenced is returned by Store.Save when the caller's fence no longer
// holds the claim: another worker took over, and the late write was refused.
var ErrFenced = errors.New("testserver: write fenced: the claim was taken over")

// ErrNoStore is the error of Middleware.Prune when the Middleware's Store
// is nil, and the one logged when a protected request is refused for that
// reason (503 ProblemStoreUnavailable).
var ErrNoStore = errors.New("testserver: Middleware.Store is nil")

// ErrOptions is the error of Middleware.Prune when a Middleware field is
// out of range (a negative LockTimeout or PruneBatch, a LockTimeout not
// below Retention, an OnError that is neither ReleaseClaim nor SaveError),
// and the one logged when a protected request is refused for that reason
// (503 ProblemStoreUnavailable), as for ErrNoStore.
var ErrOptions = errors.New("testserver: invalid Middleware options")
