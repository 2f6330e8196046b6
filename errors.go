package idem

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/unnamed"
	"github.com/idemkit/idem/retry"
)

// Sentinels, each matched with errors.Is against the error RoundTrip returns
// (also through the *url.Error that http.Client wraps it in).
var (
	// ErrNilJar is returned by Transport.RoundTrip, before anything is sent,
	// for a keyed request when Transport.Jar is nil. There is no silent
	// in-memory fallback: keys that vanish on a restart are the bug this
	// package exists to prevent.
	ErrNilJar = errors.New("idem: Transport.Jar is nil; open a jar (keyjar.Open) or use an explicit &idem.MemoryJar{}")
	// ErrInvalidMethods is returned by Transport.RoundTrip, before
	// anything is sent, for a request it does not key while
	// Transport.Methods lists a string that is not a method (a token:
	// "POST " or "post,put" is not), which no request would match: those
	// it was meant to key would go out without a key or a record.
	ErrInvalidMethods = errors.New("idem: Transport.Methods lists a string that is not a method")
	// ErrBodyNotRewindable is returned by Transport.RoundTrip, before
	// anything is sent, for a body that has no GetBody and is larger than
	// Transport.MaxBuffer: it could not be sent again on a retry.
	ErrBodyNotRewindable = errors.New("idem: request body cannot be rewound")
	// ErrRequestBody is returned by Transport.RoundTrip, wrapped with the
	// cause, when the request's body cannot be read or produced again:
	// its reader or GetBody fails, its length is not the request's
	// ContentLength (when that is positive), GetBody gives a reader of
	// memory that holds another length (one it gave before, read), or the
	// caller's context ends while it is read. Before the first send
	// nothing is stored or sent; for a later attempt it is the Err of a
	// *PendingError.
	ErrRequestBody = errors.New("idem: request body")
	// ErrInvalidKey is returned by Transport.RoundTrip, before anything is
	// stored or sent, for a request that carries its own Idempotency-Key
	// when the header is set more than once, or the key is empty, longer
	// than 255 characters, not printable ASCII, begins or ends with a
	// space, holds a comma without being quoted ("a,b"; a server reads
	// a, b as two keys joined into one line), or is quoted but not a
	// Structured Field string (an escape other than \" and \\, no closing
	// quote, text after it): the server would refuse it,
	// and a record whose key cannot be sent would stay pending in the jar.
	ErrInvalidKey = errors.New("idem: invalid Idempotency-Key")
	// ErrInvalidURL is returned by Transport.RoundTrip, wrapped, before
	// anything is stored or sent, for a keyed request whose URL has no
	// host, such as a server address given without its scheme
	// ("localhost:8080/v1/charges" parses as a URL of scheme "localhost")
	// or without the // after it, whose port is 0 or above 65535 (which
	// url.Parse accepts), or, when Base is an *http.Transport (or nil),
	// whose scheme is neither http nor https ("htp://", which net/http
	// refuses unsent; a protocol registered with RegisterProtocol for
	// another scheme is not looked up: wrap such a Base in a RoundTripper
	// of your own): no request can be sent there, a record of it would stay
	// pending in the jar, and the same call with its URL fixed would be
	// another request (a *MismatchError).
	ErrInvalidURL = errors.New("idem: invalid request URL")
	// ErrInvalidHeader is returned by Transport.RoundTrip, wrapped, before
	// anything is stored or sent, for a keyed request whose header or
	// trailer holds a field name that is not an HTTP token, or a value
	// with a control character other than a tab (a line break, a NUL),
	// when Base is an *http.Transport (or nil, or one that Base wraps and
	// returns from an Unwrap() http.RoundTripper method): net/http refuses
	// it unsent, each attempt alike ("net/http: invalid header field
	// value"), and a record of it would stay pending in the jar. So is a
	// method that is not a token ("net/http: invalid method", though an
	// HTTP/2 connection already open sends it).
	ErrInvalidHeader = errors.New("idem: invalid request header")
	// ErrAbandoned is returned by Transport.RoundTrip, wrapped, when the
	// operation was abandoned (client.Abandon) while the call waited for
	// another holder's lease: nothing is sent. A new call with the same
	// name starts a new operation, with a new key.
	ErrAbandoned = errors.New("idem: operation abandoned")
	// ErrMismatch matches *MismatchError.
	ErrMismatch = errors.New("idem: operation reused with a different request")
	// ErrReconcile matches *ReconcileError.
	ErrReconcile = errors.New("idem: operation past its retry horizon")
	// ErrPending matches *PendingError.
	ErrPending = errors.New("idem: operation outcome unknown")
	// ErrNotSent is for a base transport to wrap in the error of an
	// attempt that it did not send at all, and says so for certain: a
	// circuit breaker or rate limiter that refused it, credentials it
	// could not get (client.Options.Header's error is wrapped in it). The
	// Transport does not count the attempt, nor retry it: RoundTrip
	// returns a *PendingError wrapping the error, the operation as it was
	// (the Budget gets the retry's cost back). An operation sent without a
	// name (neither WithOperation nor a key of the caller's) that was
	// never sent is abandoned instead, and the error, which wraps
	// ErrNotSent, is not a *PendingError: no call can name it, and a resume
	// of every pending operation would send it. A base transport must not
	// wrap it in an error after any byte of the request may have left:
	// the operation would be taken for one that did not happen. The
	// Transport wraps it itself in the error of the Proxy function of a
	// Base that is an *http.Transport, which net/http returns before it
	// dials; package client's Base does, over such a Transport.
	ErrNotSent = errors.New("idem: the base transport did not send the attempt")
)

// MismatchError is returned by Transport.RoundTrip, before anything is sent,
// when a named operation already in the jar is called with a different
// request (method, URL or body; or the same body under another media type,
// see StoredType) or a different Idempotency-Key, or when the
// name was abandoned and begun again by another call while this one waited
// for its lease. Reusing a
// key with other parameters is a client bug: the server would answer 422.
//
// Package client also reports a server's 422 as a MismatchError, with
// Stored and Got empty: the reference server sends it for a key used for a
// different request, and an API may send it for a request it will not
// process (its own validation); the body says which.
type MismatchError struct {
	Op, Key string
	// Stored and Got are the fingerprints of the stored and the new
	// request; equal when only the key or the media type differs, empty
	// for a server's 422.
	Stored, Got string
	// GotKey is the caller's Idempotency-Key, when it differs from Key.
	GotKey string
	// StoredType and GotType are the media types of the stored and the
	// new request (their Content-Type without parameters, as
	// mime.ParseMediaType gives it; "" for none), when they differ: the
	// same bytes under another type are another request to a server whose
	// fingerprint counts the type, as the reference server's does.
	StoredType, GotType string
	// State is the stored operation's state, "" when unknown (a server's
	// 422). A pending one stays pending: a new name does not resolve it.
	State State

	// redirect names the redirect an http.Client follows with this
	// request ("307 redirect of POST URL"), when it does: a new name is
	// not the fix its caller needs.
	redirect string
}

func (e *MismatchError) Error() string {
	if e.GotKey == "" && e.Stored != "" && e.Stored == e.Got && e.StoredType == e.GotType {
		// The same request, and a key the caller did not set: the name was
		// abandoned (or forgotten) and begun again under a new key meanwhile.
		return fmt.Sprintf("idem: operation %q was abandoned or forgotten and begun again, under key %q, by another call after this one found it; this call's request is the same, but its key is no longer the operation's: nothing was sent", e.Op, e.Key)
	}
	var msg string
	switch {
	case e.Got == "":
		// A server's 422: the server does not say which of its meanings
		// it has.
		msg = fmt.Sprintf("idem: operation %q (key %q): the server refused the request with 422, which the reference server sends when the key was used for a different request, and which an API may also send for a request it will not process; do not retry it under this key", e.Op, e.Key)
	case e.GotKey != "" && e.GotKey != e.Key:
		msg = fmt.Sprintf("idem: operation %q has key %q; the request carries key %q", e.Op, e.Key, e.GotKey)
	case e.StoredType != e.GotType:
		msg = fmt.Sprintf("idem: operation %q (key %q) was first sent with %s, this request has %s: a server that counts the type takes them for different requests; send it with the first's type, or use a new operation name for a new request", e.Op, e.Key, contentType(e.StoredType), contentType(e.GotType))
	case e.redirect != "":
		msg = fmt.Sprintf("idem: operation %q (key %q) was first sent with a different method, URL or body: this request follows the %s, which the http.Client sends again under the operation's name; to get the redirect back as the answer, set the http.Client's CheckRedirect to return http.ErrUseLastResponse", e.Op, e.Key, e.redirect)
	default:
		msg = fmt.Sprintf("idem: operation %q (key %q) was first sent with a different method, URL or body; use a new operation name for a new request", e.Op, e.Key)
	}
	if e.State == StatePending {
		msg += "; the first stays pending until it is sent again unchanged, or abandoned once it is known not to have happened and not to be running"
	}
	return msg
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// ReconcileError is returned by Transport.RoundTrip, before anything is
// sent, when the operation's first send is older than the policy's
// Horizon, or when it is in StateReconcile. A pending operation is marked
// StateReconcile; a done or failed one keeps its known outcome. Ask the server what
// happened (look the resource up); if it did not happen and is not
// executing, Abandon the operation and start a new one.
type ReconcileError struct {
	Op, Key    string
	Created    time.Time     // the record's Created: when the key was stored, before the first send
	Horizon    time.Duration // the policy's horizon
	Attempts   int           // the record's Attempts
	LastStatus int           // last answer's status, 0 when none
	// State is the record's: StateReconcile, or the known outcome that a
	// done or failed operation keeps (StateDone, StateFailed).
	State State

	at time.Time // when the call found it past the horizon, for Error
}

func (e *ReconcileError) Error() string {
	msg := fmt.Sprintf("idem: operation %q (key %q) was first sent at %s, more than %v ago: not retried; ",
		e.Op, e.Key, e.Created.UTC().Format(time.RFC3339), e.Horizon)
	if !e.at.IsZero() && e.Created.Sub(e.at) > retry.ClockAhead {
		msg = fmt.Sprintf("idem: operation %q (key %q) was first sent at %s by its record, more than %v ahead of this clock (a clock that ran ahead): its age is unknown, and it is not retried; ",
			e.Op, e.Key, e.Created.UTC().Format(time.RFC3339), retry.ClockAhead)
	}
	if e.State == StateDone || e.State == StateFailed {
		// Abandon refuses an operation whose outcome is known.
		return msg + fmt.Sprintf("its outcome is known (%s, status %d): forget it to begin it again under a new key", e.State, e.LastStatus)
	}
	return msg + "reconcile with the server, then abandon or forget it"
}

// Is reports whether target is ErrReconcile.
func (e *ReconcileError) Is(target error) bool { return target == ErrReconcile }

// PendingError is returned by Transport.RoundTrip when it stops without a
// response: the budget is spent on network errors; the caller's context
// ended (even after a retryable response), or its deadline would come
// before the end of a wait (for the next retry or the stored NextAttempt),
// in which case the call returns at once, matching
// context.DeadlineExceeded (a wait for another holder's lease, which may
// end sooner, is made in backoff steps, and stops so at the first step
// that would end past the deadline); another holder is sending the
// operation; an earlier answer's Retry-After (the stored NextAttempt) is
// beyond the call's budget; an attempt failed with an error that is not
// retried (retry.Classify: a TLS certificate, a TLS alert from the
// server refusing the client's, an address no dial takes, a host name that
// does not exist); or, after the first send, the body could not be
// produced again or the jar failed. The outcome is unknown and the operation stays
// pending in the jar: a later call with the same operation name resumes it
// with the same key. (But one sent without a name whose every attempt
// failed to connect through net/http's Transport, its body unread, is
// abandoned instead, with an error that is no *PendingError: a dial
// refused, a host name that does not exist, the proxy's alike, a server
// certificate the client refused.) A call sent without a name (neither
// WithOperation nor an Idempotency-Key of the caller's) got a generated
// one, Op: the same
// call made again without a name is a new operation under a new key, which
// its message says. An operation whose outcome the jar already holds
// (State done or failed), which a call sends again for the server's saved
// answer, keeps it: only this call's answer is missing, and a later call
// with the name asks for it again.
type PendingError struct {
	Op, Key    string
	Attempts   int           // attempts this call sent
	LastStatus int           // status of the last answer, 0 when none
	Elapsed    time.Duration // time this call spent
	// NextAttempt, when not zero, is the earliest time to send again: an
	// earlier answer's Retry-After, or, for an operation another holder
	// leases, the end of its lease (unless that holder ends it first).
	NextAttempt time.Time
	Err         error // the last error (a network or context error, ErrLeased; the jar's LastError, masked, where this call sent nothing), or nil; Error quotes it with the passwords it quotes masked (a URL's user:xxxxx@ and its query's secrets, ?api_key=xxxxx; a connection string's password=xxxxx)
	// State is the operation's state as the call last read it from the
	// jar: StatePending (or "", the same), or StateDone or StateFailed for
	// an operation sent again for the server's saved answer. Such an
	// error still matches ErrPending, as the call's answer is unknown,
	// but Resume refuses the operation: call it again.
	State State
	// Reason says why the call stopped, in a few words, as OnGiveUp's
	// Event.Reason does: "retry budget empty after network error",
	// "MaxAttempts (5) reached after status 503", "the call's context
	// ended", "operation leased by another holder"…; "" when not known.
	Reason string

	// unnamed is set for a call sent without a name (neither WithOperation
	// nor a key of the caller's): its operation's name was generated.
	unnamed bool
}

func init() {
	unnamed.Mark = func(err error) {
		if pe, ok := err.(*PendingError); ok {
			pe.unnamed = true
		}
	}
}

func (e *PendingError) Error() string {
	var msg, again string
	if e.State == "" || e.State == StatePending {
		msg = fmt.Sprintf("idem: operation %q (key %q) still pending after %d attempt(s) in %v%s, outcome unknown; ", e.Op, e.Key, e.Attempts, e.Elapsed.Round(time.Millisecond), e.because())
		again = "resume it"
	} else {
		msg = fmt.Sprintf("idem: operation %q (key %q) is %s, its outcome known, but this call, which sent it again for the server's saved answer, got none after %d attempt(s) in %v%s; ",
			e.Op, e.Key, e.State, e.Attempts, e.Elapsed.Round(time.Millisecond), e.because())
		again = "call it again"
	}
	name := " under the same name"
	if e.unnamed {
		name = " under its name"
	}
	if e.NextAttempt.IsZero() {
		msg += again + " later" + name
	} else {
		msg += again + name + " after " + e.NextAttempt.UTC().Format(time.RFC3339)
	}
	if e.unnamed {
		msg += " (the call had none, and one made again without a name is a new operation under a new key)"
	}
	if e.Err != nil {
		// As the jar's LastError keeps it: net/http's error for a
		// malformed HTTPS_PROXY quotes the proxy's password.
		msg += ": " + dsn.MaskPasswords(e.Err.Error())
	}
	return msg
}

// because is Reason in parentheses, or "".
func (e *PendingError) because() string {
	if e.Reason == "" {
		return ""
	}
	return " (" + e.Reason + ")"
}

// Unwrap returns the last error, so that errors.Is(err, context.Canceled)
// and errors.As(err, &netErr) work.
func (e *PendingError) Unwrap() error { return e.Err }

// Is reports whether target is ErrPending.
func (e *PendingError) Is(target error) bool { return target == ErrPending }

// Timeout reports whether the call stopped on a timeout: Err, or an error
// it wraps, says so by its Timeout method (a context's deadline, an
// attempt's, a dial's or a read's). http.Client's *url.Error asks the error
// it wraps, and os.IsTimeout asks it: they say of a call through the
// Transport what they say of one through net/http.
func (e *PendingError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// JarError is returned by Transport.RoundTrip when the jar fails before the
// send: nothing is sent (fail closed). A record the failing Begin may have
// written all the same is abandoned, so that no resume sends it; the next
// call with the operation's name begins it again under a new key. The
// abandon is a second write to the failing jar, within the request's
// context: a jar that is down fails the call once both gave up, each after
// its own retries (pgjar: about twice Options.QueryTimeout each, so 20 s
// at the default when the server is down; a session it refuses, such as a
// wrong password's, fails at once). Bound the call with its request's
// context to fail sooner.
type JarError struct {
	Op  string
	Err error
}

// Error says that the call sent nothing, which a log line read without the
// type would not tell from an outcome left unknown.
func (e *JarError) Error() string {
	return fmt.Sprintf("idem: jar: operation %q, nothing sent: %v", e.Op, e.Err)
}

// Unwrap returns the jar's error.
func (e *JarError) Unwrap() error { return e.Err }

// contentType names a media type in a *MismatchError's message.
func contentType(mt string) string {
	if mt == "" {
		return "no Content-Type"
	}
	return fmt.Sprintf("Content-Type %q", mt)
}
