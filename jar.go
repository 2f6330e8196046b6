package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/secrethdr"
)

// State is where an operation stands in a Jar.
//
//	         Begin (durable)          final answer               Forget
//	(none) ──────────────▶ pending ─────────────────▶ done ──────────────▶ (gone)
//	                          │  422 ─────────────────▶ failed
//	                          │  older than Horizon ──▶ reconcile
//	                          │  Abandon ─────────────▶ abandoned
//	                          └─ crash, ctx cancelled, budget spent, a call with
//	                             another request (*MismatchError): stays pending
type State string

const (
	// StatePending: the key is persisted and the outcome is unknown. The
	// operation is resumed with the same key.
	StatePending State = "pending"
	// StateDone: a final answer was received: one that retry.Classify
	// calls Final (a 408, 409, 425, 429, 502, 503 or 504 only when replayed), but a
	// 401 or 407, which leaves the state as it was; and a 401 or 407 to the
	// only send of a call without a name, which no call can resume.
	StateDone State = "done"
	// StateFailed: the server refused the request with 422, which the
	// reference server sends for a key used for a different request, and
	// an API may also send for a request it will not process. The
	// Transport does not retry it and client.Resume
	// refuses it; the same operation called again is sent again with the
	// same key, and gets the server's answer (the same refusal, as a done
	// operation gets its replay).
	StateFailed State = "failed"
	// StateReconcile: the first send is older than the retry horizon. The
	// caller must find out from the server what happened; the SDK will not
	// send it again.
	StateReconcile State = "reconcile"
	// StateAbandoned: the caller established that the original did not
	// happen and is not executing. Begin may then reuse the name with a new key.
	StateAbandoned State = "abandoned"
)

// Valid reports whether s is one of the states above.
func (s State) Valid() bool {
	switch s {
	case StatePending, StateDone, StateFailed, StateReconcile, StateAbandoned:
		return true
	}
	return false
}

// Record is one logical operation as a Jar stores it.
type Record struct {
	Op          string // the operation's name; unique in a jar
	Key         string // the Idempotency-Key sent on every attempt
	Fingerprint string // hex SHA-256 of method, URL and canonical body
	State       State

	// The request, so that it can be resumed after a restart. URL and
	// Header never hold credentials: the URL has no userinfo (a record of
	// an earlier version, which kept it, may; its resume sends it), and
	// the header no value of what SecretHeader names: each such header the
	// request carried is kept by name with no values (see Withheld), which
	// a resume must add again. (A record of a version whose SecretHeader
	// named fewer may hold one with its values; its resume sends them too,
	// see NewRequest.) Nor does the URL hold a #fragment, which net/http does
	// not send (a record of an earlier version may). Header holds a "Host" entry
	// when the request's Host was not its URL's host (a virtual host reached
	// by address); NewRequest makes it the request's Host again. Body is
	// nil when the body was larger than the transport's MaxStoredBody;
	// BodySize is its length.
	Method   string
	URL      string
	Header   http.Header
	Body     []byte
	BodySize int64

	Created time.Time // when the key was persisted, before the first send; the horizon runs from here
	Updated time.Time // last change
	// Attempts counts the attempts across calls and restarts. Each is
	// counted before it is sent, so that one a crash cuts off shows: a
	// process killed before its first send leaves 1.
	Attempts    int
	LastStatus  int       // status of the last answer; 0 when none
	LastError   string    // the last attempt's error, as valid UTF-8 and, as the Transport writes it, the passwords it quotes masked (a URL's user:xxxxx@, a connection string's password=xxxxx); "" when none
	NextAttempt time.Time // zero, or the earliest time the server asked to be retried at
	Note        string    // why the operation is in its state (abandon reason, reconcile hint)

	// The lease: at most one holder sends the operation at a time, across
	// goroutines and processes. Holder is "" when free.
	Holder     string
	LeaseUntil time.Time
}

// BodyStored reports whether the record holds the whole request body.
func (r Record) BodyStored() bool { return int64(len(r.Body)) == r.BodySize }

// Withheld returns the names, canonical and sorted, of the credentials the
// operation's first send carried and the jar does not keep: the headers
// SecretHeader names that Header holds with no values. A resume without
// them is a request the server may refuse, or, where it scopes keys by
// credential, take for a new one and run again: client.Resume refuses to
// send it when its Client cannot add them (client.ErrCredentials), and a
// caller of NewRequest adds them before sending. A record written before
// the jars kept these names withholds none. AddedCredentials among them
// stands for credentials the program added to each attempt itself.
func (r Record) Withheld() []string { return secrethdr.Withheld(r.Header) }

// AddedCredentials is the name that Record.Withheld gives the credentials
// a program added to each attempt itself, as client.Options.Header adds
// them, which leave no name of their own in the record: a client.Client
// records it for each operation it begins with Options.Header set. No
// request carries a header of that name: a resume is to add whatever
// credentials the program added (client.Resume sends such an operation
// only through a Client with Options.Header, and idemctl resume only
// given at least one credential, unless told to send it without).
// A Transport whose Base adds credentials records nothing of them.
const AddedCredentials = secrethdr.Added

// ErrBodyNotStored is returned, wrapped with the operation's name, by
// Record.NewRequest for a record that does not hold its request's body (it
// was larger than Transport.MaxStoredBody): the caller must supply the body
// again. client.Resume returns it too.
var ErrBodyNotStored = errors.New("idem: the request body is not stored in the jar")

// NewRequest returns the request that r stores, to resume its operation
// through a Transport over the jar that holds r: its method, URL, Host,
// header and body, with GetBody and ContentLength set (an empty body is
// none: Body and GetBody nil, ContentLength 0), and a context that is ctx
// with r.Op as the operation's name (WithOperation). The Transport sends it
// as it sends any call under that name: under r's key, unless the operation
// was abandoned or forgotten meanwhile, when the name begins a new
// operation under a new key (client.Resume sends only a pending one). The
// header has no credentials (see SecretHeader), but those a record of an
// earlier version may hold, which it keeps: add them before sending, those
// r.Withheld names at least, which it leaves out.
// NewRequest returns an error wrapping ErrBodyNotStored when r does not
// hold the whole body, and an error, as http.NewRequestWithContext does,
// for a nil ctx, and for a URL that does not parse (url.Parse's *url.Error,
// its password masked, user:xxxxx@, in its URL and in its Err, as
// client.PostJSON masks it).
func (r Record) NewRequest(ctx context.Context) (*http.Request, error) {
	if ctx == nil {
		return nil, fmt.Errorf("idem: operation %q: nil Context", r.Op)
	}
	if !r.BodyStored() {
		return nil, fmt.Errorf("idem: operation %q: %w (%d bytes)", r.Op, ErrBodyNotStored, r.BodySize)
	}
	var b io.Reader
	if len(r.Body) > 0 {
		b = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(WithOperation(ctx, r.Op), r.Method, r.URL, b)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		// url.Parse's error quotes the URL as stored: its password, which
		// a record of an earlier version may keep, is masked.
		dsn.MaskURLError(ue, r.URL)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: operation %q: stored request: %w", r.Op, err)
	}
	if r.Header != nil {
		// A header that SecretHeader names, which a record of a version
		// whose SecretHeader named fewer may hold (CB-ACCESS-PASSPHRASE),
		// is sent as stored, not dropped: the first send carried it, and a
		// server that scopes keys by credential would take a resume
		// without it for a new operation and run it again. Whoever can
		// write the jar, and so point the request at another host, can
		// read the header there already; a value the caller sets with
		// Header.Set (client.Options.Header, idemctl's --header) replaces
		// it.
		req.Header = r.Header.Clone()
		if h := req.Header[hostHeader]; len(h) > 0 {
			req.Host = h[0]
		}
		// A record written before storedHeader matched Host in any case
		// may hold the caller's "host" too. A withheld credential's name
		// is left out, for the caller to set: an entry with no values is
		// not a header net/http sends, but one a caller who ranges over
		// the header or tests its keys would take for set.
		for name, vs := range req.Header {
			if isHostHeader(name) || secrethdr.IsWithheld(name, vs) {
				delete(req.Header, name)
			}
		}
	}
	return req, nil
}

// Change is what Jar.Update applies to a record, atomically.
type Change struct {
	Now        time.Time // becomes Updated
	State      State     // the new state; "" keeps the current one
	Attempts   int       // added to Attempts
	LastStatus int       // replaces LastStatus: 0 clears it
	LastError  string    // replaces LastError: "" clears it
	// NextAttempt replaces NextAttempt: the zero time clears it.
	NextAttempt time.Time
	Note        string // replaces Note when not ""; "" keeps the current one
	Release     bool   // drop the lease; false keeps it
}

// A Jar stores operations durably. *keyjar.Jar (SQLite), pgjar (PostgreSQL)
// and MemoryJar implement it. Implementations must be safe for concurrent use
// and keep these rules:
//
//   - Begin is an atomic get-or-create across goroutines and, for jars on
//     shared storage, across processes: two callers never create two records
//     for one name. The created record is durable (on stable storage) before
//     Begin returns. An existing record is returned unchanged with
//     created=false, except one in StateAbandoned, which Begin replaces.
//   - Acquire takes the lease on op for holder until now+ttl when the lease is
//     free, held by holder, or expired at now; otherwise it returns the
//     record and ErrLeased.
//   - Update applies c to op. When holder is not "", the change is fenced:
//     if op's lease is no longer held by holder, nothing changes and Update
//     returns ErrLeaseLost. Update need not be durable at return: losing it
//     on power loss only causes a re-send that the server replays. A change
//     to StateAbandoned is the exception, durable before Update returns as
//     a created record is: lost, it would leave pending an operation that
//     the caller established did not happen, and a resume would send it.
//   - Get, Acquire and Update return ErrNotFound for an unknown op.
//   - Begin reads an empty State as StatePending. It refuses a record
//     without Op or Key or with a State that is not Valid, and Update a
//     Change whose State is neither "" nor Valid: it returns an error and
//     writes nothing. The error is the jar's own (ErrInvalidRecord for
//     MemoryJar); a jar may also refuse what it cannot store.
//   - Credentials are never written: callers keep the names of the
//     headers SecretHeader names with no values (see Record.Withheld), and
//     a jar may take their values out again; a jar that drops the names
//     too loses only what Withheld reports.
//   - Begin copies what it keeps of r: r.Header and r.Body may be the
//     caller's own, as the Transport passes its request's. A caller that
//     changes them after Begin, or changes a record a jar returned,
//     changes nothing the jar holds. The record Begin returns for an
//     operation it created may hold r.Header and r.Body themselves
//     (MemoryJar's does), which stay the caller's: the jar neither keeps
//     nor writes to them. This is database/sql's rule for a driver, which
//     must not retain the []byte it is given: the jar owns its copy, the
//     caller what it passed, and the Transport, which only reads the
//     record it gets back, pays for no second copy on a call's path.
type Jar interface {
	Begin(ctx context.Context, r Record) (rec Record, created bool, err error)
	Get(ctx context.Context, op string) (Record, error)
	Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (Record, error)
	Update(ctx context.Context, op, holder string, c Change) (Record, error)
}

// A Deferrer is a Jar that can also take a Change without the caller waiting
// for it to be written. The Transport uses it for the changes it makes after
// an attempt, whose result it does not read (done, failed, the lease's
// release); they then cost a call nothing. *keyjar.Jar, *pgjar.Jar and
// MemoryJar implement it.
//
// Defer makes the change that Update(ctx, op, holder, c) would make, later:
//
//   - Deferred changes are applied in order with the jar's other writes, and
//     the jar's own reads see them: once Defer returned, a Get, List, Begin,
//     Acquire or Update on the same jar observes the change.
//   - Defer returns an error only when the change cannot be queued (the jar is
//     closed, the change is invalid). A fenced change refused when applied
//     (ErrLeaseLost, ErrNotFound), or one lost to a database error or a
//     crash, is dropped: the record stays as it was, at worst pending, which
//     a resume settles with the server's replay. The jar's Close reports
//     the changes dropped on an error (ErrDropped).
type Deferrer interface {
	Jar
	Defer(op, holder string, c Change) error
}

// Errors returned by Jar implementations.
var (
	// ErrNotFound is returned by Jar.Get, Jar.Acquire and Jar.Update for an
	// operation that is not in the jar.
	ErrNotFound = errors.New("idem: operation not found in jar")
	// ErrLeased is returned by Jar.Acquire when another holder's lease on the
	// operation has not expired.
	ErrLeased = errors.New("idem: operation is being sent by another holder")
	// ErrLeaseLost is returned by Jar.Update when the holder's lease was taken
	// over: the change was not applied.
	ErrLeaseLost = errors.New("idem: lease lost to another holder")
	// ErrNotForgotten is returned by the ForgetKey method of
	// *keyjar.Jar, *pgjar.Jar and *MemoryJar (client.KeyForgetter) when
	// the operation's record has another key than the one given, or is
	// pending: nothing was deleted.
	ErrNotForgotten = errors.New("idem: operation not forgotten: it has another key or is pending")
	// ErrNotAbandoned is returned by the AbandonKey method of *keyjar.Jar
	// and *pgjar.Jar when the operation's record has another key than the
	// one given, is neither pending nor reconcile, or is leased to another
	// holder: nothing was changed.
	ErrNotAbandoned = errors.New("idem: operation not abandoned: it has another key, is neither pending nor reconcile, or is leased")
	// ErrDropped is returned, wrapped, by the Close method of *keyjar.Jar
	// and *pgjar.Jar when changes that Defer accepted since the jar was
	// opened were dropped on an error (not on a fence: see Deferrer), as
	// os.File's Close reports a write that did not reach the disk. Their
	// operations stay as they were, at worst pending, which a resume
	// settles with the server's replay. The jar is closed all the same.
	ErrDropped = errors.New("idem: deferred changes were dropped")
)

// RecordError is returned, wrapped, by the Begin, Get, List, ByKey,
// Acquire and Update methods of *keyjar.Jar and *pgjar.Jar for a stored
// record that does not decode: its header is not the JSON the jar writes,
// or (keyjar, whose table does not refuse it) its state is not a State;
// damaged in the database, or written there by another program. List and
// ByKey return no record then, as for any error, and Acquire and Update
// change nothing. Record holds the fields that did decode (Op, Key,
// State, the times, all but Header and Body), so that a tool can name the
// record, read on past it (Record.Cursor as Filter.After), forget it and,
// pending, abandon it (the jars' AbandonKey, which reads no header); Err says what did not decode, and matches the jar's own error for a
// damaged record (keyjar.ErrCorrupt; pgjar has none).
type RecordError struct {
	Record Record
	Err    error
}

func (e *RecordError) Error() string { return e.Err.Error() }

func (e *RecordError) Unwrap() error { return e.Err }

// Apply applies c to r, as Jar.Update does once the fencing check passed. It
// is exported for Jar implementations.
func (c Change) Apply(r *Record) {
	r.Updated = c.Now
	if c.State != "" {
		r.State = c.State
	}
	r.Attempts += c.Attempts
	r.LastStatus = c.LastStatus
	r.LastError = c.LastError
	r.NextAttempt = c.NextAttempt
	if c.Note != "" {
		r.Note = c.Note
	}
	if c.Release {
		r.Holder = ""
		r.LeaseUntil = time.Time{}
	}
}

// CanLease reports whether holder may take r's lease at now: the lease is
// free, already held by holder, or expired. It is exported for Jar
// implementations.
func (r Record) CanLease(holder string, now time.Time) bool {
	return r.Holder == "" || r.Holder == holder || !now.Before(r.LeaseUntil)
}
