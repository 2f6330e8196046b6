package testserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/canon"
	"github.com/idemkit/idem/internal/keyhdr"
	"github.com/idemkit/idem/internal/secrethdr"
)

// Defaults and floors of the Middleware's settings.
const (
	DefaultLockTimeout      = 60 * time.Second
	DefaultRetention        = 25 * time.Hour
	MinRetention            = 24 * time.Hour
	DefaultMaxBody          = 1 << 20
	DefaultMaxSavedResponse = 1 << 20
	DefaultPruneBatch       = 1000

	// MaxSavedResponseLimit is the largest MaxSavedResponse honoured: a
	// larger one means this. A saved body is one value of one row, and the
	// stores of this module hold no larger: SQLite refuses a row above 1e9
	// bytes (its default SQLITE_MAX_LENGTH), PostgreSQL a message or a
	// value above 1 GiB. The limit leaves 1 MiB of such a row to the
	// entry's other columns, its headers among them. A larger body would
	// fail the Save and leave the key in flight until LockTimeout, after
	// which a retry would run the operation again; above the limit, the
	// too-large marker is saved instead. The limit is one of size only: a
	// save of hundreds of megabytes also takes seconds, and may outlast the
	// 10 s the Middleware gives a save or a store's own timeout.
	MaxSavedResponseLimit = 1_000_000_000 - 1<<20

	// storeWriteTimeout bounds the save or release that follows a handler.
	// It runs on a context detached from the request, so that a client
	// that hangs up does not leave the claim in flight.
	storeWriteTimeout = 10 * time.Second
	// maxSaves bounds the tries of one save (Middleware.save), which
	// storeWriteTimeout bounds too.
	maxSaves = 8
	// maxDecisions bounds how often one request re-reads the key after
	// losing a take-over race before it answers 409.
	maxDecisions = 3
	// maxPruneBatches bounds one call of Middleware.Prune.
	maxPruneBatches = 10000
)

// ErrorPolicy is what the Middleware does with a claim when its handler
// fails: answers a status of 500 or more, panics or calls runtime.Goexit,
// sends a body shorter than the Content-Length it set, or returns without answering anything
// once its lease ended (answered 503 ProblemLeaseEnded); or when it answers
// 429 Too Many Requests, which asks the caller to send the same request
// again later, 408 Request Timeout, which says the request did not
// arrive whole in time, or 425 Too Early, which says the handler did not
// process a request that came in TLS early data (RFC 8470; idem.Transport
// sends each again, with the same key): saved, that answer would be
// replayed to every retry.
type ErrorPolicy int

const (
	// ReleaseClaim deletes the claim (fenced) and sends the error to the
	// caller without saving it, so the caller's retry runs the handler
	// again. It is safe only when the handler's effects are idempotent
	// downstream: the reference payments server passes its own key,
	// charge:<order_id>, to PayCo, so a second run cannot charge twice. If a
	// second run could repeat a side effect, use SaveError.
	ReleaseClaim ErrorPolicy = iota
	// SaveError saves the failed answer like any other and replays it to
	// every retry, as Stripe does with 500s. It is safe against a second
	// execution, at the cost that a transient failure becomes permanent
	// for that key: the caller must reconcile and use a new key. Safe as
	// long as the store saves: an answer whose Save fails (the database
	// down), tried up to 8 times within 10 s, leaves the claim in flight, and a retry after LockTimeout takes
	// it over and runs the handler again, with Claim.TakenOver set, under
	// either policy.
	// Under SaveError a handler should not answer 408, 425, 429, 502, 503 or 504 for
	// a failure it expects to clear, since the replay repeats it.
	SaveError
)

func (p ErrorPolicy) String() string {
	switch p {
	case ReleaseClaim:
		return "release"
	case SaveError:
		return "save"
	}
	return fmt.Sprintf("ErrorPolicy(%d)", int(p))
}

// Middleware makes non-idempotent requests safe to retry: a request that
// carries an Idempotency-Key is run at most once per scope and key, and
// every retry gets the first answer. It implements this decision table:
//
//	state of (scope, key)          action                                   answer
//	none: Claim wins               run the handler, save its answer fenced  the handler's
//	fingerprint differs            nothing runs, nothing is replayed        422 problem
//	done, same fingerprint         replay status, ReplayHeaders and body    the first answer
//	in flight, lock younger        nothing runs; Retry-After = the claim's  409 problem
//	  than LockTimeout               age (≥ 1 s), at most the lease left
//	in flight, lock stale          TakeOver by compare-and-set; the one     the handler's
//	                               winner runs the handler
//
// A replay carries Idempotent-Replayed: true. Every answer of the Middleware
// itself is application/problem+json with one of the Problem* types.
//
// The handler's answer is recorded, saved, and only then sent, so a caller
// never sees an answer that a retry would not get again. Its header is the
// one the handler had set when it called WriteHeader or first wrote, as
// net/http sends it: a change after that reaches neither the first caller
// nor a replay, but for the values of trailers declared by then. A second
// WriteHeader changes nothing, and is logged as net/http logs it (Logger).
// Only an informational answer (1xx), such as 103 Early Hints, goes to the
// first caller at once, as net/http sends it, and is neither saved nor replayed:
// a replay sends the saved final answer only. A 101 Switching Protocols is
// dropped (the connection cannot be hijacked), and so is a 100 Continue:
// the body was read, and net/http sent its own 100 Continue if the client
// asked for one, before the handler ran. The handler's writer is an
// http.Flusher for streaming handlers, but a Flush sends nothing until the
// answer outgrows MaxSavedResponse and is streamed; from then on, an
// http.ResponseController's Flush returns the connection's error (a caller
// that left), as net/http's does. It is also an http.CloseNotifier, as
// net/http's is, whose channel receives when the handler's context ends,
// with its lease. Through
// it an http.ResponseController sets the connection's deadlines, but cannot
// hijack it nor enable full duplex (http.ErrNotSupported). Saving and
// releasing are fenced by the claim's token and ID (Fence): a worker that
// stalled past its lease and was taken over cannot overwrite the new
// owner's answer nor delete its claim. Such a worker's caller gets 409
// (ProblemTakenOver) and its retry gets the new owner's saved answer. A
// store error on the save after the handler ran is logged and the
// handler's answer is sent; the claim stays in flight until LockTimeout,
// after which a retry takes it over.
//
// The handler's request has a fresh body holding the bytes read (but
// http.NoBody for a request without one, and the ContentLength the request
// declared, -1 for a body sent chunked, as net/http gives them), and a
// context cancelled when the claim's lease ends, LockTimeout after the
// claim was taken, so that a handler that honours its context cannot
// outlive its claim. A handler that returns once its context ended without
// answering anything, no status and no body, as one that honours its
// context does, failed: where net/http would send an empty 200, which would
// be saved and replayed as a success, its caller gets 503
// ProblemLeaseEnded, and OnError releases the claim or saves that 503. A
// handler that answers or returns after its lease ended is saved as it
// answered (once it returned), and logged at Warn with LockTimeout, too
// short for its run; one that means an
// empty 200 writes it (WriteHeader). The save or the
// release that follows the handler gets at most 10 s, on a context that the
// caller hanging up does not end either: a server that stops gracefully
// waits LockTimeout and those 10 s for its requests in flight. A claim that
// took the store longer than LockTimeout is released without running the
// handler (503); a take-over is left in flight, stale, for the retry to
// take over with Claim.TakenOver set. The answer saved is the one the handler returns with: put
// http.TimeoutHandler, and any handler that answers before the work it
// started ends, outside Wrap, never inside. Inside, its early 503 would
// release the claim (ReleaseClaim) or be saved (SaveError) while the work
// goes on, and a retry would run the work again, or be told it failed.
//
// The handler reads its claim from its request's context with ClaimFrom:
// the key, its scope, the fencing token of the run, and whether the run
// took a stale claim over.
//
// A Middleware is safe for concurrent use. Set its fields before the first
// request and do not change or copy it afterwards. The zero value with a
// Store set is ready to use; with a nil Store, or a field out of range (a
// negative LockTimeout or PruneBatch, a LockTimeout not below Retention,
// an OnError that is neither policy: ErrOptions), every protected request
// answers 503.
type Middleware struct {
	// Store holds the keys. Nil makes every protected request fail closed
	// with 503, and Prune return ErrNoStore.
	Store Store

	// Methods are the request methods that carry a key. Nil means POST and
	// PATCH. Names match in any case, as idem.Transport matches them when it
	// keys a request: a "post" is protected, since an idem client sends it
	// again under its key. Requests with other methods pass through
	// untouched.
	Methods []string

	// Optional lets a request of a protected method without an
	// Idempotency-Key through to the handler, unprotected. False (the
	// default) answers 400 ProblemKeyMissing. An invalid key is refused
	// either way.
	Optional bool

	// Scope names the key space of a request (the tenant): keys of two
	// scopes never meet. Nil means CredentialScope, a hash of the
	// Authorization header. That suits credentials that stay the same
	// across a client's retries (an API key), and only those sent in
	// Authorization: requests that authenticate otherwise (a cookie, an
	// X-API-Key header) all share the anonymous scope, and a retry under a
	// new credential (an access token refreshed meanwhile) is a new
	// operation that runs again. A server with such credentials sets
	// Scope to the account the request authenticates as. A scope is
	// stored in the key's row: keep it short, valid UTF-8 without NUL, or
	// hash it as CredentialScope does; pgstore refuses a scope of more
	// than about 2.7 kB, or one with a NUL or invalid UTF-8, and every
	// request in it then fails with 503.
	//
	// Scope is called with the request as Wrap receives it, before the
	// handler runs. A middleware that authenticates the request and puts
	// its account in the context therefore goes outside Wrap,
	// auth(mw.Wrap(h)), never inside: there Scope would find no account,
	// every tenant would share one scope, and a request with a key that
	// another tenant used would get that tenant's answer replayed; and
	// a request it refuses (401) would be claimed and its refusal saved,
	// then replayed to the retry that brings valid credentials.
	Scope func(*http.Request) string

	// LockTimeout is how long a claim is honoured before another request
	// may take it over. It must outlast every honest run of the handler:
	// the request deadline plus the downstream timeout, or live workers
	// are taken over by design; servers that share a Store also need
	// clocks that agree to well within it, since a claim's age is read
	// against the clock of the server that took it (one running D ahead
	// takes claims over D early). A claim whose token is ahead of the
	// reader's clock (its taker's ran ahead) is not young for the whole
	// skew: the reader counts its age from when it first read it, and
	// takes it over LockTimeout after that. Zero means DefaultLockTimeout (60 s); a
	// negative one, or one not below Retention (Prune would delete the
	// claim of a handler still running), is refused as Store nil is, with
	// ErrOptions. The
	// handler's context ends with the claim's lease, which is the only
	// bound the reference server puts on its handler.
	LockTimeout time.Duration

	// Retention is how long a key is kept after its creation; Prune
	// deletes older ones. It must exceed the clients' retry horizon, or a
	// late retry becomes a new operation. Zero means DefaultRetention
	// (25 h): the SDK's 24 h horizon, counted on the client's clock from
	// before the first send, and an hour for clocks that disagree and a
	// retry sent at the horizon's last instant. Anything below
	// MinRetention (24 h) means MinRetention.
	Retention time.Duration

	// PruneBatch is the most entries one statement of Prune deletes.
	// Zero means DefaultPruneBatch; a negative one is refused as Store nil
	// is, with ErrOptions.
	PruneBatch int

	// MaxBody is the largest request body read, in bytes; a larger one is
	// refused with 413 before anything is claimed. Zero or negative means
	// DefaultMaxBody (1 MiB).
	MaxBody int64

	// MaxSavedResponse is the largest response body saved for replay, in
	// bytes. Zero or negative means DefaultMaxSavedResponse (1 MiB); more
	// than MaxSavedResponseLimit (1e9 bytes less 1 MiB) means that. A
	// larger answer is sent to its caller as it is written (memory stays
	// bounded), and the key is saved done with a 500 ProblemResponseTooLarge
	// marker that names the original status and Location, before the first
	// byte streams (a failure's, under ReleaseClaim, is released once the
	// handler returns instead). A retry while the handler still runs is
	// answered 409 ProblemInFlight, as for a claim in flight: the handler
	// may yet fail, or go on. A Middleware that shares the store with the
	// one running the handler cannot tell when it returns, and answers 409
	// until the claim's lease has ended (LockTimeout after the claim);
	// once the handler returned (on the Middleware that runs it) or its
	// lease ended, retries get the marker, a caller that reads the answer
	// slowly holding its handler in Write past the lease included. The
	// operation does not run twice (unless that Save fails, see
	// SaveError), and the caller is told to look the result up instead.
	// The answer to a HEAD (with HEAD in
	// Methods) is never too large: net/http sends none of its body, so a
	// body past the limit is dropped, and the status and header are saved
	// and replayed, the Content-Length the handler set included. (When it
	// set none, net/http computes one for a body that fits its buffer, 2
	// KiB over HTTP/1.1; for a dropped body there is none, where a limit
	// below that size could have kept one: a HEAD's Content-Length is
	// optional, and copying net/http's buffer sizes would tie the
	// Middleware to them.)
	MaxSavedResponse int64

	// ReplayHeaders are the response headers saved and replayed. Nil means
	// Content-Type, Content-Encoding, Content-Language, Content-Location,
	// Location, ETag, Last-Modified, Cache-Control, Expires, Link, Vary,
	// Content-Range and Allow, which a 206 and a 405 must carry, and
	// Content-Disposition and X-Content-Type-Options, which tell a browser
	// how to treat the body (nosniff, attachment) as the first answer did.
	// The CORS headers (Access-Control-*) are not among them: they answer
	// the Origin of each request, and a replay is another request, perhaps
	// from another origin. Set them in a middleware outside Wrap, which
	// answers the replay as it answers the first request (set inside, by the
	// handler, they reach the first caller only); listed here, the first
	// request's replace the replay's own. The
	// answer to a HEAD also saves and replays the Content-Length its
	// handler set, which net/http sends as it is, the length of the GET's
	// body, whatever body the handler wrote.
	// Set-Cookie and credential headers (the authentication headers of RFC
	// 9110 and those idem.SecretHeader names, such as X-Auth-Token or
	// X-Api-Key) are never saved, even when listed. Trailers are sent to
	// the first caller, as trailers, and never saved.
	ReplayHeaders []string

	// OnError is what happens to the claim when the handler answers 500 or
	// more, 429, 408 or 425, panics (or calls runtime.Goexit, as t.FailNow
	// does), sends a body shorter than the Content-Length it
	// set, or returns without answering anything once its lease ended
	// (answered 503 ProblemLeaseEnded, logged at Warn). The zero value is
	// ReleaseClaim; a value that is neither policy is refused as Store nil is,
	// with ErrOptions. A panic is recovered, logged with its stack as Logger
	// says, and answered with a 500 ProblemHandlerFailed, which SaveError
	// saves. A panic with http.ErrAbortHandler (logged at Info: net/http does
	// not log it) and a short body (which net/http breaks off) abort the
	// connection instead, and the claim is released, or that 500 saved, all
	// the same: a retry never gets the short body. A panic or a short body
	// after part of an answer larger than MaxSavedResponse was sent cannot
	// change that answer: its ProblemResponseTooLarge marker is saved, naming
	// the status sent, and the connection is aborted (http.ErrAbortHandler).
	OnError ErrorPolicy

	// Now returns the current time. Nil means time.Now. Claim tokens,
	// lease ages and retention are measured with it. A reading that a
	// token, Unix nanoseconds in an int64, cannot hold (before 1678 or
	// after 2262: the zero time.Time of a Now not set up) fails closed: the
	// request is refused with 503 (ProblemStoreUnavailable), and Prune
	// with ErrOptions, rather than take a running claim for a stale one.
	Now func() time.Time

	// Logger receives one record per decision (a request refused for its
	// body, too large or unreadable, with its key), the error of a request
	// body that could not be read (the body-unreadable answer does not
	// name it), a handler's panic with its stack, and, at Warn, each
	// superfluous WriteHeader call of a handler (one after its status was
	// set, which changes nothing), naming its caller. Nil means silent
	// but for a panic, which is logged with its stack as net/http logs
	// one, and a superfluous WriteHeader call, logged in net/http's words:
	// to the ErrorLog of the request's http.Server, or to the log
	// package's standard logger.
	//
	// A Logger that panics (slog's own handlers do not, even for a value
	// whose String or LogValue panics) ends the request with its panic, as
	// a handler's panic ends one under net/http: nothing is answered, and
	// the server logs the panic and closes the connection. The key stays
	// as it was at that record. A record before the handler runs (of the
	// claim or a take-over) leaves it in flight until LockTimeout, after
	// which a retry takes it over and runs the handler. Every record after
	// the handler ran (its panic, abort or short body, an answer too large,
	// the save, the release or their failure) comes once the answer is
	// saved or the claim released, so that a Logger's panic cannot run the
	// handler twice under SaveError. No answer is saved that the handler
	// did not give. After an answer the Middleware aborts, the abort's
	// http.ErrAbortHandler replaces the Logger's panic, and net/http logs
	// neither.
	Logger *slog.Logger

	stats   counters
	ahead   aheadClaims
	streams streams
}

// Stats are the Middleware's counters since it was created, for operators.
type Stats struct {
	Claims      int64 // keys claimed: first runs of the handler (a claim or take-over that took longer than LockTimeout runs nothing, and is a store error)
	Takeovers   int64 // stale claims taken over: runs after a worker went silent
	Replays     int64 // saved answers replayed
	Conflicts   int64 // 409: the key was in flight
	Mismatches  int64 // 422: the key was reused with another request
	Fenced      int64 // late saves or releases refused because another worker took over
	Released    int64 // claims released after a handler error, a lease-ended answer among them (ReleaseClaim)
	TooLarge    int64 // answers larger than MaxSavedResponse, saved as a marker
	StoreErrors int64 // store calls that failed or took longer than LockTimeout (503 before the handler, logged after), releases included, and requests refused for a nil Store (ErrNoStore) or bad options (ErrOptions)
	Rejected    int64 // 400, 408 and 413: missing, invalid or repeated key, unreadable, late or large body
}

type counters struct {
	claims, takeovers, replays, conflicts, mismatches atomic.Int64
	fenced, released, tooLarge, storeErrors, rejected atomic.Int64
}

// Stats returns a snapshot of the counters.
func (m *Middleware) Stats() Stats {
	c := &m.stats
	return Stats{
		Claims: c.claims.Load(), Takeovers: c.takeovers.Load(), Replays: c.replays.Load(),
		Conflicts: c.conflicts.Load(), Mismatches: c.mismatches.Load(), Fenced: c.fenced.Load(),
		Released: c.released.Load(), TooLarge: c.tooLarge.Load(), StoreErrors: c.storeErrors.Load(),
		Rejected: c.rejected.Load(),
	}
}

// CredentialScope is the default Scope: the hex SHA-256 of the request's
// Authorization header values, or "" (the anonymous scope) when there are
// none. Only the hash is stored, never the credential; but the hash is not
// salted, so a guessable credential (a Basic password from a dictionary)
// can be found again from the store's rows by trying candidates. A server
// with such credentials sets Scope to the account they authenticate.
func CredentialScope(r *http.Request) string {
	a := r.Header.Values("Authorization")
	if len(a) == 0 {
		return ""
	}
	return hexSum(sha256.Sum256([]byte(strings.Join(a, "\n"))))
}

// hexSum returns sum in hex: one allocation, the string, where
// hex.EncodeToString makes two.
func hexSum(sum [sha256.Size]byte) string {
	var b [2 * sha256.Size]byte
	hex.Encode(b[:], sum[:])
	return string(b[:])
}

// Wrap returns a handler that runs h under the decision table. A request
// that a Middleware already runs a handler for under the same scope and
// key (ClaimFrom: Wrap nested in a handler it wraps, as when a route and
// the whole mux are both wrapped) passes through to h under that claim:
// a second claim of the key, held by the first, would answer 409, which
// the first would then save as the answer, and every retry would get that
// 409 replayed, the handler never run.
func (m *Middleware) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.protects(r.Method) {
			h.ServeHTTP(w, r)
			return
		}
		vals := r.Header.Values("Idempotency-Key")
		switch {
		case len(vals) == 0 && m.Optional:
			h.ServeHTTP(w, r)
			return
		case len(vals) == 0:
			m.reject(w, r, Problem{Type: ProblemKeyMissing, Title: "Idempotency-Key missing", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("%s requests need an Idempotency-Key header: generate one random key (a UUID) per operation, store it, and send it on every retry of that operation.", r.Method)})
			return
		case len(vals) > 1:
			m.reject(w, r, Problem{Type: ProblemKeyRepeated, Title: "Idempotency-Key sent more than once", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("The request has %d Idempotency-Key headers; send exactly one.", len(vals))})
			return
		case keyhdr.Count(vals) > 1:
			m.reject(w, r, Problem{Type: ProblemKeyRepeated, Title: "Idempotency-Key sent more than once", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("The Idempotency-Key header holds %d keys separated by commas, as when a proxy joins two header lines into one; send exactly one key, and quote a key that holds a comma.", keyhdr.Count(vals))})
			return
		}
		key, err := ParseKey(vals[0])
		if err != nil {
			var ke *KeyError
			errors.As(err, &ke)
			m.reject(w, r, Problem{Type: ProblemKeyInvalid, Title: "Idempotency-Key invalid", Status: http.StatusBadRequest,
				Detail: "The Idempotency-Key header is not valid: " + ke.Reason + "."})
			return
		}
		if c, ok := ClaimFrom(r.Context()); ok && c.Key == key && c.Scope == m.scope(r) {
			h.ServeHTTP(w, r) // claimed by a Middleware around this one
			return
		}
		body, p := m.readBody(r, key)
		if p != nil {
			p.Key = key
			m.reject(w, r, *p)
			return
		}
		scope := m.scope(r)
		fp := Fingerprint(r, scope, body)
		m.decide(w, r, h, scope, key, fp, body)
	})
}

// protects reports whether requests of method carry a key, as
// idem.Transport decides which get one: names match in any case.
func (m *Middleware) protects(method string) bool { return keyhdr.Keyed(m.Methods, method) }

func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, p Problem) {
	m.stats.rejected.Add(1)
	attrs := []slog.Attr{slog.Int("status", p.Status), slog.String("type", p.Type)}
	if p.Key != "" { // a body refused: the key is valid, and the answer names it
		attrs = append([]slog.Attr{slog.String("key", p.Key)}, attrs...)
	}
	m.log(r.Context(), slog.LevelDebug, "idempotency: request rejected", attrs...)
	WriteProblem(w, p, 0)
}

// readBody reads the whole body of the request with key, bounded by
// MaxBody. A non-nil Problem is the answer when it cannot.
func (m *Middleware) readBody(r *http.Request, key string) ([]byte, *Problem) {
	limit := m.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	tooLarge := func(limit int64) *Problem {
		return &Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("The request body is larger than %d bytes, the most this server reads for an idempotent request.", limit)}
	}
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	if r.Body == nil {
		return nil, nil
	}
	defer r.Body.Close()
	// One byte past the limit tells a body over it; a limit of
	// math.MaxInt64 has no byte past it, and limit+1 would be negative.
	b, err := io.ReadAll(io.LimitReader(r.Body, min(limit, math.MaxInt64-1)+1))
	if err != nil { // declared here, mbe is allocated only for an error
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) { // an http.MaxBytesReader set before the Middleware
			return nil, tooLarge(mbe.Limit)
		}
	}
	switch {
	case int64(len(b)) > limit:
		return nil, tooLarge(limit)
	case err != nil:
		// The error goes to the Logger alone: net/http's names the
		// server's own address (an internal one behind a load balancer).
		m.log(r.Context(), slog.LevelInfo, "idempotency: request body unreadable", slog.String("key", key), slog.Any("err", err))
		p := &Problem{Type: ProblemBodyUnreadable, Title: "Request body unreadable", Status: http.StatusBadRequest,
			Detail: "The request body could not be read; send the request again with the same Idempotency-Key."}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			// The server's ReadTimeout: the body did not arrive in time.
			// 408 (RFC 9110 §15.5.9: no complete request in time), which
			// idem's clients retry under the key, where they take a 400
			// as final although nothing ran.
			p.Status = http.StatusRequestTimeout
			p.Detail = "The request body did not arrive in time; send the request again with the same Idempotency-Key."
		}
		return nil, p
	}
	if len(b) == 0 {
		// A handler outside Wrap (a CSRF or method-override middleware)
		// read the body as a form: the fields stand for it, or, for a
		// multipart form, whose parts cannot be told apart, nothing does.
		switch {
		case r.MultipartForm != nil:
			m.log(r.Context(), slog.LevelError, "idempotency: a multipart form was parsed before the Middleware read the body", slog.String("key", key))
			return nil, &Problem{Type: ProblemBodyUnreadable, Title: "Request body read before the idempotency middleware", Status: http.StatusInternalServerError,
				Detail: "The server parsed this multipart form before its idempotency middleware could compare it with the request first sent under the key; nothing ran."}
		case len(r.PostForm) > 0:
			return []byte(r.PostForm.Encode()), nil
		}
	}
	return b, nil
}

func (m *Middleware) scope(r *http.Request) string {
	if m.Scope != nil {
		return m.Scope(r)
	}
	return CredentialScope(r)
}

// Fingerprint returns the hex SHA-256 that identifies a request under one
// key: its method, escaped path, raw query, scope, media type (without
// parameters) and canonical body (see internal/canon: in a body of a JSON
// type, or of none that parses as JSON, as idem.Transport compares bodies,
// key order and whitespace do not count, unless an object has two keys
// equal, or equal but for case; other bodies count byte for byte: so do
// a form's fields, and a multipart body's boundary, in their order).
func Fingerprint(r *http.Request, scope string, body []byte) string {
	ct := r.Header.Get("Content-Type")
	return fingerprint(r, scope, canon.MediaType(ct), canon.Body(ct, body))
}

// fingerprint is Fingerprint of r with media type mt and canonical body c.
func fingerprint(r *http.Request, scope, mt string, c []byte) string {
	h := sha256.New()
	for _, f := range [][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery),
		[]byte(scope), []byte(mt), c} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0]) // appended in place: sum has the room
	return hexSum(sum)
}

// legacyFingerprint reports whether fp, a stored fingerprint that is not
// r's, is the one earlier versions gave r: they hashed a body without a
// Content-Type byte for byte, where Fingerprint now takes one that parses
// as JSON for JSON, as idem.Transport does. A retry of such a request
// claimed before the upgrade is still the same request.
func legacyFingerprint(r *http.Request, scope string, body []byte, fp string) bool {
	if r.Header.Get("Content-Type") != "" {
		return false
	}
	return fp == fingerprint(r, scope, "", body)
}

// newFence returns the fence of a claim taken at now: its reading, and an
// ID of its own. Two claims with one fence are one to the store: a
// duplicate whose caller hung up during its claim, at the clock reading
// of the request it duplicates (a coarse clock, clocks kept in step, an
// injected one), would release the claim it may have made and delete the
// other's, and a retry would run the handler while that one still runs.
func newFence(now time.Time) Fence {
	return Fence{Token: now.UnixNano(), ClaimID: rand.Text()}
}

// tokenTime returns ErrOptions for a reading of Now that a fencing token
// cannot hold: time.Time.UnixNano is undefined before 1678 and after
// 2262, and the token it gave would put a running claim's age anywhere,
// past LockTimeout (taken over while it runs) or past Retention (pruned).
func tokenTime(now time.Time) error {
	if now.Before(minToken) || now.After(maxToken) {
		return fmt.Errorf("%w: Now read %v, outside the years 1678–2262 whose Unix nanoseconds a fencing token holds", ErrOptions, now)
	}
	return nil
}

var minToken, maxToken = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

func (m *Middleware) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// usable returns ErrNoStore for a nil Store and ErrOptions, naming the
// field, for a field out of range (an OnError other than the two policies
// included): the Middleware then refuses every
// protected request and Prune.
func (m *Middleware) usable() error {
	switch {
	case m.Store == nil:
		return ErrNoStore
	case m.LockTimeout < 0:
		return fmt.Errorf("%w: LockTimeout %v is negative", ErrOptions, m.LockTimeout)
	case m.PruneBatch < 0:
		return fmt.Errorf("%w: PruneBatch %d is negative", ErrOptions, m.PruneBatch)
	case m.OnError != ReleaseClaim && m.OnError != SaveError:
		return fmt.Errorf("%w: OnError %v is neither ReleaseClaim nor SaveError", ErrOptions, m.OnError)
	case m.lockTimeout() >= m.retention():
		return fmt.Errorf("%w: LockTimeout %v is not below Retention %v: Prune would delete the claim of a handler still running, "+
			"and a retry would run it again", ErrOptions, m.lockTimeout(), m.retention())
	}
	return nil
}

// retention returns Retention, DefaultRetention for zero, at least
// MinRetention.
func (m *Middleware) retention() time.Duration {
	if m.Retention == 0 {
		return DefaultRetention
	}
	return max(m.Retention, MinRetention)
}

func (m *Middleware) lockTimeout() time.Duration {
	if m.LockTimeout > 0 {
		return m.LockTimeout
	}
	return DefaultLockTimeout
}

// decide runs the decision table for one request.
func (m *Middleware) decide(w http.ResponseWriter, r *http.Request, h http.Handler, scope, key, fp string, body []byte) {
	ctx := r.Context()
	if err := m.usable(); err != nil {
		m.storeFailed(w, r, key, err)
		return
	}
	for range maxDecisions {
		now := m.now()
		if err := tokenTime(now); err != nil {
			m.storeFailed(w, r, key, err)
			return
		}
		f := newFence(now)
		e, claimed, err := m.Store.Claim(ctx, scope, key, fp, f, now)
		switch {
		case err != nil:
			m.claimFailed(w, r, scope, key, f, err)
			return
		case claimed:
			m.log(ctx, slog.LevelDebug, "idempotency: claimed", slog.String("key", key), slog.Int64("token", f.Token))
			m.run(w, r, h, Claim{Scope: scope, Key: key, Token: f.Token, ClaimID: f.ClaimID}, now, body)
			return
		case e.Fingerprint != fp && !legacyFingerprint(r, scope, body, e.Fingerprint):
			m.stats.mismatches.Add(1)
			m.log(ctx, slog.LevelInfo, "idempotency: key reused with another request", slog.String("key", key))
			WriteProblem(w, Problem{Type: ProblemMismatch, Title: "Idempotency-Key reused with another request", Status: http.StatusUnprocessableEntity, Key: key,
				Detail: "This Idempotency-Key was first used with a different method, path, query, Content-Type or body. Do not retry: send a new key for a new operation, or resend the original request unchanged."}, 0)
			return
		case e.Status == StatusDone && e.Response != nil:
			if age, ok := m.streaming(scope, key, e, now); ok {
				m.stats.conflicts.Add(1)
				wait := retryInFlight(age, m.lockTimeout())
				m.log(ctx, slog.LevelDebug, "idempotency: in flight, its answer too large to save streaming", slog.String("key", key), slog.Int("retry_after", wait))
				m.inFlight(w, key, wait)
				return
			}
			m.stats.replays.Add(1)
			m.log(ctx, slog.LevelDebug, "idempotency: replayed", slog.String("key", key), slog.Int("status", e.Response.Status))
			m.replay(w, r.Method == http.MethodHead, *e.Response)
			return
		case e.Status != StatusInFlight:
			m.storeFailed(w, r, key, fmt.Errorf("testserver: entry in state %q with response %v", e.Status, e.Response != nil))
			return
		}
		lt := m.lockTimeout()
		if age := m.claimAge(scope, key, e.Fence, now); age < lt {
			m.stats.conflicts.Add(1)
			wait := retryInFlight(age, lt)
			m.log(ctx, slog.LevelDebug, "idempotency: in flight", slog.String("key", key), slog.Int("retry_after", wait))
			m.inFlight(w, key, wait)
			return
		}
		if e.Token == math.MaxInt64 {
			// No larger token to fence the old holder out: e.Token+1 wraps
			// around to the smallest. Fail closed, the claim left as it is.
			m.storeFailed(w, r, key, fmt.Errorf("testserver: stale claim of token %d (the largest) cannot be taken over with a larger one", e.Token))
			return
		}
		next := Fence{Token: max(f.Token, e.Token+1), ClaimID: f.ClaimID}
		won, err := m.Store.TakeOver(ctx, scope, key, e.Fence, next)
		if err != nil {
			// Not released: a take-over made all the same holds the claim
			// of a run that may have done the work. Released, the retry
			// would claim the key afresh and run the handler without
			// TakenOver; in flight, it is taken over again once stale.
			m.storeFailed(w, r, key, err)
			return
		}
		if won {
			m.log(ctx, slog.LevelWarn, "idempotency: stale claim taken over", slog.String("key", key), slog.Int64("old_token", e.Token), slog.Int64("token", next.Token))
			m.run(w, r, h, Claim{Scope: scope, Key: key, Token: next.Token, ClaimID: next.ClaimID, TakenOver: true}, now, body)
			return
		}
		// Another request took it over, saved or released it first: look again.
	}
	m.stats.conflicts.Add(1)
	m.log(ctx, slog.LevelDebug, "idempotency: in flight", slog.String("key", key), slog.Int("retry_after", 1))
	m.inFlight(w, key, 1)
}

// claimFailed answers a Claim that failed with err, and releases the claim
// with fence f that the store may have made all the same: the caller hung
// up (its context ended while the store wrote), or the store wrote it and
// its answer was lost (a connection lost as it committed: a PostgreSQL
// session terminated, a restart). Rather than leave it in flight, refusing
// every retry with 409 until the lease ends, for a handler that never
// runs. Release is fenced by f, whose ClaimID is this request's alone, so
// a claim this request did not make is left alone, whatever its token. A
// caller still there gets its 503 first: with the store down, the release
// may wait as long as any store write (storeWriteTimeout) before it fails
// too, a store error of its own, counted and logged (a claim the store
// made is then taken over after the lease). An HTTP/1.1
// connection, which serves nothing more until the release returns, is
// closed after the answer; an HTTP/2 stream ends once it returns, and the
// connection stays (net/http's HTTP/2 server takes Connection: close for a
// GOAWAY, which would end it for every stream).
func (m *Middleware) claimFailed(w http.ResponseWriter, r *http.Request, scope, key string, f Fence, err error) {
	if r.Context().Err() != nil {
		m.releaseUnrun(r, scope, key, f)
		m.storeFailed(w, r, key, err)
		return
	}
	if r.ProtoMajor < 2 {
		w.Header().Set("Connection", "close")
	}
	writeProblem(w, m.storeProblem(r, key, err), 1, true)
	_ = http.NewResponseController(w).Flush()
	m.releaseUnrun(r, scope, key, f)
}

// releaseUnrun releases the claim with fence f, whose handler will not
// run, and logs a release that failed.
func (m *Middleware) releaseUnrun(r *http.Request, scope, key string, f Fence) {
	if err := m.release(r, scope, key, f); err != nil {
		m.stats.storeErrors.Add(1)
		m.log(r.Context(), slog.LevelError, "idempotency: release failed; the claim stays until LockTimeout", slog.String("key", key), slog.Any("err", err))
	}
}

// save saves resp under the claim of fence f, and tries again, up to
// maxSaves times within ctx, when the store fails for another reason than
// the fence: a lock another process held past the store's busy timeout, a
// connection lost. An answer not saved leaves its claim in flight until
// LockTimeout, and the caller's retry then runs the handler again. Save is
// fenced on the claim: one that was written before its error came is
// found fenced when tried again (the caller's retry gets the replay), as
// it would be had the claim been taken over meanwhile. Which of the two
// cannot be told, so a try fenced after a failed one returns the failure,
// saying so, not ErrFenced: the caller gets the handler's answer, as for
// a save that failed, not a 409 saying the claim was taken over.
func (m *Middleware) save(ctx context.Context, scope, key string, f Fence, resp Response) error {
	wait := 50 * time.Millisecond
	var failed error
	for n := 1; ; n++ {
		err := m.Store.Save(ctx, scope, key, f, resp)
		if failed != nil && errors.Is(err, ErrFenced) {
			return fmt.Errorf("%w; tried again, it was fenced: the try that failed saved it, or the claim was taken over since", failed)
		}
		if err == nil || errors.Is(err, ErrFenced) || n == maxSaves || ctx.Err() != nil {
			return err
		}
		failed = err
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// release releases the claim with fence f, fenced by it and within
// storeWriteTimeout, whether or not the caller is still there.
func (m *Middleware) release(r *http.Request, scope, key string, f Fence) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeWriteTimeout)
	defer cancel()
	_, err := m.Store.Release(ctx, scope, key, f)
	return err
}

// maxAhead bounds how many claims ahead of its clock one Middleware
// remembers (aheadClaims).
const maxAhead = 4096

// aheadClaims remembers, for each claim read in flight with a token ahead
// of the Middleware's clock, the reading of Now taken when it was first
// read so (see claimAge).
type aheadClaims struct {
	mu    sync.Mutex
	first map[aheadKey]time.Time
	order []aheadKey // first's keys in the order they were added: a ring once it holds maxAhead
	next  int        // the oldest in order, once it holds maxAhead
}

type aheadKey struct {
	scope, key string
	f          Fence
}

// claimAge returns the age, at now, of the claim of fence f on (scope,
// key), which the store returned after now was read: how long ago its
// token was, on this Middleware's clock. A token ahead of that clock (a claim
// taken by a server whose clock runs ahead, which may have died since)
// would make the age negative, and the claim young until this clock caught
// up with it, LockTimeout plus the skew; nor can the age be clamped at
// zero, which keeps it young as long. Such a claim is judged by the time
// this Middleware first read it, which is never before the claim was
// taken: its age is at least the time since then. It is taken over
// LockTimeout after that first reading, when its own lease has ended: a
// lease runs at most LockTimeout from a reading taken before its claim
// was written (see run), on a clock that runs as fast as this one. So a
// claim ahead is never taken over while its handler may run within its
// lease; it waits LockTimeout from when it was first read, rather than
// the whole skew. A reader whose clock runs ahead of the taker's still
// takes its claims over early (Middleware.LockTimeout).
//
// At most maxAhead first readings are kept. Once there are as many, a new
// one takes the place of the oldest if that is LockTimeout old (its claim
// stale for this Middleware, as every claim read before it: forgotten, it
// is judged afresh when read again, later than needed, never early), and
// is otherwise not kept: its claim is judged by its token as before,
// young, later than needed, never early.
func (m *Middleware) claimAge(scope, key string, f Fence, now time.Time) time.Duration {
	age := now.Sub(time.Unix(0, f.Token))
	k := aheadKey{scope, key, f}
	a := &m.ahead
	var seen time.Time
	if age < 0 {
		// Taken after the store answered: the claim was written before.
		seen = m.now()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if first, ok := a.first[k]; ok {
		return max(age, now.Sub(first))
	}
	if age >= 0 {
		return age
	}
	switch {
	case len(a.order) < maxAhead:
		if a.first == nil {
			a.first = make(map[aheadKey]time.Time)
		}
		a.order = append(a.order, k)
	case now.Sub(a.first[a.order[a.next]]) >= m.lockTimeout():
		delete(a.first, a.order[a.next])
		a.order[a.next] = k
		a.next = (a.next + 1) % maxAhead
	default:
		return 0
	}
	a.first[k] = seen
	return 0
}

// retryInFlight is the Retry-After, in whole seconds, of a claim in flight
// for age of its lease lt: as long again as it has run (at least 1 s), and
// never past the end of its lease, when a retry may take it over. A client
// that asks again with the same key then gets the answer soon after the
// handler ends, in a few requests, where the lease left (a minute by
// default) would keep it waiting long after: a client stops rather than
// wait out a long Retry-After (idem's MaxRetryAfter, 30 s by default).
func retryInFlight(age, lt time.Duration) int {
	left := (lt - age + time.Second - 1) / time.Second
	ran := (age + time.Second - 1) / time.Second
	return int(max(1, min(ran, left)))
}

func (m *Middleware) inFlight(w http.ResponseWriter, key string, retryAfter int) {
	WriteProblem(w, Problem{Type: ProblemInFlight, Title: "Request with this Idempotency-Key in progress", Status: http.StatusConflict, Key: key,
		Detail: fmt.Sprintf("A request with this Idempotency-Key is being processed. Retry the same request with the same key after %d s to get its answer.", retryAfter)}, retryAfter)
}

func (m *Middleware) storeFailed(w http.ResponseWriter, r *http.Request, key string, err error) {
	WriteProblem(w, m.storeProblem(r, key, err), 1)
}

// storeProblem is the answer to a request whose store write failed with
// err, a failure it counts and logs.
func (m *Middleware) storeProblem(r *http.Request, key string, err error) Problem {
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		// Not the store's failure: the request's context ended, because the
		// caller went away or a deadline set before this Middleware passed.
		// The caller may still be there; an answer to nobody is harmless.
		return Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable, Key: key,
			Detail: "The request's time ran out before the server could record this Idempotency-Key, so it did not process the request. Retry the same request with the same key."}
	}
	m.stats.storeErrors.Add(1)
	m.log(r.Context(), slog.LevelError, "idempotency: store failed; request refused", slog.String("key", key), slog.Any("err", err))
	return Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable, Key: key,
		Detail: "The server could not record this Idempotency-Key, so it did not process the request. Retry the same request with the same key."}
}

// replay writes a saved answer, to a HEAD request when head is.
func (m *Middleware) replay(w http.ResponseWriter, head bool, resp Response) {
	h := w.Header()
	for name, vs := range canonical(resp.Header, func(name string) bool { return m.replayable(name, head) }) {
		h[name] = vs
	}
	h.Set("Idempotent-Replayed", "true")
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// canonical returns a copy of the entries of h that keep accepts, each
// under its canonical key: the values of keys equal but for case (a
// handler's w.Header()["content-type"] beside a sniffed Content-Type) are
// joined in the order net/http sends them, the keys sorted bytewise, so
// that what is saved, and every replay, is the same whatever the order of
// the map.
func canonical(h http.Header, keep func(name string) bool) http.Header {
	names := make([]string, 0, len(h)) // slices.Sorted(maps.Keys(h)) grows its slice as it goes
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make(http.Header, len(h))
	for _, name := range names {
		if keep(name) {
			c := http.CanonicalHeaderKey(name)
			out[c] = append(out[c], h[name]...)
		}
	}
	return out
}

// defaultReplayHeaders are the ReplayHeaders of nil: those that describe
// the body and the resource, which a replay of the same body carries as
// the first answer did, safety headers included (X-Content-Type-Options,
// Content-Disposition). Not the CORS headers (Access-Control-*): their
// values answer the request's Origin, which the retry may send otherwise,
// and a CORS middleware outside Wrap sets them on the replay for its own;
// saved, the first request's would replace those.
var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
	"Location", "ETag", "Last-Modified", "Cache-Control", "Expires", "Link", "Vary", "Content-Range", "Allow",
	"Content-Disposition", "X-Content-Type-Options"}

// replayable reports whether a response header may be saved and
// replayed, in the answer to a HEAD when head is. A HEAD's Content-Length
// is, whatever ReplayHeaders says: net/http sends the Content-Length a
// HEAD's handler set as it is, the length its GET would send (RFC 9110,
// section 8.6), and computes one from the body written only when there is
// none; the replay's body is the one saved, which may be empty (a body past
// MaxSavedResponse is dropped) or shorter, so the replay would carry
// another length, or none.
func (m *Middleware) replayable(name string, head bool) bool {
	name = http.CanonicalHeaderKey(name)
	switch name {
	case "Set-Cookie", "Set-Cookie2", "Cookie", "Authorization", "Proxy-Authorization",
		"Authentication-Info", "Proxy-Authentication-Info", "Www-Authenticate", "Proxy-Authenticate",
		streamedByHeader:
		return false
	case "Content-Length":
		if head {
			return true
		}
	}
	if secrethdr.Is(name) { // X-Auth-Token, X-Api-Key, …: as idem.SecretHeader names them
		return false
	}
	list := m.ReplayHeaders
	if list == nil {
		list = defaultReplayHeaders
	}
	return slices.ContainsFunc(list, func(s string) bool { return http.CanonicalHeaderKey(s) == name })
}

// run executes the handler under the claim c, which its request's context
// carries, then saves or releases the claim, and answers. began is the
// reading of Now taken before the claim or take-over was written.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, h http.Handler, c Claim, began time.Time, body []byte) {
	scope, key, token := c.Scope, c.Key, c.Token
	fence := Fence{Token: token, ClaimID: c.ClaimID}
	limit := m.MaxSavedResponse
	if limit <= 0 {
		limit = DefaultMaxSavedResponse
	}
	limit = min(limit, MaxSavedResponseLimit)
	rec := &recorder{w: w, header: w.Header().Clone(), limit: limit, head: r.Method == http.MethodHead}
	// An answer that outgrows the limit cannot change once it streams: its
	// marker is saved before the first byte goes, so that a caller that
	// reads it slowly, holding the handler in Write past its lease, gets a
	// retry the marker, not a second run. (A failure's, under
	// ReleaseClaim, is released once the handler returns.) The marker
	// names this Middleware, which counts the handler among those that
	// stream until it returns: until then, and within its lease, a retry
	// is told the request is in flight (streaming).
	var early struct {
		saved bool
		err   error
	}
	rec.onStream = func() {
		if failedStatus(rec.status) && m.OnError == ReleaseClaim {
			return
		}
		m.streams.start(c.ClaimID) // before the marker is saved
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeWriteTimeout)
		defer cancel()
		early.saved, early.err = true, m.save(ctx, scope, key, fence, m.saved(rec, key, m.streams.ident()))
	}
	// The handler's context outlives the caller's connection: work that
	// has started (a charge) runs to its end and is saved, so that the
	// caller's retry is replayed, instead of being cut off halfway, released
	// as a failure and run again. It ends with the lease, which runs from
	// the reading of Now taken before the claim was written (its token,
	// for a claim): the time the store took to claim is spent. A clock
	// stepped back since that reading never lengthens it past LockTimeout,
	// when a server whose clock is right may take it over. A take-over of
	// a claim whose token was ahead of this clock has a token ahead of it
	// too (greater than the one it took over), which a server reading it
	// judges by the time it first read it (claimAge), after the take-over
	// was written: the lease runs from before, not from that token.
	lease := m.lockTimeout() - max(0, m.now().Sub(began))
	if lease <= 0 {
		// Claimed too late to run: a retry may take the claim over already.
		// A take-over stays as it is, stale, for the retry to take over
		// with TakenOver set: released, the key would be claimed afresh,
		// and the handler run as a first run, although the run taken over
		// may have done the work.
		if !c.TakenOver {
			m.releaseUnrun(r, scope, key, fence)
		}
		m.storeFailed(w, r, key, fmt.Errorf("testserver: the claim took longer than LockTimeout (%v)", m.lockTimeout()))
		return
	}
	// Claims and Takeovers count runs of the handler, counted once it is
	// sure to run: a claim released unrun above is a store error alone.
	if c.TakenOver {
		m.stats.takeovers.Add(1)
	} else {
		m.stats.claims.Add(1)
	}
	detached := context.WithoutCancel(r.Context()) // the handler's, and the save's or release's after it
	hctx, cancel := context.WithTimeout(context.WithValue(detached, claimKey{}, c), lease)
	defer cancel()
	rec.done = hctx.Done()
	hr := r.WithContext(hctx)
	// The body read, afresh, as net/http hands a handler its request:
	// http.NoBody for a request that had none, and the length declared, -1
	// for a body sent chunked, although the Middleware read it whole. (A
	// form an outer handler parsed, whose fields stand for the body, is
	// its own length.)
	if len(body) == 0 && (r.Body == nil || r.Body == http.NoBody) {
		hr.Body = http.NoBody
		hr.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	} else {
		hr.Body = io.NopCloser(bytes.NewReader(body))
		hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	if r.ContentLength >= 0 {
		hr.ContentLength = int64(len(body))
	}
	v, stack := m.call(h, rec, hr)
	if rec.streamed {
		// The marker is the key's final answer now. Counted out whether
		// or not its save returned: one that panicked (recovered above, as
		// the handler's) may have saved it.
		m.streams.end(c.ClaimID)
	}
	// A handler that returns without having answered anything, no final
	// status and no byte of body, once its context ended (only the lease
	// ends it: its parent is detached from the request) stopped because
	// its time ran out, as a handler that honours its context does. net/http
	// would send an implicit 200 with no body; saved, that 200 would be
	// replayed to every retry, and a client would take an operation that
	// may never have happened as done. The run failed instead, as
	// http.TimeoutHandler answers a handler that ran out of time: with 503,
	// here ProblemLeaseEnded, which OnError releases or saves as any
	// failure. A handler that answers, even after its lease ended, is
	// saved as it answered.
	silent := v == nil && rec.status == 0 && hctx.Err() != nil
	if silent {
		detail, retryAfter := "The server's time for this request ran out before it answered. Retry the same request with the same key.", 1
		if m.OnError == SaveError {
			// Saved, it is the key's answer: a Retry-After would ask for
			// a retry that only gets it replayed.
			detail, retryAfter = "The server's time for this request ran out before it answered, and this answer is saved for the key: the operation may or may not have happened. Look its result up before sending it again with a new key.", 0
		}
		rec.reset()
		WriteProblem(rec, Problem{Type: ProblemLeaseEnded, Title: "Handler's lease ended without an answer", Status: http.StatusServiceUnavailable, Key: key,
			Detail: detail}, retryAfter)
	}
	rec.finish()
	// A handler that panics, or whose body is shorter than the
	// Content-Length it set, failed: its answer is not saved. Its caller
	// gets a 500, or a connection broken off (http.ErrAbortHandler) where
	// net/http would break it off: after a short body, after a panic with
	// http.ErrAbortHandler itself, which net/http neither answers nor logs
	// (httputil.ReverseProxy panics with it when an upstream's answer
	// breaks off), and after a panic once part of the answer was sent.
	//
	// The failure is logged once the answer is saved or the claim
	// released, as every record after the handler ran: a Logger that
	// panics then leaves the key as the handler left it, and cannot keep
	// the claim in flight for a retry to take over and run the handler
	// again, which SaveError promises never happens.
	aborted := v == http.ErrAbortHandler
	short := v == nil && rec.short(r.Method)
	// The lengths of a short body, for its record: the handler-failed
	// answer written in its place below replaces them.
	declared, written := rec.declared, rec.size
	abort := aborted || short
	if v != nil || abort {
		if rec.streamed {
			// The status and part of the body are on their way: the answer
			// can no longer change. It is saved as any streamed answer is,
			// the marker naming the status sent, whatever OnError says (the
			// operation may have happened), and the connection is then
			// aborted, so that the caller sees a broken answer rather than
			// a short success.
			abort = true
		} else {
			rec.reset()
			WriteProblem(rec, Problem{Type: ProblemHandlerFailed, Title: "Handler failed", Status: http.StatusInternalServerError, Key: key,
				Detail: "The server failed while processing the request."}, 0)
			rec.status = http.StatusInternalServerError
		}
	}
	if abort {
		defer panic(http.ErrAbortHandler)
	}

	// The handler ran: record the outcome even if the caller hung up.
	ctx, cancelWrite := context.WithTimeout(detached, storeWriteTimeout)
	defer cancelWrite()
	fenced := ""      // the write that found the claim taken over
	tooLarge := false // the too-large marker was saved
	failed := failedStatus(rec.status)
	if early.saved {
		tooLarge = true
		switch err := early.err; {
		case errors.Is(err, ErrFenced):
			fenced = "save"
		case err != nil:
			m.stats.storeErrors.Add(1)
			m.log(ctx, slog.LevelError, "idempotency: save failed; the claim stays until LockTimeout", slog.String("key", key), slog.Any("err", err))
		}
	} else if failed && m.OnError == ReleaseClaim && !(abort && rec.streamed) {
		released, err := m.Store.Release(ctx, scope, key, fence)
		switch {
		case err != nil:
			m.stats.storeErrors.Add(1)
			m.log(ctx, slog.LevelError, "idempotency: release failed; the claim stays until LockTimeout", slog.String("key", key), slog.Any("err", err))
		case !released:
			fenced = "release"
		default:
			m.stats.released.Add(1)
			m.log(ctx, slog.LevelDebug, "idempotency: claim released after handler error", slog.String("key", key), slog.Int("status", rec.status))
		}
	} else {
		resp := m.saved(rec, key, "")
		tooLarge = rec.streamed
		switch err := m.save(ctx, scope, key, fence, resp); {
		case errors.Is(err, ErrFenced):
			fenced = "save"
		case err != nil:
			m.stats.storeErrors.Add(1)
			m.log(ctx, slog.LevelError, "idempotency: save failed; the claim stays until LockTimeout", slog.String("key", key), slog.Any("err", err))
		default:
			m.log(ctx, slog.LevelDebug, "idempotency: saved", slog.String("key", key), slog.Int("status", resp.Status))
		}
	}
	if fenced != "" {
		// The claim was taken over while the handler ran: the write changed
		// nothing, and the caller is told to retry, which replays the new
		// owner's answer.
		m.stats.fenced.Add(1)
		m.log(ctx, slog.LevelWarn, "idempotency: late "+fenced+" fenced: the claim was taken over", slog.String("key", key))
	}
	switch {
	case aborted:
		m.log(r.Context(), slog.LevelInfo, "idempotency: handler aborted its answer (http.ErrAbortHandler)", slog.String("key", key))
	case v != nil:
		m.logPanic(r, key, v, stack)
	case short:
		m.log(r.Context(), slog.LevelError, "idempotency: handler's body is shorter than its Content-Length", slog.String("key", key),
			slog.Int64("content_length", declared), slog.Int64("written", written))
	case silent:
		m.log(r.Context(), slog.LevelWarn, "idempotency: handler returned no answer after its lease ended", slog.String("key", key))
	case hctx.Err() != nil:
		// Saved as it answered, but it ran past LockTimeout, when a retry
		// could take its claim over: a LockTimeout shorter than an honest
		// run, which the operator must learn of before it runs twice.
		m.log(r.Context(), slog.LevelWarn, "idempotency: handler returned after its lease ended; a retry could have taken its claim over and run it again",
			slog.String("key", key), slog.Duration("lock_timeout", m.lockTimeout()))
	}
	m.logSuperfluous(r, key, rec.superfluous)
	if tooLarge {
		m.log(ctx, slog.LevelWarn, "idempotency: response too large to save; a marker is saved", slog.String("key", key), slog.Int("status", rec.status), slog.Int64("bytes", rec.size))
	}
	switch {
	case abort: // the deferred panic breaks the connection off
	case fenced != "" && !rec.streamed:
		WriteProblem(w, Problem{Type: ProblemTakenOver, Title: "Request with this Idempotency-Key taken over", Status: http.StatusConflict, Key: key,
			Detail: "This request outlived its lease and another request with the same key took over. Retry the same request with the same key to get the saved answer."}, 1)
	default:
		rec.send() // the answer, or the trailers that end one streamed
	}
}

// failedStatus reports whether an answer of status is a failure that
// OnError's ReleaseClaim releases: a 5xx, a 429, a 408 or a 425.
func failedStatus(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests || status == http.StatusRequestTimeout ||
		status == http.StatusTooEarly
}

// call runs the handler and returns the value of its panic, or nil, and
// but for http.ErrAbortHandler the stack of the panicking goroutine (at
// most 64 KiB of it, as net/http logs). A handler that calls
// runtime.Goexit (t.FailNow in a test's handler) failed as one that
// panics with errGoexit: it runs on a goroutine of its own, which the
// Goexit ends, where it would end the request's, the claim left in flight
// and the connection broken off.
func (m *Middleware) call(h http.Handler, w http.ResponseWriter, r *http.Request) (recovered any, stack []byte) {
	// The goroutine sends its result back rather than set call's results:
	// captured by it, each would be an allocation of its own.
	done := make(chan handlerFailure)
	go func() {
		returned := false
		defer func() {
			var f handlerFailure
			f.recovered = recover()
			if f.recovered == nil && !returned {
				f.recovered = errGoexit // recover returns nil during a Goexit
			}
			if f.recovered != nil && f.recovered != http.ErrAbortHandler {
				f.stack = make([]byte, 64<<10)
				f.stack = f.stack[:runtime.Stack(f.stack, false)]
			}
			done <- f
		}()
		h.ServeHTTP(w, r)
		returned = true
	}()
	f := <-done
	return f.recovered, f.stack
}

// handlerFailure is what call returns.
type handlerFailure struct {
	recovered any
	stack     []byte
}

// errGoexit is the failure of a handler that called runtime.Goexit.
var errGoexit = errors.New("testserver: the handler called runtime.Goexit")

// logPanic logs a handler's panic with its stack: to the Logger, or without
// one as net/http logs a panic, to the ErrorLog of r's server or else to the
// log package's standard logger.
func (m *Middleware) logPanic(r *http.Request, key string, v any, stack []byte) {
	if m.Logger != nil {
		m.Logger.Log(r.Context(), slog.LevelError, "idempotency: handler panicked", "key", key, "panic", v, "stack", string(stack))
		return
	}
	const format = "testserver: panic serving %v, Idempotency-Key %q: %v\n%s"
	if srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server); srv != nil && srv.ErrorLog != nil {
		srv.ErrorLog.Printf(format, r.RemoteAddr, key, v, stack)
		return
	}
	log.Printf(format, r.RemoteAddr, key, v, stack)
}

// logSuperfluous logs each WriteHeader call that came once the status was
// set, from, which changed nothing: to the Logger, at Warn, or without one
// as net/http logs it, in its words, to the ErrorLog of r's server or else
// to the log package's standard logger.
func (m *Middleware) logSuperfluous(r *http.Request, key string, from []runtime.Frame) {
	for _, f := range from {
		if m.Logger != nil {
			m.Logger.LogAttrs(r.Context(), slog.LevelWarn, "idempotency: superfluous response.WriteHeader call", slog.String("key", key),
				slog.String("from", fmt.Sprintf("%s (%s:%d)", f.Function, path.Base(f.File), f.Line)))
			continue
		}
		const format = "http: superfluous response.WriteHeader call from %s (%s:%d)"
		if srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server); srv != nil && srv.ErrorLog != nil {
			srv.ErrorLog.Printf(format, f.Function, path.Base(f.File), f.Line)
		} else {
			log.Printf(format, f.Function, path.Base(f.File), f.Line)
		}
	}
}

// saved returns what is stored for the recorded answer: the answer itself,
// or the ProblemResponseTooLarge marker. A marker saved before its handler
// returned names, in by, the Middleware that runs the handler (see
// streaming). The answer's body is the recorder's own, not a copy: nothing
// writes it once the handler returned.
func (m *Middleware) saved(rec *recorder, key, by string) Response {
	if !rec.streamed {
		hdr := canonical(rec.sent, func(name string) bool { return m.replayable(name, rec.head) })
		return Response{Status: rec.status, Header: hdr, Body: rec.body.Bytes()}
	}
	m.stats.tooLarge.Add(1)
	p := Problem{Type: ProblemResponseTooLarge, Title: "Response too large to replay", Status: http.StatusInternalServerError, Key: key, OriginalStatus: rec.status,
		Detail: fmt.Sprintf("The first request with this Idempotency-Key was answered with status %d, sent to that caller, but its answer was larger than %d bytes, the most this server saves for a replay. The operation will not run again: look its result up instead of retrying.", rec.status, rec.limit)}
	hdr := http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}}
	if loc := rec.sent.Get("Location"); loc != "" {
		hdr.Set("Location", loc)
	}
	if by != "" {
		hdr.Set(streamedByHeader, by)
	}
	return Response{Status: p.Status, Header: hdr, Body: p.body()}
}

// streamedByHeader, in a ProblemResponseTooLarge marker saved before its
// answer streamed, names the Middleware (streams.ident) that runs the
// handler. It is the Middleware's own: never saved from a handler's
// answer, nor replayed.
const streamedByHeader = "Idempotent-Streamed-By"

// streams is what a Middleware knows of the answers too large to save
// that its handlers stream.
type streams struct {
	once    sync.Once
	id      string // random: this Middleware's, in the markers it saves
	mu      sync.Mutex
	running map[string]struct{} // the ClaimIDs of the handlers streaming
}

func (s *streams) ident() string {
	s.once.Do(func() { s.id = rand.Text() })
	return s.id
}

// start counts the handler of claimID among those streaming.
func (s *streams) start(claimID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running == nil {
		s.running = make(map[string]struct{})
	}
	s.running[claimID] = struct{}{}
}

// end counts the handler of claimID out: it returned.
func (s *streams) end(claimID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, claimID)
}

// has reports whether the handler of claimID streams.
func (s *streams) has(claimID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.running[claimID]
	return ok
}

// streaming reports whether the entry e, done, which the store returned
// after now was read, holds the marker of an answer too large to save
// whose handler may still run, and the age of its claim: the marker is
// saved before the answer streams, and the handler may yet fail, or run
// on. A retry is then told the request is in flight (409), as for any
// claim in flight, not given the marker as its final answer. The
// Middleware that runs the handler knows when it returns (streams);
// another, sharing the store, cannot tell from the marker, and waits for
// the claim's lease to end, LockTimeout after it was taken (its age read
// as claimAge reads a claim in flight), by when an honest handler has
// returned. Once the lease has ended, every Middleware answers the marker,
// whether the handler returned or not: a caller that reads the answer
// slowly, holding the handler in Write, does not hold retries off past
// it. A marker of an earlier version, which names none, is final.
func (m *Middleware) streaming(scope, key string, e Entry, now time.Time) (time.Duration, bool) {
	by := e.Response.Header.Get(streamedByHeader)
	if by == "" || (by == m.streams.ident() && !m.streams.has(e.ClaimID)) {
		return 0, false
	}
	age := m.claimAge(scope, key, e.Fence, now)
	return age, age < m.lockTimeout()
}

// log sends a record to the Logger. A panic of the Logger is not
// recovered: as net/http leaves a panic to the caller of ServeHTTP, which
// recovers it, so does the Middleware, rather than go on and answer as if
// the record were logged. A store write the record follows stands; a claim
// it precedes waits out its LockTimeout. Once the handler ran, the save or
// the release precedes every record.
func (m *Middleware) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if m.Logger != nil {
		m.Logger.LogAttrs(ctx, level, msg, attrs...)
	}
}

// Prune deletes the entries created more than Retention ago, in batches of
// PruneBatch (one store statement each, so no writer waits long), until a
// batch comes back short, ctx is done, or 10 000 batches ran; an entry
// still in flight is kept while its claim was taken within Retention (see
// Store.Prune). It returns how many it deleted. Run it when the server
// starts and then periodically: a server restarted more often than the
// period never prunes if the first run waits a period. With a
// nil Store it deletes nothing and returns ErrNoStore; with a negative
// LockTimeout or PruneBatch, a LockTimeout not below Retention, an
// OnError that is neither policy, or a Now that reads outside the years
// 1678–2262, ErrOptions.
func (m *Middleware) Prune(ctx context.Context) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	retention := m.retention()
	batch := m.PruneBatch
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	now := m.now()
	if err := tokenTime(now); err != nil {
		return 0, err
	}
	// The stores judge an entry's age by its own times, its creation and
	// its token, read on the clock of the server that wrote them, not by
	// the first reading claimAge keeps: an entry written on a clock ahead
	// is kept that much past Retention, never deleted before its real age
	// passes it, when a client's retry within its horizon would run the
	// operation again. One written on a clock behind goes that much early,
	// which Retention's hour past the clients' horizon is for.
	before := now.Add(-retention)
	total := 0
	for range maxPruneBatches {
		n, err := m.Store.Prune(ctx, before, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
	return total, nil
}

// recorder buffers a handler's answer up to limit bytes of body. Past the
// limit it sends what it has and passes the rest through (streamed).
type recorder struct {
	w        http.ResponseWriter
	header   http.Header // a copy of w's, which the handler changes
	sent     http.Header // header as it was at WriteHeader: what is sent and saved
	status   int
	body     bytes.Buffer
	limit    int64
	size     int64 // body bytes the handler wrote
	declared int64 // the Content-Length set when the status was, or -1
	streamed bool
	head     bool            // the request is a HEAD, whose answer has no body on the wire
	dropped  bool            // a HEAD's body outgrew limit: it is counted, not kept
	onStream func()          // called once the answer outgrew limit, before it streams
	done     <-chan struct{} // the handler's context's, for CloseNotify

	closeOnce sync.Once // makes closeCh, CloseNotify's channel
	closeCh   chan bool

	superfluous []runtime.Frame // the callers of WriteHeader once the status was set, the first maxSuperfluous
}

// maxSuperfluous bounds the superfluous WriteHeader calls of one answer
// that are logged.
const maxSuperfluous = 8

// relevantCaller returns the caller of the recorder's WriteHeader that
// called it, the first frame outside net/http (a handler's http.Error),
// as net/http names the caller of a superfluous WriteHeader.
func relevantCaller() runtime.Frame {
	pc := make([]uintptr, 16)
	n := runtime.Callers(3, pc) // past runtime.Callers, relevantCaller and WriteHeader
	frames := runtime.CallersFrames(pc[:n])
	var frame runtime.Frame
	for more := n > 0; more; {
		frame, more = frames.Next()
		if !strings.HasPrefix(frame.Function, "net/http.") {
			break
		}
	}
	return frame
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(code int) {
	if rec.status != 0 {
		// Ignored, as net/http ignores it, and logged as net/http logs it,
		// naming its caller: by run, once the answer is saved, as every
		// record after the handler ran.
		if len(rec.superfluous) < maxSuperfluous {
			rec.superfluous = append(rec.superfluous, relevantCaller())
		}
		return
	}
	if code < 100 || code > 999 { // as net/http does, in the handler
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 {
		// net/http (since Go 1.19) sends an informational answer, 103
		// Early Hints say, at once with the header as it is, and the final
		// answer after it: so does the recorder, to the first caller. It is
		// not the answer, and is neither saved nor replayed. 101 Switching
		// Protocols is no interim answer but a switch to another protocol,
		// which needs the connection this writer cannot hijack: it is
		// dropped, and the handler's final answer is the answer. So is a
		// 100 Continue, which asks the client to send the body: the
		// Middleware has read it whole before the handler ran, and
		// net/http sent its own 100 Continue then, when the client asked
		// for one (Expect: 100-continue); under plain net/http a handler's
		// 100 Continue takes the place of that one, and sent here it would
		// be a second.
		if code != http.StatusSwitchingProtocols && code != http.StatusContinue {
			rec.informational(code)
		}
		return
	}
	rec.status = code
	// net/http sends the header as it is now: a change after WriteHeader
	// (or the first Write) is not sent, but for the values of declared
	// trailers. The answer sent and saved is this copy, so that the first
	// caller and every replay get what net/http would have sent.
	rec.sent = rec.header.Clone()
	rec.declared = -1
	if cl := rec.sent.Get("Content-Length"); cl != "" { // "" would allocate ParseInt's error
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			rec.declared = n
		}
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if len(p) > 0 && (rec.status == http.StatusNoContent || rec.status == http.StatusNotModified) {
		// As net/http refuses it: neither sent nor saved, nor sniffed
		// for a Content-Type, nor counted against MaxSavedResponse.
		return 0, http.ErrBodyNotAllowed
	}
	if rec.declared >= 0 && rec.size+int64(len(p)) > rec.declared {
		// As net/http refuses it: the answer is the length declared.
		return 0, http.ErrContentLength
	}
	rec.size += int64(len(p))
	if rec.streamed {
		return rec.w.Write(p)
	}
	if rec.dropped {
		return len(p), nil
	}
	if int64(rec.body.Len()+len(p)) <= rec.limit {
		return rec.body.Write(p)
	}
	if rec.head {
		// net/http eats the body of an answer to HEAD, however long: here
		// too, past the limit, it is counted and dropped. The answer saved
		// is its status and header, with the type net/http sniffs from the
		// first bytes, never the too-large marker.
		b := rec.body.Bytes()
		rec.sniff(append(b[:min(len(b), sniffLen):min(len(b), sniffLen)], p[:min(len(p), sniffLen)]...))
		rec.body = bytes.Buffer{}
		rec.dropped = true
		return len(p), nil
	}
	rec.streamed = true
	if rec.onStream != nil {
		rec.onStream() // before the first byte goes
	}
	rec.start()
	rec.body = bytes.Buffer{}
	return rec.w.Write(p)
}

// informational sends the 1xx answer code to the real writer, with the
// handler's header as it is now, as net/http sends one. The writer's own
// header is left as it was, for reset.
func (rec *recorder) informational(code int) {
	h := rec.w.Header()
	before := h.Clone()
	clear(h)
	maps.Copy(h, rec.header)
	rec.w.WriteHeader(code)
	clear(h)
	maps.Copy(h, before)
}

// Flush implements http.Flusher, for handlers that stream. While the
// answer is buffered it sends nothing: the answer goes out whole once it is
// saved. Once the answer is streamed (past the limit), it flushes the
// connection, when the underlying writer can.
func (rec *recorder) Flush() {
	rec.FlushError()
}

// FlushError is Flush with its error, which http.ResponseController's Flush
// returns: nil while the answer is buffered; once it streams, the error of
// the connection's flush (a caller that left), so that a streaming handler
// can stop, its context outliving the caller.
func (rec *recorder) FlushError() error {
	if !rec.streamed {
		return nil
	}
	return http.NewResponseController(rec.w).Flush()
}

// CloseNotify implements http.CloseNotifier, deprecated, as net/http's
// writer does: some routers' streaming helpers assert it (gin's
// Context.Stream), and would panic without it. Its channel receives once
// the handler's context ends, with its lease, not when the caller leaves:
// the handler's work runs on and is saved for the caller's retry.
// It returns the same channel each time, as net/http's does, which
// receives one value: a handler that asks for it per event it streams
// starts one goroutine, not one per call.
func (rec *recorder) CloseNotify() <-chan bool {
	rec.closeOnce.Do(func() {
		ch := make(chan bool, 1)
		rec.closeCh = ch
		if done := rec.done; done != nil {
			go func() { // ends with run, which cancels the context
				<-done
				ch <- true
			}()
		}
	})
	return rec.closeCh
}

// SetReadDeadline and SetWriteDeadline set the connection's deadlines for
// http.ResponseController, when the underlying writer can: a handler that
// runs long extends its write deadline, which the answer, written once
// the handler is done, needs. The writer has no other method of
// ResponseController's: a hijacked connection would bypass the record, and
// the request's body is read whole before the handler runs.
func (rec *recorder) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(rec.w).SetReadDeadline(t)
}

func (rec *recorder) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(rec.w).SetWriteDeadline(t)
}

// short reports whether the body is shorter than the Content-Length set
// with the status, an answer that net/http breaks off. The answer to a
// HEAD request, a 204 and a 304 have no body.
func (rec *recorder) short(method string) bool {
	return rec.size < rec.declared && method != http.MethodHead &&
		rec.status != http.StatusNoContent && rec.status != http.StatusNotModified
}

// reset drops what the handler wrote, when nothing was sent yet: the
// header is again the one set before the handler ran.
func (rec *recorder) reset() {
	rec.header = rec.w.Header().Clone()
	rec.sent = nil
	rec.status = 0
	rec.body.Reset()
	rec.dropped = false
}

// finish completes the answer as net/http would: status 200 when none was
// written, and a sniffed Content-Type, so the replay has the same one,
// unless the body is encoded (Content-Encoding), where net/http does not
// sniff.
func (rec *recorder) finish() {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.streamed {
		rec.sniff(rec.body.Bytes())
	}
}

// sniffLen is the most bytes http.DetectContentType considers.
const sniffLen = 512

// sniff sets the Content-Type net/http would send for a body that begins
// with b, when the handler set none and did not encode the body.
func (rec *recorder) sniff(b []byte) {
	if _, ok := rec.sent["Content-Type"]; !ok && len(b) > 0 && rec.sent.Get("Content-Encoding") == "" {
		rec.sent.Set("Content-Type", http.DetectContentType(b))
	}
}

// send writes the buffered answer to the real writer, unless it was
// streamed already, and then the trailers the handler set: net/http sends
// those it finds in the header once the handler returns. A trailer start
// handed it with the header, and that the handler deleted since, is
// deleted, so that its early value is not sent as the trailer.
func (rec *recorder) send() {
	if !rec.streamed {
		rec.start()
	}
	h := rec.w.Header()
	for name := range h {
		if _, ok := rec.header[name]; !ok && rec.trailer(name) {
			delete(h, name)
		}
	}
	for name, vs := range rec.header {
		if rec.trailer(name) {
			h[name] = vs
		}
	}
}

// start writes the status, the header, and the body recorded so far to
// the real writer. The header as it was at WriteHeader replaces the
// writer's: it began as a copy of it, and holds the handler's deletions.
// Its trailers are in it as net/http saw them then: a key with
// http.TrailerPrefix, which net/http does not send in the header but which
// makes it send the answer chunked, for the trailer; the value a declared
// trailer had then, which it sends in the header too.
func (rec *recorder) start() {
	h := rec.w.Header()
	clear(h)
	maps.Copy(h, rec.sent)
	rec.w.WriteHeader(rec.status)
	rec.w.Write(rec.body.Bytes())
}

// trailer reports whether the header named name is a trailer: declared in
// the Trailer header as it was at WriteHeader, as net/http reads it, or
// named with http.TrailerPrefix. (A declared field that net/http does not
// send as a trailer, such as Content-Type, is in the header start hands
// it, where it sends it; send's copy of it after the body changes nothing.)
func (rec *recorder) trailer(name string) bool {
	if strings.HasPrefix(name, http.TrailerPrefix) {
		return true
	}
	for _, v := range rec.sent["Trailer"] {
		for k := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(k)) == name {
				return true
			}
		}
	}
	return false
}
