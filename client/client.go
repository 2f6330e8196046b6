// Package client is the layer over idem.Transport that a program uses: an
// *http.Client whose POST and PATCH requests (or those of Options.Methods)
// are safe to retry, statuses turned into typed errors, and the operations
// that deal with outcomes left unknown, even by a crash: Pending, Resume,
// Abandon and Forget.
//
//	c, err := client.New(ctx, "keys.db", &client.Options{
//		Header: func(r *http.Request) error {
//			r.Header.Set("Authorization", "Bearer "+token)
//			return nil
//		},
//	})
//	if err != nil { ... }
//	defer c.Close()
//	var charge Charge
//	_, err = c.PostJSON(ctx, "charge:order-42", url, ChargeRequest{...}, &charge)
//
// An operation is named by the caller ("charge:order-42"): the name keeps
// its Idempotency-Key in the jar across retries and restarts. After a
// crash, Pending lists the operations whose outcome is unknown and Resume
// sends each again with its key; the server replays the first answer if
// the original got through. The jar keeps every operation until it is
// pruned (c.Jar().Prune, or idemctl prune): prune the settled ones that no
// call will name again, since a name whose record is gone gets a new key.
//
// Close the Client before the program exits (not os.Exit or log.Fatal
// with Close deferred): the jar writes the outcome of a call after the call
// returned, and Close waits for it, and for the calls still in progress.
// An exit without Close can leave the last operations pending; a resume
// then gets the server's replay.
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/keyhdr"
	"github.com/idemkit/idem/internal/presend"
	"github.com/idemkit/idem/internal/redirect"
	"github.com/idemkit/idem/internal/resume"
	"github.com/idemkit/idem/internal/secrethdr"
	"github.com/idemkit/idem/internal/sendable"
	"github.com/idemkit/idem/internal/unnamed"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
)

// Jar is what a Client needs of its jar: an idem.Jar that can also list,
// forget and prune its records. *keyjar.Jar, pgjar's jar and
// *idem.MemoryJar implement it.
type Jar interface {
	idem.Jar
	// List returns the records that pass f (its State, After and Limit:
	// see idem.Filter), oldest Created first, then by Op.
	List(ctx context.Context, f idem.Filter) ([]idem.Record, error)
	// Forget deletes op whatever its state, or returns idem.ErrNotFound.
	Forget(ctx context.Context, op string) error
	// Prune deletes at most limit (<= 0: no limit) records whose state is
	// idem.Prunable, last updated before before, and returns how many.
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// A KeyForgetter is a Jar that can delete an operation on a condition,
// checked in the same atomic step as the deletion. Forget uses it when the
// Client's jar is one, as database/sql uses a driver's optional
// interfaces: a jar of one's own that lacks the method still works, with
// the race described at Forget. *keyjar.Jar, pgjar's jar and
// *idem.MemoryJar implement it. It is declared here, by the code that calls
// it, as Jar is (net/http declares CookieJar, which cookiejar implements),
// so that a jar implements it without importing this package.
//
// ForgetKey deletes op only if its record still has key and is not
// pending. It returns an error wrapping idem.ErrNotFound when op has no
// record, and one wrapping idem.ErrNotForgotten, having deleted nothing,
// when its record has another key (Begin replaced an abandoned operation
// with a new one under the same name) or is pending.
type KeyForgetter interface {
	Jar
	ForgetKey(ctx context.Context, op, key string) error
}

// Options configures New. A nil *Options means the zero value, and every
// zero field means its documented default, as does a negative one but for
// MaxStoredBody.
type Options struct {
	// Jar stores the operations. Nil means the SQLite jar (keyjar) at the
	// path given to New, which the Client opens and closes. A Jar set here
	// belongs to the caller: Close leaves it open.
	Jar Jar

	// JarOptions are passed to keyjar.Open when Jar is nil, with Logger
	// as their Logger when they set none. Set with Jar, which they cannot
	// configure, they are ErrOptions.
	JarOptions *keyjar.Options

	// Base sends each attempt. Nil means a clone of http.DefaultTransport
	// that keeps up to 64 idle connections per host (http.Transport's
	// default of 2 loses a third of the throughput or more at 32 concurrent
	// callers) and checks the health of its HTTP/2 connections: one that
	// read nothing for 15 s is pinged, and closed when no answer comes
	// within 15 s, so that the attempts it held are sent again on a new
	// connection.
	Base http.RoundTripper

	// Header, when not nil, is called on every request the Client sends,
	// each attempt and every resume included, on a copy of the request, to
	// add what the jar does not keep: credentials (Authorization, API
	// keys, cookies). The jar never sees what Header adds; each operation
	// records only that something was added (idem.AddedCredentials, see
	// ResumeWithoutCredentials). It must add the same credential to every
	// attempt and resume of an operation: a server that scopes keys by
	// credential, as the reference server does (testserver.Middleware's
	// Scope), takes an attempt under a refreshed token for a new request
	// and runs it again; refresh a token between operations, not within
	// one. It is not called
	// for a redirect that leaves the request's host or scheme (an https
	// request redirected to http, where credentials would cross the
	// network in the clear), nor for any request after it in the redirect
	// chain; nor does such a request carry the credentials (those
	// idem.SecretHeader names) that the caller set on the request given to
	// Do, which net/http would send there (an X-Api-Key to any host, an
	// Authorization over http). It cannot change a keyed request's
	// Idempotency-Key: the operation's key is sent whatever Header sets or
	// removes; nor its method, which the jar records: a Header that
	// changes it stops the call as an error does. It must leave the body
	// as it is: the body Header leaves in the request is sent, while the
	// jar keeps, and Resume sends, the one the call was given, and a body
	// read from r.Body is not there to send: to sign the body, read a copy
	// from r.GetBody. An error stops the call before the attempt is sent:
	// the error wraps idem.ErrNotSent, and the attempt is neither counted
	// nor retried; the operation stays pending (one without a name, never
	// sent, is abandoned). So does a resume's Header that does not add
	// the credentials the first send carried on its request
	// (*CredentialsError), and, over an *http.Transport, a header Header
	// sets that net/http does not send (a value with a line break, as a
	// token read from a file keeps it): the error wraps
	// idem.ErrInvalidHeader too, and names the field, not its value.
	// A panic of Header ends the call and reaches its caller as it is, as
	// a hook's does (idem.Hooks): nothing of that attempt was sent, and,
	// as after an error, it is not counted, and an operation without a
	// name whose first attempt it was is abandoned.
	//
	// Resume sends the method, URL and Host the jar holds, and Header adds
	// its credentials to whatever they are: whoever can write the jar can
	// point a pending operation at another host. Header receives the
	// request: compare its URL's scheme and host, and its Host when set,
	// with those the credentials are for, and return an error for any
	// other, so that nothing is sent there (ExampleOptions_header).
	Header func(*http.Request) error

	// ResumeWithoutCredentials lets Resume, ResumeJSON and ResumeWithBody
	// send an operation whose first send carried credentials on its
	// request (idem.Record.Withheld) without those Header does not add,
	// instead of refusing it with a *CredentialsError: for a server known
	// not to need them (idemctl resume --without-credentials). An operation
	// that a Client with Header began withholds idem.AddedCredentials,
	// which a Client without Header refuses to resume unless this is set:
	// the credentials Header added leave no name of their own.
	ResumeWithoutCredentials bool

	// Policy is the retry policy of each call; the zero value is the
	// default (see retry.Policy).
	Policy retry.Policy

	// Methods are the methods that get a key, as in idem.Transport.Methods:
	// their requests are operations, retried, recorded and resumable, and
	// a redirect that would send one again comes back as the answer. Nil
	// means POST and PATCH; to key PUT too, list them all: {"POST",
	// "PATCH", "PUT"}. A request of another method is sent once, without a
	// key or a record. An entry that is not a method (a token, as "POST "
	// or "post,put" is not) is ErrOptions.
	Methods []string

	// Budget is the retry quota shared by all of the Client's calls. Nil
	// means a new retry.Budget with its defaults (500 tokens; a retry costs 5,
	// 10 after an attempt that timed out).
	// Give a Budget with a very large Capacity to retry within Policy
	// alone.
	Budget *retry.Budget

	// MaxStoredBody is the largest request body stored in the jar for
	// Resume; a larger body must be supplied again to ResumeWithBody. Zero
	// means 64 KiB; negative means never store bodies. A body larger than
	// 8 MiB (the Transport's MaxBuffer) is never stored.
	MaxStoredBody int64

	// MaxErrorBody is how much of a non-2xx response body a StatusError
	// keeps. Zero or negative means 64 KiB.
	MaxErrorBody int64

	// MaxJSONBody is the largest 2xx body PostJSON decodes; a larger one is
	// an error matching ErrTooLarge (the operation did happen). Zero or
	// negative means 16 MiB.
	MaxJSONBody int64

	// Lease is how long one call holds an operation before another
	// process may take it over (idem.Transport.Lease). Zero or negative
	// means the Transport's default.
	Lease time.Duration

	// Hooks and Logger are passed to the idem.Transport, and Logger to
	// the jar file New opens (keyjar.Options.Logger: the outcomes it
	// fails to write). The zero Hooks call nothing; a nil Logger is
	// silent.
	Hooks  idem.Hooks
	Logger *slog.Logger
}

// Client sends requests through an idem.Transport over a jar. It is safe
// for concurrent use. Close it when done.
type Client struct {
	jar          Jar
	closeJar     func() error // nil when the jar belongs to the caller
	tr           *idem.Transport
	hc           *http.Client
	maxErrorBody int64
	maxJSONBody  int64
	addsHeader   bool // Options.Header is set: a resume can add credentials
	noCredCheck  bool // Options.ResumeWithoutCredentials

	mu      sync.Mutex     // guards closed, the calls' Add and sending
	closed  bool           // Close began: no call may start
	calls   sync.WaitGroup // the calls in progress, which Close waits for
	sending map[string]int // the operations with an attempt in flight, for Abandon
}

// send counts an attempt of op in flight (n = 1), or no longer (n = -1).
func (c *Client) send(op string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sending == nil {
		c.sending = make(map[string]int)
	}
	if c.sending[op] += n; c.sending[op] <= 0 {
		delete(c.sending, op)
	}
}

// isSending reports whether an attempt of op is in flight.
func (c *Client) isSending(op string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sending[op] > 0
}

// New returns a Client over the jar file at path, opened with keyjar.Open
// (created with mode 0600 if it does not exist), or over opts.Jar, in
// which case path must be "". opts may be nil. Given neither, or both, New
// returns ErrOptions, as for Options.JarOptions beside Options.Jar, for a
// path that is a postgres:// or postgresql:// URL (open a PostgreSQL jar
// with pgjar.Open and give it as Options.Jar), and for an Options.Methods
// that is empty but not nil or lists a string that is not a method.
//
// A relative path is relative to the working directory: a program started
// from another directory opens another jar, empty, and sends its pending
// operations again under new keys. Give an absolute path, such as one
// under os.UserConfigDir or the program's state directory.
//
// A nil ctx is an error matching ErrNilContext, as it is for every method
// of the Client that takes one; nothing is opened.
func New(ctx context.Context, path string, opts *Options) (*Client, error) {
	if ctx == nil {
		return nil, fmt.Errorf("client: new: %w", ErrNilContext)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	c := &Client{jar: o.Jar, maxErrorBody: o.MaxErrorBody, maxJSONBody: o.MaxJSONBody, addsHeader: o.Header != nil,
		noCredCheck: o.ResumeWithoutCredentials}
	if c.maxJSONBody <= 0 {
		c.maxJSONBody = 16 << 20
	}
	nonMethod := sendable.NonMethod(o.Methods)
	switch {
	case o.Methods != nil && len(o.Methods) == 0:
		// As a config file's "methods: []" gives it: nothing would be
		// keyed, every request sent once without a key or a record.
		return nil, fmt.Errorf("%w: Options.Methods is empty, so no request would get a key; nil means POST and PATCH", ErrOptions)
	case nonMethod >= 0:
		// As a config file's "POST " or "post,put" gives it: no request's
		// method would match it, and those it meant would go unkeyed.
		return nil, fmt.Errorf("%w: Options.Methods[%d] is %q, which is not an HTTP method (a token: letters, digits and !#$%%&'*+-.^_`|~, no space or comma), so no request would match it", ErrOptions, nonMethod, o.Methods[nonMethod])
	case dsn.IsURL(strings.ToLower(path)):
		// As idemctl --jar takes one: not a file name, and not quoted,
		// since it may hold a password.
		return nil, fmt.Errorf("%w: the path is a PostgreSQL URL, and New opens only a jar file (keyjar): open a PostgreSQL jar with pgjar.Open and give it as Options.Jar, with an empty path", ErrOptions)
	case o.Jar != nil && path != "":
		return nil, fmt.Errorf("%w: both a path (%q) and Options.Jar are given; give one", ErrOptions, path)
	case o.Jar == nil && path == "":
		return nil, fmt.Errorf("%w: no jar: give a path or Options.Jar", ErrOptions)
	case o.Jar != nil && o.JarOptions != nil:
		// They configure the jar file New opens, which a Client over a jar
		// of the caller's does not: ignored, they would look applied.
		return nil, fmt.Errorf("%w: both Options.Jar and Options.JarOptions are given; JarOptions configure only the jar file New opens at a path: configure a jar of your own where you open it", ErrOptions)
	case o.Jar == nil:
		jo := keyjar.Options{Logger: o.Logger}
		if o.JarOptions != nil {
			jo = *o.JarOptions
			jo.Logger = cmp.Or(jo.Logger, o.Logger)
		}
		j, err := keyjar.Open(ctx, path, &jo)
		if err != nil {
			return nil, err
		}
		c.jar, c.closeJar = j, j.Close
	}
	if c.maxErrorBody <= 0 {
		c.maxErrorBody = 64 << 10
	}
	base := o.Base
	if base == nil {
		base = pooledTransport()
	}
	budget := o.Budget
	if budget == nil {
		budget = &retry.Budget{}
	}
	c.tr = &idem.Transport{
		Base:          &sender{base: base, header: o.Header, c: c},
		Jar:           c.jar,
		Policy:        o.Policy,
		Budget:        budget,
		Methods:       slices.Clone(o.Methods),
		MaxStoredBody: o.MaxStoredBody,
		Lease:         o.Lease,
		Hooks:         o.Hooks,
		Logger:        o.Logger,
	}
	c.hc = &http.Client{Transport: &tracked{c: c}, CheckRedirect: c.checkRedirect}
	return c, nil
}

// enter counts a call in progress, which Close waits for, or returns
// ErrClosed once Close began, and ErrNilContext for a nil ctx, which the
// call would panic on. The caller calls c.calls.Done when enter returned
// nil.
func (c *Client) enter(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.calls.Add(1)
	return nil
}

// tracked is the HTTPClient's Transport: the Client's idem.Transport,
// whose requests Close waits for and refuses once it began. Those of the
// Client's own methods are counted once, by the method.
type tracked struct{ c *Client }

func (t *tracked) RoundTrip(r *http.Request) (*http.Response, error) {
	tr, _ := presend.From(r.Context()).(*tracker)
	if tr == nil {
		if err := t.c.enter(r.Context()); err != nil {
			if r.Body != nil {
				r.Body.Close()
			}
			return nil, err
		}
		defer t.c.calls.Done()
		tr = &tracker{}
		r = r.WithContext(presend.With(r.Context(), tr))
	}
	defer func() { // a panic of a hook, the Logger or Base too
		if op := tr.stopSending(); op != "" {
			t.c.send(op, -1)
		}
	}()
	return t.c.tr.RoundTrip(r)
}

func (t *tracked) CloseIdleConnections() { t.c.tr.CloseIdleConnections() }

// pooledTransport is http.DefaultTransport with a pool sized for many
// concurrent callers to one host, and the HTTP/2 health check of
// http2HealthCheck.
func pooledTransport() *http.Transport {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		t = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = 64
	t.MaxIdleConns = max(t.MaxIdleConns, 256)
	var h2 http.HTTP2Config
	if t.HTTP2 != nil {
		h2 = *t.HTTP2 // what a program set on http.DefaultTransport is kept
	}
	if h2.SendPingTimeout == 0 {
		h2.SendPingTimeout = http2HealthCheck.SendPingTimeout
		if h2.PingTimeout == 0 {
			h2.PingTimeout = http2HealthCheck.PingTimeout
		}
	}
	t.HTTP2 = &h2
	return t
}

// http2HealthCheck is the default Base's HTTP/2 health check. Over HTTP/2
// every attempt of a call goes to the one connection to the host, and
// net/http keeps sending on it while it looks open: a connection that
// stopped answering (a lost route, a NAT that dropped it) would take
// every attempt with it, each until its Policy.AttemptTimeout or, without
// one, until the kernel gives the connection up, after minutes. With the
// check, a connection that has read nothing for SendPingTimeout is
// pinged, and closed when no answer comes within PingTimeout: its
// attempts fail ("http2: client connection lost"), and the call sends
// them again, same key, on a new connection. 15 s is net/http's own
// PingTimeout default, and the two together, 30 s, fit in the half of
// Policy.MaxElapsed's default (1 minute) so that a retry still follows.
// The check is off by default in net/http; Kubernetes' client, the Azure
// SDK and others turn it on the same way. A var for the tests.
var http2HealthCheck = http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 15 * time.Second}

// checkRedirect follows redirects that become GET requests (301, 302,
// 303) and stops at those that would send a keyed request again to
// another URL (307, 308): that would be another operation, and the
// redirect comes back as the answer. Like http.Client's default, it sends
// at most 10 requests: the 10th redirect in a row is an error. A request
// it follows with another method than the chain's first (a GET after a
// POST or a DELETE) carries no Idempotency-Key: http.Client copied the
// first request's header onto it, a key of the caller's included, which
// the idem.Transport deletes, since it is the first request's, not this
// one's; the 307 or 308 of a method that is not keyed sends the same
// request again, with the key its caller set. Nor, once the chain left
// the first request's scheme and host, does it carry the credentials
// (those idem.SecretHeader names) that the caller set on that request and
// http.Client copied too: as for Options.Header (see sameOrigin).
func (c *Client) checkRedirect(req *http.Request, via []*http.Request) error {
	if c.keyed(req.Method) {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("client: stopped after 10 redirects")
	}
	if !sameOrigin(req) {
		req.Header = idem.PublicHeader(req.Header)
	}
	return nil
}

// keyed reports whether the Client's requests of method get a key: those
// of Options.Methods, as idem.Transport decides it.
func (c *Client) keyed(method string) bool { return keyhdr.Keyed(c.tr.Methods, method) }

// HTTPClient returns the Client's *http.Client, for code that wants the
// plain net/http API. Its requests of the methods in Options.Methods (POST
// and PATCH by default) get keys and retries (name the operation with
// idem.WithOperation); statuses are not turned into errors. Close waits
// for its requests as for the Client's calls, and once Close began they
// return an error (a *url.Error) matching ErrClosed, nothing sent. It is
// the http.Client that Do, PostJSON and the resumes send through: leave
// its fields as they are. A Timeout set on it ends their calls too, with
// net/http's own error, which matches no idem.ErrPending though the
// operation stays pending; bound a call with its context's deadline.
func (c *Client) HTTPClient() *http.Client { return c.hc }

// Jar returns the Client's jar.
func (c *Client) Jar() Jar { return c.jar }

// Close waits for the calls in progress (Do, PostJSON, the resumes,
// Pending, Abandon, Forget and the HTTPClient's requests), which end
// within their contexts and the Policy, so that their outcomes are in the
// jar; then it closes idle connections and the jar New opened, which
// first writes the outcomes it was still to write, and returns the jar's
// error (idem.ErrDropped: outcomes that were not written). A jar given in
// Options.Jar is left open: close it too, after Close. As database/sql's
// DB.Close does, Close refuses the calls that would begin once it began:
// they, and Close called again, return an error matching ErrClosed,
// nothing sent. Cancel the contexts of the calls in progress to have Close
// return sooner; each leaves its operation pending, to resume. Close must
// not be called from Options.Header, a hook or the Logger, which a call
// in progress runs: it would wait for itself.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	c.mu.Unlock()
	c.calls.Wait()
	c.tr.CloseIdleConnections()
	if c.closeJar != nil {
		return c.closeJar()
	}
	return nil
}

// Response is a 2xx answer to an operation.
type Response struct {
	*http.Response
	// Op is the operation's name; unnamed, the request's Idempotency-Key
	// or a fresh UUID v7. It is "" for a request whose method the Client
	// does not key (a GET), which is no operation even when named.
	Op  string
	Key string // the Idempotency-Key sent; "" for requests without one
	// Replayed reports that the server did not run the request again but
	// replayed the saved answer to an earlier attempt
	// (Idempotent-Replayed: true).
	Replayed bool
}

// Do sends req as the operation named op, retrying with one key, and
// returns the 2xx answer with its body open for the caller to read and
// close. An empty op makes req an operation of its own (a new key), unless
// ctx names one (idem.WithOperation), which op, when given, replaces. ctx
// replaces req's context; req is not modified. A request whose method the
// Client does not key (not in Options.Methods: by default anything but POST
// and PATCH, such as GET, PUT or DELETE) is no operation, op or not: it is
// sent once, as http.Client sends it, without a key, a retry or a record
// in the jar, and its Response has no Op nor Key.
//
// A non-2xx answer is an error, with the body read (at most
// Options.MaxErrorBody) and closed: a *StatusError, whose Err says more:
//
//   - 422: *idem.MismatchError: the server refused the request, which the
//     reference server does for a key used for a different request, and
//     an API may also do for a request it will not process (Body may say
//     which). The operation is failed; do not retry it under this key.
//   - 409 left when the attempts or budget ran out: *ConflictError. The
//     server is still running the first attempt; the operation stays
//     pending: Resume it later. One done or failed, sent again for its
//     saved answer, keeps its outcome (the error's State): call it again.
//   - 408, 425, 429, 502, 503 or 504 left: *idem.PendingError, whose NextAttempt
//     says when the server asked to be called again.
//   - 401 or 407: the credentials were refused and the request not
//     applied; the operation keeps its state: *idem.PendingError, whose
//     State says it (pending: a new named operation, or one whose earlier
//     attempt's outcome is unknown; done or failed: one sent again for its
//     saved answer). A call with an empty name refused at its only send
//     is done: no call can name it to resume it; Err is nil.
//   - A 408, 409, 425, 429, 502, 503 or 504 replayed (Idempotent-Replayed:
//     true: the answer the server saved for the key, such as a handler's
//     own 409): final, Err is nil and the operation is done. (A 422 or a
//     401 replayed is as above.)
//
// After Close, Do sends nothing and returns an error matching ErrClosed;
// given a nil ctx, one matching ErrNilContext; given a nil req, one
// matching ErrNilRequest, where http.Client.Do panics. Either way it
// closes req's body, as http.Client.Do does.
//
// errors.Is(err, idem.ErrPending) reports every call left without the
// operation's answer, but for a ctx already done when Do is called, whose
// error Do returns having sent nothing (an operation left pending by an
// earlier call stays pending): call it again later under the same name,
// which resumes a pending operation with its key and asks again for the
// saved answer of a done or failed one. Only a pending operation can be
// resumed (Pending lists it, Resume sends it): the State of the
// *idem.PendingError or *ConflictError says which. Errors without an
// answer are those of http.Client.Do (a *url.Error, whose URL has its
// password and the values of its query's secrets masked as xxxxx) wrapping
// the Transport's typed errors:
// *idem.PendingError, *idem.ReconcileError (past the horizon: reconcile),
// *idem.MismatchError (op reused with another request: nothing sent),
// *idem.JarError.
func (c *Client) Do(ctx context.Context, op string, req *http.Request) (*Response, error) {
	err := c.enter(ctx)
	if err == nil && req == nil {
		c.calls.Done()
		err = ErrNilRequest
	}
	if err != nil {
		if req != nil && req.Body != nil {
			req.Body.Close() // as http.Client.Do does, even on error
		}
		switch {
		case op != "":
			return nil, fmt.Errorf("client: operation %q: %w", op, err)
		case req != nil:
			return nil, fmt.Errorf("client: %s: %w", req.Method, err)
		}
		return nil, fmt.Errorf("client: Do: %w", err)
	}
	defer c.calls.Done()
	return c.do(ctx, op, req)
}

// do is Do within a call that enter counted.
func (c *Client) do(ctx context.Context, op string, req *http.Request) (*Response, error) {
	tr := &tracker{}
	ctx = presend.With(ctx, tr)
	if c.addsHeader {
		// The operation's record says that credentials were added: they
		// leave no name of their own (idem.AddedCredentials).
		ctx = secrethdr.MarkAdded(ctx)
	}
	if op != "" {
		ctx = idem.WithOperation(ctx, op)
	}
	start := time.Now()
	resp, err := c.hc.Do(req.WithContext(ctx))
	if err != nil {
		if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
			// http.Client's error quotes the URL with its password
			// masked (***), not the secrets of its query: masked as
			// the Transport masks them.
			ue.URL = dsn.MaskURL(ue.URL)
		}
		return nil, err
	}
	attempts, named, key := tr.get()
	// Sent without a name: neither op, nor one ctx carried
	// (idem.WithOperation), nor a key of the caller's, which would name the
	// operation itself.
	anonymous := op == "" && idem.Operation(ctx) == "" && named != key
	keyed := c.keyed(req.Method)
	switch {
	case !keyed:
		// No operation, op or not (see Do): no name, as no key and no
		// record, as in its StatusError, even where the caller set an
		// Idempotency-Key of its own, which the Transport sends as it is.
		// The name is not refused: Do's doc takes it, and the Transport,
		// as net/http does with a context value it has no use for,
		// ignores idem.WithOperation on a request it does not key.
		op, key = "", ""
	case op == "":
		op = named
	}
	r := &Response{Response: resp, Op: op, Key: key, Replayed: retry.Replayed(resp)}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return r, nil
	}
	// The answer to a request without a key (a GET, or the one a redirect
	// of the keyed request made) says nothing of the operation.
	keyed = keyed && resp.Request != nil && resp.Request.Header.Get(idem.KeyHeader) != ""
	err = c.statusError(ctx, r, keyed, anonymous, attempts, time.Since(start))
	if anonymous {
		// Its *idem.PendingError says, as the Transport's does, that the
		// same call made again without a name is a new operation.
		var pe *idem.PendingError
		var ce *ConflictError
		switch {
		case errors.As(err, &pe):
			unnamed.Mark(pe)
		case errors.As(err, &ce):
			ce.unnamed = true
		}
	}
	return nil, err
}

// PostJSON sends in, encoded as JSON, in a POST to url as the operation
// named op, and decodes a 2xx answer's JSON body into out (unless out is
// nil or the body is empty). An empty op, as for Do, makes the call an
// operation of its own (unless ctx names one), under a new key that
// neither a later call nor a run after a restart finds again. The returned Response's body is already read
// and closed. Errors are those of Do; a url that does not parse is
// http.NewRequest's *url.Error, with its password masked (user:xxxxx@) as
// url.URL.Redacted masks it, in its URL and in its Err, and the secrets of
// its query as Do's errors mask them (?api_key=xxxxx); a body that does not decode, is
// larger than Options.MaxJSONBody (ErrTooLarge), or could not be read to
// its end (the connection closed mid-body) is an error returned with the
// Response, which does not match idem.ErrPending: the operation did happen,
// and is done in the jar; a call under its name again gets the server's
// saved answer, if it keeps one. A Client whose Options.Methods
// leave POST out sends nothing and returns an error matching ErrMethod.
func (c *Client) PostJSON(ctx context.Context, op, url string, in, out any) (*Response, error) {
	if err := c.enter(ctx); err != nil {
		return nil, fmt.Errorf("client: operation %q: %w", op, err)
	}
	defer c.calls.Done()
	if !c.keyed(http.MethodPost) {
		// Do would send it once, its name ignored, without a key, a retry
		// or a record: not the call PostJSON's op asks for.
		return nil, fmt.Errorf("client: operation %q: a POST: %w; nothing was sent: list POST in Options.Methods", op, ErrMethod)
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("client: encoding the request of %q: %w", op, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
		// url.Parse's error quotes the URL as given: its password is
		// masked, as http.Client masks it in the errors of its requests,
		// and the secrets of its query, as Do masks them.
		dsn.MaskURLError(ue, url)
		ue.URL = dsn.MaskURL(ue.URL)
	}
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.do(ctx, op, req)
	if err != nil {
		return nil, err
	}
	return c.decodeJSON(ctx, resp, out)
}

// readAnswer reads at most limit bytes of an answer's body, for its
// StatusError or its decoded value: until ctx is done, and for no longer
// than the Policy's AttemptTimeout, which the Transport stops counting
// once the headers have come. A server that stalls after them would hold
// the call, and Close, which waits for it, without end.
func (c *Client) readAnswer(ctx context.Context, r io.Reader, limit, size int64) ([]byte, error) {
	if d := c.tr.Policy.Defaults().AttemptTimeout; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	return body.ReadAtMostContext(ctx, r, limit, size)
}

// decodeJSON reads resp's body, a 2xx answer, and decodes it into out
// (unless out is nil or the body is empty), for PostJSON and ResumeJSON.
func (c *Client) decodeJSON(ctx context.Context, resp *Response, out any) (*Response, error) {
	defer func() {
		body.Drain(resp.Body)
		resp.Body = http.NoBody
	}()
	if out != nil {
		b, err := c.readAnswer(ctx, resp.Body, c.maxJSONBody, resp.ContentLength)
		if errors.Is(err, body.ErrTooLarge) {
			return resp, fmt.Errorf("%w: the answer to %q (status %d) has more than %d bytes", ErrTooLarge, resp.Op, resp.StatusCode, c.maxJSONBody)
		}
		if err != nil {
			return resp, fmt.Errorf("client: reading the answer to %q (status %d): %w", resp.Op, resp.StatusCode, err)
		}
		if len(b) > 0 {
			if err := json.Unmarshal(b, out); err != nil {
				return resp, fmt.Errorf("client: decoding the answer to %q (status %d): %w", resp.Op, resp.StatusCode, err)
			}
		}
	}
	return resp, nil
}

// Pending returns the operations whose outcome is unknown (StatePending),
// oldest first. Each record says how many attempts were made (Attempts,
// each counted before its send), when the key was stored, before the first
// send (Created), the last error and status, and NextAttempt, the
// earliest time the server asked to be called again (zero when it did
// not).
//
// Pending lists too the operations a call is sending at that moment, in
// this process or another sharing the jar: their Holder is set and their
// LeaseUntil is ahead. Resume of one waits for that lease within the
// Policy, and then finds it settled or takes it over. A program that
// resumes on start what a crash left, beside other processes using the
// same jar, can skip those whose holder is alive:
//
//	if r.Holder != "" && time.Now().Before(r.LeaseUntil) && !idem.HolderGone(r.Holder) {
//		continue // being sent now
//	}
func (c *Client) Pending(ctx context.Context) ([]idem.Record, error) {
	if err := c.enter(ctx); err != nil {
		return nil, fmt.Errorf("client: pending: %w", err)
	}
	defer c.calls.Done()
	return c.jar.List(ctx, idem.Filter{State: idem.StatePending})
}

// Resume sends the pending operation op again, from the request stored in
// the jar, with the same key; Options.Header adds the credentials. It
// respects the horizon (*idem.ReconcileError, nothing sent), a stored
// NextAttempt (an *idem.PendingError saying when, nothing sent, when it is
// further than Policy.MaxRetryAfter) and the lease of another process
// sending it. Answers and errors are those of Do.
//
// Resume sends only the operation it read, under its key, and only while
// it is still pending once Resume has its lease: one that another call or
// process settled or forgot meanwhile (while Resume waited for the lease of
// a holder still sending it, or after Resume read it) is not sent, and
// neither is one begun again under a new key (an *idem.MismatchError). An
// ordinary call sends a done operation again, for the server's saved
// answer, and begins a forgotten or abandoned one anew under a new key; a
// resume may lack the first send's credential, and a server that scopes
// keys by credential would run it again.
//
// Resume returns an error wrapping idem.ErrNotFound for an unknown op,
// also when it is forgotten after Resume read it, a *StateError (ErrState)
// with the state for an operation that is not pending (done, failed or abandoned)
// when Resume reads it or once it has its lease, ErrMethod for one whose
// method the Client does not key, an *idem.ReconcileError for one past its
// horizon (StateReconcile, or pending and first sent longer ago than
// Policy.Horizon, which Resume marks StateReconcile as the Transport does,
// whether or not the jar stored its body), ErrBodyNotStored when the
// body was too large to store: use ResumeWithBody, and a
// *CredentialsError (ErrCredentials) when the first send carried
// credentials on its request (idem.Record.Withheld) and the Client has no
// Options.Header to add them, or Options.Header did not add them all
// (then within an *idem.PendingError, matching idem.ErrNotSent), unless
// Options.ResumeWithoutCredentials: nothing is sent.
func (c *Client) Resume(ctx context.Context, op string) (*Response, error) {
	if err := c.enter(ctx); err != nil {
		return nil, fmt.Errorf("client: resume %q: %w", op, err)
	}
	defer c.calls.Done()
	rec, err := c.resumable(ctx, op)
	if err != nil {
		return nil, err
	}
	req, err := rec.NewRequest(ctx)
	if errors.Is(err, idem.ErrBodyNotStored) && rec.State == idem.StateReconcile {
		// Past its horizon: not sent again, whatever the body.
		return nil, &idem.ReconcileError{Op: rec.Op, Key: rec.Key, Created: rec.Created, Horizon: c.tr.Policy.Defaults().Horizon,
			Attempts: rec.Attempts, LastStatus: rec.LastStatus, State: rec.State}
	}
	if errors.Is(err, idem.ErrBodyNotStored) && c.tr.Policy.Expired(rec.Created, time.Now()) {
		// Past its horizon, whatever the body: the Transport marks it for
		// reconciliation under its lease, as it does when the body is
		// stored, and sends nothing.
		bare := rec
		bare.Body, bare.BodySize = nil, 0
		if req, err := bare.NewRequest(ctx); err == nil {
			return c.resume(resume.WithoutBody(ctx), rec, req)
		}
	}
	if errors.Is(err, idem.ErrBodyNotStored) {
		return nil, fmt.Errorf("client: resume %q: %w (%d bytes): use ResumeWithBody", op, ErrBodyNotStored, rec.BodySize)
	}
	if err != nil {
		return nil, fmt.Errorf("client: resume %q: %w", op, err)
	}
	return c.resume(ctx, rec, req)
}

// ResumeJSON is Resume for an operation that PostJSON sent: it decodes a
// 2xx answer's JSON body into out as PostJSON does (unless out is nil or
// the body is empty), and returns the Response with its body read and
// closed. Its errors are Resume's, and PostJSON's for a body that does not
// decode or could not be read whole, returned with the Response: the
// operation did happen.
func (c *Client) ResumeJSON(ctx context.Context, op string, out any) (*Response, error) {
	resp, err := c.Resume(ctx, op)
	if err != nil {
		return nil, err
	}
	return c.decodeJSON(ctx, resp, out)
}

// ResumeWithBody is Resume for an operation whose body the jar did not
// store: getBody returns the body afresh for each attempt, like
// http.Request.GetBody (a reader of memory given back once read is
// idem.ErrRequestBody, and nothing is sent). The body is checked against the stored
// fingerprint before anything is sent: a different body is an
// *idem.MismatchError. So is a JSON body larger than 8 MiB (the
// Transport's MaxBuffer: it is fingerprinted byte for byte) that an
// idem.Transport with a larger MaxBuffer fingerprinted canonicalised,
// unless its bytes are its canonical form; a body that a Transport with a
// smaller MaxBuffer streamed matches (see idem.Transport.MaxBuffer). Like
// Resume, it sends only an operation still pending when it has the lease
// (a *StateError otherwise). A nil getBody is an error matching
// idem.ErrRequestBody; nothing is read, sent or changed.
func (c *Client) ResumeWithBody(ctx context.Context, op string, getBody func() (io.ReadCloser, error)) (*Response, error) {
	if err := c.enter(ctx); err != nil {
		return nil, fmt.Errorf("client: resume %q: %w", op, err)
	}
	defer c.calls.Done()
	if getBody == nil {
		// A nil getBody produces no body: idem.ErrRequestBody, the
		// Transport's sentinel for a body it cannot produce (which the doc
		// above already names for getBody), rather than a new sentinel for
		// the same fault.
		return nil, fmt.Errorf("client: resume %q: nil getBody, nothing sent: %w", op, idem.ErrRequestBody)
	}
	rec, err := c.resumable(ctx, op)
	if err != nil {
		return nil, err
	}
	bare := rec
	bare.Body, bare.BodySize = nil, 0
	req, err := bare.NewRequest(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: resume %q: %w", op, err)
	}
	if rec.BodySize > 0 {
		rc, err := getBody()
		if err != nil {
			return nil, fmt.Errorf("client: resume %q: body: %w", op, err)
		}
		// No ContentLength: a body of another length is another body, which
		// the Transport refuses as a *MismatchError.
		req.Body, req.GetBody = rc, getBody
	}
	return c.resume(ctx, rec, req)
}

func (c *Client) resumable(ctx context.Context, op string) (idem.Record, error) {
	rec, err := c.jar.Get(ctx, op)
	if err != nil {
		return rec, fmt.Errorf("client: resume %q: %w", op, err)
	}
	if rec.State != idem.StatePending && rec.State != idem.StateReconcile {
		return rec, &StateError{Op: op, Key: rec.Key, State: rec.State, verb: "resume", detail: ", not pending; nothing was sent"}
	}
	if !c.keyed(rec.Method) {
		return rec, fmt.Errorf("client: resume %q: a %s: %w; resume it through a Client whose Options.Methods include %s",
			op, rec.Method, ErrMethod, rec.Method)
	}
	if w := rec.Withheld(); len(w) > 0 && !c.addsHeader && !c.noCredCheck && rec.State == idem.StatePending &&
		!c.tr.Policy.Expired(rec.Created, time.Now()) {
		// Checked before the lease, and not past the horizon, where the
		// resume sends nothing but marks the operation for reconciliation.
		// With Options.Header, what it adds is known only when it runs:
		// the sender checks it there, before each attempt.
		return rec, &CredentialsError{Op: op, Key: rec.Key, Missing: w}
	}
	return rec, nil
}

// resume sends req, the request rec stores, as the resume of rec's
// operation.
func (c *Client) resume(ctx context.Context, rec idem.Record, req *http.Request) (*Response, error) {
	ctx = resume.Mark(ctx, rec.Key)
	if w := rec.Withheld(); len(w) > 0 && !c.noCredCheck {
		ctx = context.WithValue(ctx, withheldKey{}, &CredentialsError{Op: rec.Op, Key: rec.Key, Missing: w})
	}
	resp, err := c.do(ctx, rec.Op, req)
	if se := (*resume.StateError)(nil); errors.As(err, &se) {
		if se.State == "" {
			return nil, fmt.Errorf("client: resume %q: the operation was forgotten by another call or process after Resume found it pending; nothing was sent: %w",
				rec.Op, idem.ErrNotFound)
		}
		return nil, &StateError{Op: rec.Op, Key: rec.Key, State: idem.State(se.State), verb: "resume",
			detail: ": another call or process settled it after Resume found it pending; nothing was sent"}
	}
	return resp, err
}

// Abandon records that the caller established that the pending (or
// reconcile) operation op did not happen and is not executing: it moves to
// StateAbandoned with reason as its note, and a later call with the same
// name gets a new key. Use it only with that certainty: a new key for an
// operation that did happen runs it twice.
//
// Abandon returns ErrNoReason for an empty reason, an error wrapping
// idem.ErrNotFound for an unknown op, idem.ErrLeased while another call
// or process is sending it (a process on this host that is gone is not,
// see idem.HolderGone), and while an attempt of it that this Client sent
// waits for its answer, even past its lease (another process's attempt
// keeps its lease renewed while it runs, as long as its jar writes the
// renewals: see idem.Transport.Lease), and a *StateError (ErrState) when its outcome is
// known (done or failed). Abandoning an abandoned operation changes nothing.
// When ctx ends, or the jar fails, after Abandon took the operation's
// lease, the operation stays as it was and Abandon gives the lease back,
// without ctx, before it returns the error.
func (c *Client) Abandon(ctx context.Context, op, reason string) error {
	if err := c.enter(ctx); err != nil {
		return fmt.Errorf("client: abandon %q: %w", op, err)
	}
	defer c.calls.Done()
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("client: abandon %q: %w", op, ErrNoReason)
	}
	rec, err := c.jar.Get(ctx, op)
	if err != nil {
		return fmt.Errorf("client: abandon %q: %w", op, err)
	}
	switch rec.State {
	case idem.StateAbandoned:
		return nil
	case idem.StatePending, idem.StateReconcile:
	default:
		return &StateError{Op: op, Key: rec.Key, State: rec.State, verb: "abandon", detail: ", its outcome is known"}
	}
	if c.isSending(op) {
		// An attempt may outlast its lease: the jar would take the
		// operation as free while this Client still waits for its answer.
		return fmt.Errorf("client: abandon %q: this Client is sending it: %w; wait for that call to return, then abandon it again", op, idem.ErrLeased)
	}
	holder, err := idem.NewHolder()
	if err != nil {
		return fmt.Errorf("client: abandon %q: %w", op, err)
	}
	now := time.Now()
	rec, err = c.jar.Acquire(ctx, op, holder, now, time.Minute)
	if errors.Is(err, idem.ErrLeased) && idem.HolderGone(rec.Holder) {
		// Its holder was killed: nothing is sending it. Release the lease
		// with the holder's own id (fenced) and take it, as the Transport
		// would, rather than wait it out.
		_, uerr := c.jar.Update(ctx, op, rec.Holder, idem.Change{Now: now, LastStatus: rec.LastStatus,
			LastError: dsn.MaskPasswords(rec.LastError), NextAttempt: rec.NextAttempt, Release: true})
		if uerr != nil && !errors.Is(uerr, idem.ErrLeaseLost) && !errors.Is(uerr, idem.ErrNotFound) {
			// The jar failed (a lock timeout, the database down): say so,
			// rather than report the lease of a holder that is gone.
			return fmt.Errorf("client: abandon %q: releasing the lease of its holder, which is gone: %w", op, uerr)
		}
		rec, err = c.jar.Acquire(ctx, op, holder, now, time.Minute)
	}
	if errors.Is(err, idem.ErrLeased) {
		return fmt.Errorf("client: abandon %q: held by %q until %s: %w; wait for that process to finish sending it, or stop it, then abandon it again",
			op, rec.Holder, rec.LeaseUntil.Format(time.RFC3339), err)
	}
	if err != nil {
		return fmt.Errorf("client: abandon %q: %w", op, err)
	}
	// release gives the lease back and leaves the record as it is, but for
	// the passwords its LastError quotes, which an earlier version stored
	// as they were: masked, as the Transport writes them. It runs whatever
	// ended ctx: this process is alive, and nothing should wait out its
	// lease.
	release := idem.Change{Now: now, Release: true, LastStatus: rec.LastStatus, LastError: dsn.MaskPasswords(rec.LastError),
		NextAttempt: rec.NextAttempt}
	if rec.State != idem.StatePending && rec.State != idem.StateReconcile {
		// It finished, or was abandoned, between the two reads: leave it
		// as it is.
		_, _ = c.jar.Update(context.WithoutCancel(ctx), op, holder, release)
		if rec.State == idem.StateAbandoned {
			return nil
		}
		return &StateError{Op: op, Key: rec.Key, State: rec.State, verb: "abandon", detail: ", its outcome is known"}
	}
	ch := release
	ch.State, ch.Note, ch.NextAttempt = idem.StateAbandoned, reason, time.Time{}
	if _, err := c.jar.Update(ctx, op, holder, ch); err != nil {
		// ctx ended, or the jar failed: the operation stays as it was.
		_, _ = c.jar.Update(context.WithoutCancel(ctx), op, holder, release)
		return fmt.Errorf("client: abandon %q: %w", op, err)
	}
	return nil
}

// Forget deletes op from the jar, once its outcome is known or
// reconciled (done, failed, reconcile or abandoned). It returns an error
// wrapping idem.ErrNotFound for an unknown op and a *StateError (ErrState)
// for a pending one: forgetting it would lose its key while its outcome is unknown;
// Resume or Abandon it first.
//
// Forget reads op's record, then deletes it only if it is still the record
// read: when the jar is a KeyForgetter, by ForgetKey with the key read. A
// call that began the name again in between (Begin replaces an abandoned
// operation with a new, pending one under a new key) keeps its operation,
// and Forget returns a *StateError without a State. Over a jar that is not a KeyForgetter,
// Forget deletes op whatever it became after the read, and such a call can
// lose its key: forget abandoned operations there only when nothing uses
// their names.
func (c *Client) Forget(ctx context.Context, op string) error {
	if err := c.enter(ctx); err != nil {
		return fmt.Errorf("client: forget %q: %w", op, err)
	}
	defer c.calls.Done()
	rec, err := c.jar.Get(ctx, op)
	if err != nil {
		return fmt.Errorf("client: forget %q: %w", op, err)
	}
	if rec.State == idem.StatePending {
		return &StateError{Op: op, Key: rec.Key, State: rec.State, verb: "forget",
			detail: ", its outcome unknown; resume or abandon it first"}
	}
	kf, ok := c.jar.(KeyForgetter)
	if !ok {
		err = c.jar.Forget(ctx, op)
	} else if err = kf.ForgetKey(ctx, op, rec.Key); errors.Is(err, idem.ErrNotForgotten) {
		return &StateError{Op: op, Key: rec.Key, verb: "forget", err: err,
			detail: "the operation changed after it was read (begun again under a new key, or pending); it is kept"}
	}
	if err != nil {
		return fmt.Errorf("client: forget %q: %w", op, err)
	}
	return nil
}

// sender is the Transport's Base: it adds Options.Header to each attempt
// and tells the call's tracker what was sent. It sends nothing itself but
// through its base, once: an error of the Proxy function of a base that
// is an *http.Transport wraps idem.ErrNotSent, as the Transport makes it
// when that is its own Base.
type sender struct {
	base   http.RoundTripper
	header func(*http.Request) error
	c      *Client // counts the attempts in flight, for Abandon
}

func (s *sender) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Values(idem.KeyHeader)
	if s.header != nil && sameOrigin(r) {
		method := r.Method
		r = r.Clone(r.Context())
		t, _ := presend.From(r.Context()).(*tracker)
		// Until Header returns, a panic of it sends nothing: the
		// Transport neither counts the attempt nor leaves an operation
		// without a name pending (presend).
		t.presend(true)
		err := s.header(r)
		t.presend(false)
		if r.Header == nil {
			// A Header that replaced the map with nil: the key is set
			// again below, as into any header Header left.
			r.Header = make(http.Header)
		}
		if err != nil {
			err = fmt.Errorf("client: Options.Header: %w: %w", idem.ErrNotSent, err)
		} else if len(key) > 0 && r.Method != method {
			// The jar records the operation's method, which a resume
			// sends again and the server fingerprints with the key.
			err = fmt.Errorf("client: Options.Header: %w: it changed a keyed request's method from %q to %q, which the jar records: leave it as it is",
				idem.ErrNotSent, method, r.Method)
		} else if what := sendable.Head(r); what != "" && sendable.Over(s.base) {
			// What net/http does not send as it is, which the
			// Transport refused before it stored the operation.
			err = fmt.Errorf("client: Options.Header: %w: %w: %s, which an http.Transport does not send", idem.ErrNotSent, idem.ErrInvalidHeader, what)
		} else if w, ok := r.Context().Value(withheldKey{}).(*CredentialsError); ok && len(key) > 0 && key[0] == w.Key {
			// A resume's attempt (not a request a redirect made): Header
			// must add the credentials the first send carried on its
			// request.
			if missing := secrethdr.Lacking(r.Header, w.Missing); len(missing) > 0 {
				ce := *w
				ce.Missing, ce.header = missing, true
				err = fmt.Errorf("%w: %w", idem.ErrNotSent, &ce)
			}
		}
		if err != nil {
			// Nothing was sent: the Transport neither counts nor retries
			// the attempt.
			if r.Body != nil {
				r.Body.Close()
			}
			return nil, err
		}
		if len(key) > 0 {
			// The operation's key, not one Header set or removed, in any
			// case of its name: another key is another operation.
			keyhdr.Delete(r.Header)
			r.Header[idem.KeyHeader] = slices.Clone(key)
		}
	}
	if len(key) > 0 {
		op := idem.Operation(r.Context())
		if t, ok := presend.From(r.Context()).(*tracker); ok {
			t.sent(op, key[0])
			if op != "" && t.startSending(op) {
				// Sending from its first attempt until the Transport has
				// recorded its outcome and returned (tracked): an attempt
				// may outlast its lease, which Abandon must not take as
				// free.
				s.c.send(op, 1)
			}
		}
	}
	resp, err := s.base.RoundTrip(r)
	if err != nil && sendable.ProxyRefused(s.base, r, err) {
		err = fmt.Errorf("%w: http.Transport's Proxy: %w", idem.ErrNotSent, err)
	}
	return resp, err
}

// withheldKey is the context key of a resume's *CredentialsError template:
// the operation and the credentials its first send carried.
type withheldKey struct{}

// sameOrigin reports whether every request of r's redirect chain went to
// r's scheme and host: credentials do not follow a redirect to another
// host, as net/http drops Authorization then, nor to another scheme (from
// https to http they would cross the network in the clear, where net/http
// sends Authorization all the same), nor any redirect after it, back home
// included, as net/http drops Authorization for the rest of a chain.
// redirect.Walk visits them.
func sameOrigin(r *http.Request) bool {
	same := true
	redirect.Walk(r, func(prev *http.Request) bool {
		same = prev.URL.Host == r.URL.Host && strings.EqualFold(prev.URL.Scheme, r.URL.Scheme)
		return same
	})
	return same
}

// Unwrap returns the base transport, for the Transport's check of a URL's
// scheme over an *http.Transport.
func (s *sender) Unwrap() http.RoundTripper { return s.base }

// SendsOnceThrough returns the base transport, through which the sender
// sends each attempt once (sendable.Once): over an *http.Transport, the
// Transport abandons an unnamed operation whose every attempt failed to
// connect, as over the http.Transport itself.
func (s *sender) SendsOnceThrough() http.RoundTripper { return s.base }

func (s *sender) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := s.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
}

// tracker counts the attempts of one Do call and keeps the operation's
// name and the key they carried. It is the call's presend.Guard.
type tracker struct {
	mu       sync.Mutex
	attempts int
	op, key  string
	sending  string // the operation counted in Client.sending, until the Transport returns
	header   bool   // Options.Header is running, before the attempt is sent
}

// presend records whether Options.Header is running (on a nil t, none).
func (t *tracker) presend(running bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.header = running
}

// Running implements presend.Guard.
func (t *tracker) Running() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.header
}

// startSending reports whether op is to be counted in Client.sending: at
// its call's first attempt, once.
func (t *tracker) startSending(op string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sending != "" {
		return false
	}
	t.sending = op
	return true
}

// stopSending returns the operation to take out of Client.sending, or "".
func (t *tracker) stopSending() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	op := t.sending
	t.sending = ""
	return op
}

func (t *tracker) sent(op, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.attempts++
	if op != "" {
		t.op = op
	}
	if key != "" {
		t.key = key
	}
}

func (t *tracker) get() (attempts int, op, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.attempts, t.op, t.key
}
