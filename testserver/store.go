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
	Status int         // the status the handler wrote
	Header http.Header // only the replay-safe headers (see ReplayHeaders), and a HEAD's Content-Length
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
	// Token is the fencing token: locked_at, in Unix nanoseconds, of the
	// worker that holds the claim, less a random part of a millisecond
	// (see Claim.Token). Every write after the claim is conditioned on it.
	Token    int64
	Response *Response // nil while in flight
	Created  time.Time
}

// LockedAt returns the time the claim was taken, from its token: up to a
// millisecond early.
func (e Entry) LockedAt() time.Time { return time.Unix(0, e.Token) }

// Store persists keys for the Middleware. Every method must be safe for
// concurrent use by many goroutines and, for shared storage, by many server
// processes; each is atomic: one statement, or one transaction (sqlitestore's
// Claim reads back the entry its INSERT met), never a SELECT-then-INSERT.
//
// Conformance: testserver/storetest runs the same cases against every Store.
type Store interface {
	// Claim inserts an in-flight entry for (scope, key) with the given
	// fingerprint and token, created at now, if none exists
	// (INSERT … ON CONFLICT DO NOTHING). claimed reports whether this call
	// inserted it, durably; when it did not, Claim returns the existing
	// entry. When err is not nil, claimed is false and e is the zero Entry,
	// whatever step failed (the commit included): a caller never runs the
	// operation on a claim the store could not confirm. A claim that was
	// made nonetheless (the store lost the answer, or the caller hung up
	// while the store wrote) is released by the Middleware at once, fenced
	// by token; when that fails too, it stays in flight, and is taken over
	// once its token is older than the lock timeout.
	Claim(ctx context.Context, scope, key, fingerprint string, token int64, now time.Time) (e Entry, claimed bool, err error)

	// TakeOver replaces the token of an in-flight entry by compare-and-set:
	// it succeeds only if the entry is still in flight with token old. Of
	// many concurrent callers with the same old token, exactly one wins.
	// The caller chooses a new token greater than old. A take-over that
	// failed may have been made all the same: the Middleware leaves it in
	// flight, to be taken over again once stale, and never releases it,
	// which would let the retry run the handler without Claim.TakenOver.
	TakeOver(ctx context.Context, scope, key string, old, new int64) (bool, error)

	// Save marks the entry done with resp, fenced: only if it is in flight
	// with token. Otherwise nothing changes and Save returns ErrFenced. It
	// must save a body as large as the Middleware's MaxSavedResponse, up to
	// MaxSavedResponseLimit: a Save that fails leaves the key in flight.
	Save(ctx context.Context, scope, key string, token int64, resp Response) error

	// Release deletes the entry, fenced: only if it is in flight with token.
	// It reports whether it deleted it; false means someone took over, and
	// the entry is left alone.
	Release(ctx context.Context, scope, key string, token int64) (bool, error)

	// Prune deletes at most limit entries created before before, done or
	// abandoned in flight, and returns how many it deleted. An in-flight
	// entry is abandoned when its token, too, is older than before: a
	// claim taken over since is in use, and stays. A limit <= 0 deletes
	// nothing (unlike the client's jars, where it means no limit: a store
	// is pruned in bounded batches, see Middleware.Prune).
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// ErrFenced is returned by Store.Save when the caller's token no longer
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
