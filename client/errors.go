package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/internal/ctlesc"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/stopped"
	"github.com/idemkit/idem/retry"
)

// Sentinels, each returned wrapped with the operation's name: test with
// errors.Is.
var (
	// ErrState is matched by the *StateError that Resume and
	// ResumeWithBody return for an operation that is not pending (done,
	// failed or abandoned) when they read it or once they have its lease
	// (nothing is sent), Abandon for one whose outcome is known (done or
	// failed), and Forget for a pending one, or for one that a call began
	// again, under a new key, after Forget read it.
	ErrState = errors.New("client: the operation's state does not allow this")
	// ErrBodyNotStored is returned by Resume when the jar did not store the
	// operation's body (it was larger than Options.MaxStoredBody): resume
	// it with ResumeWithBody. Past the operation's horizon, Resume returns
	// an *idem.ReconcileError instead. It is idem.ErrBodyNotStored, which
	// idem.Record.NewRequest returns.
	ErrBodyNotStored = idem.ErrBodyNotStored
	// ErrNoReason is returned by Abandon for an empty reason.
	ErrNoReason = errors.New("client: abandoning an operation needs a reason")
	// ErrMethod is returned by Resume and ResumeWithBody for an operation
	// whose method the Client does not key (not in Options.Methods: by
	// default anything but POST and PATCH), one recorded by an
	// idem.Transport or a Client with other Methods: resume it through a
	// Client whose Options.Methods include it; and by PostJSON when
	// Options.Methods leave POST out.
	ErrMethod = errors.New("client: the Client does not key this method")
	// ErrTooLarge is returned by PostJSON and ResumeJSON, with the
	// Response, for a 2xx answer whose body is larger than
	// Options.MaxJSONBody: nothing is decoded, and the operation did
	// happen.
	ErrTooLarge = errors.New("client: the answer is larger than MaxJSONBody")
)

// ErrCredentials is matched by the *CredentialsError of Resume, ResumeJSON
// and ResumeWithBody.
var ErrCredentials = errors.New("client: the resume lacks the credentials of the first send")

// CredentialsError is returned by Resume, ResumeJSON and ResumeWithBody for
// a pending operation whose first send carried credentials on its request
// (idem.Record.Withheld: the jar keeps their names, not their values)
// when the Client has no Options.Header to add them, or when
// Options.Header did not add them all: sent without them, the request
// would be refused, or taken for a new one and run again by a server that
// scopes keys by credential. Nothing was sent. Without Options.Header
// nothing changed either; when Options.Header left one out, the error is
// a *idem.PendingError's, which wraps it and idem.ErrNotSent: the
// attempt is not counted, and the operation stays pending. It matches
// ErrCredentials.
type CredentialsError struct {
	Op, Key string
	Missing []string // the headers' names, canonical and sorted

	header bool // Options.Header ran and did not add them
}

func (e *CredentialsError) Error() string {
	why := "the Client has no Options.Header to add them"
	if e.header {
		why = "Options.Header did not add them"
	}
	names := make([]string, 0, len(e.Missing))
	for _, name := range e.Missing {
		if name == idem.AddedCredentials {
			// No header of that name: what the Options.Header of the
			// Client that began it added.
			name = "credentials its Client's Options.Header added (" + name + ")"
		}
		names = append(names, name)
	}
	// ErrCredentials's text without its "client: ", which begins the message.
	return fmt.Sprintf("client: resume %q: its first send carried %s, which the jar does not keep, and %s; nothing was sent: %s",
		e.Op, ctlesc.Escape(strings.Join(names, ", ")), why, strings.TrimPrefix(ErrCredentials.Error(), "client: "))
}

// Is reports whether target is ErrCredentials.
func (e *CredentialsError) Is(target error) bool { return target == ErrCredentials }

// ErrOptions is returned by New for arguments that name no jar, or two
// (neither a path nor Options.Jar, or both), for Options.JarOptions
// beside Options.Jar (they configure only the jar file New opens), and
// for an Options.Methods that is empty but not nil, which would key no
// request, or lists a string that is not a method.
var ErrOptions = errors.New("client: invalid options")

// ErrNilContext is returned, wrapped, by New and by every method of the
// Client that takes a context (Do, PostJSON, Pending, the resumes, Abandon
// and Forget) when that context is nil: nothing is opened, sent, read or
// changed. net/http's NewRequestWithContext refuses a nil Context with an
// error, not a panic, and so do they; net/http exports no sentinel for it,
// and ErrOptions names New's choice of a jar, which a call's context is
// not, hence a sentinel of its own.
var ErrNilContext = errors.New("client: nil Context")

// ErrNilRequest is returned, wrapped, by Do for a nil request, which
// http.Client.Do panics on: nothing is sent or stored.
var ErrNilRequest = errors.New("client: nil Request")

// StateError is the error of Resume, ResumeWithBody, Abandon and Forget
// for an operation whose state does not allow the call; nothing was sent,
// changed or deleted. It matches ErrState.
type StateError struct {
	Op, Key string // the operation, and its key when the call read it
	// State is the operation's state: done, failed or abandoned for
	// Resume and ResumeWithBody, done or failed for Abandon, pending for
	// Forget. It is "" when Forget found the record changed after it read
	// it (begun again under a new key, or pending); the error then also
	// matches idem.ErrNotForgotten.
	State idem.State

	verb   string // the call: "resume", "abandon" or "forget"
	detail string // what follows the state in the message
	err    error  // the jar's refusal, for Forget
}

func (e *StateError) Error() string {
	msg := fmt.Sprintf("client: %s %q: ", e.verb, e.Op)
	if e.verb == "" {
		msg = fmt.Sprintf("client: operation %q: ", e.Op)
	}
	if e.State != "" {
		msg += "the operation is " + string(e.State)
	}
	// ErrState's text without its "client: ", which begins msg.
	msg += e.detail + ": " + strings.TrimPrefix(ErrState.Error(), "client: ")
	if e.err != nil {
		msg += " (" + e.err.Error() + ")"
	}
	return msg
}

// Is reports whether target is ErrState.
func (e *StateError) Is(target error) bool { return target == ErrState }

// Unwrap returns the jar's refusal that Forget met (idem.ErrNotForgotten),
// or nil.
func (e *StateError) Unwrap() error { return e.err }

// StatusError is returned by Do, PostJSON and Resume for an answer that is
// not 2xx. Err, when not nil, says what the answer means for the
// operation. Its message holds the status and the start of the body on
// one line, their control characters and bidi format characters escaped
// (\x1b, \u202e; then backslashes and quotes too, \\ and \"): printed to a
// terminal, a server's answer does not run or reorder itself there.
// Status and Body are as the server sent them.
type StatusError struct {
	Op, Key    string // "" for an answer to a request without a key (a GET, or a redirect's)
	Method     string
	URL        string // the request's URL, its password (user:password@) masked as in url.URL.Redacted, and the values of query parameters whose names say they hold a secret (?api_key=xxxxx), as idem masks them
	StatusCode int
	Status     string // as in http.Response: "503 Service Unavailable"
	Header     http.Header
	Body       []byte // the body, at most Options.MaxErrorBody bytes of it
	Replayed   bool   // the server replayed a saved answer
	// Err is *idem.MismatchError for 422 (the server's refusal: of a key
	// used for a different request, as the reference server means it, or
	// of a request the API will not process, which Body may say; Stored
	// and Got are empty, the server does not say them), *ConflictError for 409 and *idem.PendingError for
	// 408, 425, 429, 502, 503 and 504 when the call's attempts or budget ran out,
	// and *idem.PendingError for 401 and 407 (the credentials were refused,
	// the request not applied), whose State is the operation's: pending, or
	// done or failed for one sent again for its saved answer; but nil for a
	// call without a name refused at its only send; nil otherwise.
	Err error
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("client: %s %s: %s", e.Method, e.URL, ctlesc.Escape(e.Status))
	if e.Replayed {
		msg += " (replayed)"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if ex := ctlesc.Escape(excerpt(e.Body, 200)); ex != "" {
		msg += ": " + ex
	}
	return msg
}

// Unwrap returns Err.
func (e *StatusError) Unwrap() error { return e.Err }

// ConflictError is the Err of a *StatusError for a 409 Conflict left when
// a call's attempts or budget ran out: the server is still running an
// earlier attempt with the same key. The outcome is unknown and the
// operation stays pending: Resume it later, with the same key. An
// operation whose outcome the jar already holds (State done or failed),
// which the call sent again for the server's saved answer, keeps it: only
// this call's answer is missing, and Resume refuses it; call it again
// later with the name. It matches idem.ErrPending, as *idem.PendingError
// does in both cases.
type ConflictError struct {
	Op, Key  string
	Attempts int // attempts this call sent
	// NextAttempt is the earliest time to resume, from the jar or the
	// server's Retry-After; zero when neither said.
	NextAttempt time.Time
	// State is the operation's state in the jar after the call, as in
	// *idem.PendingError: StatePending (or "", the same), or StateDone or
	// StateFailed for an operation sent again for its saved answer.
	State idem.State
	// Reason says why the Transport stopped retrying, as
	// *idem.PendingError's does ("MaxAttempts (5) reached after status
	// 409"); "" when not known.
	Reason string

	// unnamed is set for a call with an empty name, whose operation's
	// name was generated: as *idem.PendingError's message says, the same
	// call made again without a name is a new operation.
	unnamed bool
}

func (e *ConflictError) Error() string {
	var msg string
	if e.State == "" || e.State == idem.StatePending {
		msg = fmt.Sprintf("client: operation %q (key %q) still in flight on the server after %d attempt(s)%s; it stays pending: resume it later", e.Op, e.Key, e.Attempts, because(e.Reason))
		if e.unnamed {
			msg += " under its name (the call had none, and one made again without a name is a new operation under a new key)"
		}
	} else {
		msg = fmt.Sprintf("client: operation %q (key %q) is %s, its outcome known, but the server was still running a request with its key after %d attempt(s) of this call%s, which sent it again for the server's saved answer: call it again later under the same name",
			e.Op, e.Key, e.State, e.Attempts, because(e.Reason))
	}
	if !e.NextAttempt.IsZero() {
		msg += ", after " + e.NextAttempt.UTC().Format(time.RFC3339)
	}
	return msg
}

// because is why in parentheses, or "".
func because(why string) string {
	if why == "" {
		return ""
	}
	return " (" + why + ")"
}

// Is reports whether target is idem.ErrPending, whatever the State: the
// sentinel says what happened to the call (no answer: call it again), and
// State what the jar holds (pending: resumable), as net.Error's Timeout
// says what happened while its Temporary, advice on what to do, is
// deprecated; *idem.PendingError matches it alike.
func (e *ConflictError) Is(target error) bool { return target == idem.ErrPending }

// statusError reads (bounded) and closes a non-2xx answer and says what it
// means for the operation.
func (c *Client) statusError(ctx context.Context, r *Response, keyed, anonymous bool, attempts int, elapsed time.Duration) error {
	b, _ := c.readAnswer(ctx, r.Body, c.maxErrorBody, r.ContentLength)
	if int64(len(b)) > c.maxErrorBody {
		b = b[:c.maxErrorBody]
	}
	body.Drain(r.Body)
	se := &StatusError{Op: r.Op, Key: r.Key, StatusCode: r.StatusCode, Status: r.Status,
		Header: r.Header, Body: b, Replayed: r.Replayed}
	if r.Request != nil {
		se.Method, se.URL = r.Request.Method, dsn.MaskURL(r.Request.URL.String())
	}
	if se.Status == "" {
		se.Status = fmt.Sprintf("%d %s", r.StatusCode, http.StatusText(r.StatusCode))
	}
	if !keyed || r.Key == "" {
		se.Op, se.Key = "", ""
		return se
	}
	switch {
	case r.StatusCode == http.StatusUnprocessableEntity:
		se.Err = &idem.MismatchError{Op: r.Op, Key: r.Key}
	case retry.NotApplied(r.StatusCode):
		// Credentials refused, the request not applied: the Transport
		// left the operation as it was, which may be pending, or done or
		// failed and called again for its saved answer, which this call
		// did not get, as after a 503. (One without a name refused at its
		// only send is done, by this answer.)
		if rec, err := c.jar.Get(context.WithoutCancel(ctx), r.Op); err == nil &&
			(rec.State == idem.StatePending || !anonymous && (rec.State == idem.StateDone || rec.State == idem.StateFailed)) {
			se.Err = &idem.PendingError{Op: r.Op, Key: r.Key, Attempts: attempts, LastStatus: r.StatusCode,
				Elapsed: elapsed, NextAttempt: rec.NextAttempt, State: rec.State, Reason: stopped.Reason(r.Response)}
		}
	case retry.Classify(r.Response, nil) == retry.Retry:
		next, state := c.nextAttempt(ctx, r)
		if r.StatusCode == http.StatusConflict {
			se.Err = &ConflictError{Op: r.Op, Key: r.Key, Attempts: attempts, NextAttempt: next, State: state, Reason: stopped.Reason(r.Response)}
		} else {
			se.Err = &idem.PendingError{Op: r.Op, Key: r.Key, Attempts: attempts, LastStatus: r.StatusCode,
				Elapsed: elapsed, NextAttempt: next, State: state, Reason: stopped.Reason(r.Response)}
		}
	}
	return se
}

// nextAttempt is when a pending operation may be sent again: the time the
// Transport stored, or else the answer's Retry-After; and the operation's
// state in the jar, "" when it cannot be read.
func (c *Client) nextAttempt(ctx context.Context, r *Response) (time.Time, idem.State) {
	rec, err := c.jar.Get(context.WithoutCancel(ctx), r.Op)
	if err == nil && !rec.NextAttempt.IsZero() {
		return rec.NextAttempt, rec.State
	}
	now := time.Now()
	if d, ok := retry.RetryAfter(r.Response, now); ok {
		return now.Add(d), rec.State
	}
	return time.Time{}, rec.State
}

// excerpt returns the start of a body as one line of at most n bytes of
// valid UTF-8, for error messages.
func excerpt(b []byte, n int) string {
	cut := len(b) > n
	if cut {
		b = b[:n]
	}
	s := strings.Join(strings.FieldsFunc(strings.ToValidUTF8(string(b), ""), unicode.IsSpace), " ")
	if cut && s != "" {
		s += "…"
	}
	return s
}

// ErrClosed is returned, wrapped, by the Client's methods once Close
// began (Jar and HTTPClient excepted; the HTTPClient's requests return it
// within a *url.Error), whatever their other arguments, which then send,
// read and change nothing, and by Close called again.
var ErrClosed = errors.New("client: the Client is closed")
