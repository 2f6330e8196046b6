package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/internal/canon"
	"github.com/idemkit/idem/internal/keyhdr"
	"github.com/idemkit/idem/internal/redirect"
	"github.com/idemkit/idem/internal/sendable"
	"github.com/idemkit/idem/retry"
)

// KeyHeader is the request header that carries the key.
const KeyHeader = "Idempotency-Key"

type opKey struct{}

// WithOperation returns a context that names the logical operation of the
// requests sent with it. The same name reuses the same key, in this process
// and, through the jar, after a restart. Without a name each RoundTrip call
// is an operation of its own: named by the caller's Idempotency-Key when the
// request has one, otherwise by a fresh UUID v7, which orders by creation
// time (the key it gets stays a random UUID v4). A jar may bound a name's
// length: pgjar stores names of up to 2048 bytes.
func WithOperation(ctx context.Context, name string) context.Context {
	if ctx == nil {
		panic("idem: WithOperation of a nil context") // as context.WithValue
	}
	return &opCtx{ctx, name}
}

// opCtx is a context that names an operation: context.WithValue's, but
// for one allocation where WithValue makes two (its context and the
// name, boxed), in each unnamed call.
type opCtx struct {
	context.Context
	op string
}

func (c *opCtx) Value(key any) any {
	if _, ok := key.(opKey); ok {
		return c.op
	}
	return c.Context.Value(key)
}

func (c *opCtx) String() string {
	return fmt.Sprintf("%v.WithOperation(%q)", c.Context, c.op)
}

// Operation returns the operation name set by WithOperation, or "".
func Operation(ctx context.Context) string {
	if c, ok := ctx.(*opCtx); ok {
		return c.op // without boxing it
	}
	name, _ := ctx.Value(opKey{}).(string)
	return name
}

// Transport is an http.RoundTripper that makes non-idempotent requests safe
// to retry: it gives each logical operation one Idempotency-Key, persists it
// in Jar before the first byte is sent, and retries with the same key.
//
// Transport keeps the http.RoundTripper contract:
//
//   - It is safe for concurrent use by multiple goroutines. The zero value
//     (with a Jar) sends through http.DefaultTransport with the default
//     retry.Policy.
//   - Requests whose method is not in Methods (GET, HEAD, PUT, DELETE, … by
//     default) pass through to Base untouched: no key, no jar, no retry;
//     but for one that http.Client made to follow a redirect with another
//     method than the chain's first request (a POST's 303, a DELETE's
//     301: a GET), sent without the Idempotency-Key that http.Client
//     copied onto it from that first request: the key is the first
//     request's (an operation's), not the GET's. A 307 or 308 of a method
//     not in Methods sends the same request again, with its key.
//   - It never modifies the caller's request: every attempt is a copy with
//     a Header of its own, and the key header goes on the copy only. The
//     copy's context names the operation, unnamed ones included:
//     Operation(req.Context()) in Base returns it. The request's context
//     ends the call, its waits between attempts included; the deprecated
//     Request.Cancel channel, which each copy carries to Base, does not end
//     a wait (http.Client with a Timeout turns it into the context's end).
//   - It always closes the caller's body, even on error. It reads the body
//     (or one from GetBody) before the first send, and closes it when the
//     request's context ends meanwhile: a Read blocked in a body that its
//     Close ends (a pipe whose writer stalls) then ends, and the call with
//     the context's error, as through http.Transport. An http.Server's
//     request body is not such a body (its Close waits for the Read): one
//     passed on as is holds the call as long as its client stalls, within
//     the server's ReadTimeout.
//   - The body is sent again through req.GetBody (set by http.NewRequest
//     for bytes, strings and buffers). With GetBody, every body comes
//     from it: the one read for the fingerprint and the jar, and each
//     attempt's, the first's included, while req.Body is closed unread
//     (net/http sends req.Body first). GetBody must give the same bytes
//     on each call: only a body of memory's length is checked, other
//     bytes are sent under the key, and a server that checks its
//     fingerprints refuses a retry that carries them (422). Without
//     GetBody, a body of at most
//     MaxBuffer bytes is buffered; a larger one is refused before anything
//     is sent with ErrBodyNotRewindable. Each attempt declares the body's
//     length (ContentLength), and a request whose positive ContentLength
//     is not that length is refused with ErrRequestBody, as is a body of
//     memory (bytes.Reader, strings.Reader, bytes.Buffer) from GetBody
//     with another number of bytes left to read: a reader it gave before,
//     read, which HTTP/2 would send short, under the key, and a GetBody
//     that returns neither a reader nor an error. A request with
//     Trailer is sent chunked, as net/http sends trailers; the jar does
//     not store them, and a resume sends none.
//   - A key the caller set in the Idempotency-Key header (under any
//     spelling of the name) is used instead of a generated one, as it is
//     given. It must be one header value of at most 255 characters that
//     the reference server (testserver.ParseKey) accepts: 1 to 255
//     printable ASCII characters without a space at either end, bare, or
//     quoted as a Structured Field string ("a,b", escaping only \" and \\),
//     which a key with a comma must be. Any other is refused with
//     ErrInvalidKey before anything is stored or sent. So is a URL without
//     a host, with a port no dial takes (0, or above 65535), or, over an
//     *http.Transport (Base, or one that Base wraps and returns from an
//     Unwrap() http.RoundTripper method), of a scheme other than http and
//     https, with ErrInvalidURL; and, over such a Transport, a header or
//     trailer that net/http refuses unsent (a field name that is not a
//     token, a value with a line break) or a method that is not a
//     token, with ErrInvalidHeader.
//   - The key, the fingerprint (method, URL, canonical body) and the
//     creation time are in the jar, durably, before the first send. A named
//     operation called again with a different request is refused with a
//     *MismatchError: nothing is sent. No credential is stored: the URL is
//     stored and fingerprinted without its userinfo (user:password@), and
//     the header without the values of what SecretHeader names (their
//     names stay, for Record.Withheld). Nor is the URL's
//     #fragment, which net/http does not send: requests that differ in
//     it alone are the same request.
//   - It interprets responses only to decide on a retry (retry.Classify:
//     408, 409, 425, 429, 502, 503, 504 and network errors; not those statuses when
//     replayed, which are the server's saved answer) and on the
//     operation's state. Each superseded response body is drained (at
//     most 64 KiB, for at most a second) and closed. The final response
//     comes back with a nil error whatever its status, 422 included, and
//     so does the last retryable response when the call's attempts or
//     budget run out: the operation then stays pending, and its
//     Retry-After, when it has one, is recorded as the operation's
//     NextAttempt. A 401 or 407 (the credentials refused, the request not
//     applied) is returned at once and leaves the operation in the state
//     it had, but for a call without a name refused at its only send,
//     which is done: no call can name it to resume it. A 101 Switching Protocols answer is final, and its Body is
//     the upgraded connection, an io.ReadWriteCloser, as net/http gives it.
//     A response's Request is the attempt Base sent, key included: one
//     that Base leaves nil is set to it, as net/http's Transport sets it.
//     A done or failed operation called again keeps its recorded outcome
//     where a pending one would stay pending, and a done one that
//     succeeded (2xx) keeps it whatever the final answer (see the README's
//     contract).
//   - An error of Base counts as an attempt that may have been sent, and
//     is retried as retry.Classify says, unless it wraps ErrNotSent: Base
//     says it sent nothing of the attempt (a circuit breaker, a rate
//     limiter, credentials it could not get), which is neither counted
//     nor retried (see ErrNotSent). So is the error of the Proxy function
//     of a Base that is an *http.Transport, which net/http returns as it
//     is, before it dials: the error then wraps ErrNotSent.
//   - A non-nil error means there is no response. It is one of this
//     package's typed errors (*PendingError, *ReconcileError,
//     *MismatchError, *JarError, or ErrNilJar, ErrInvalidKey, ErrInvalidURL, ErrInvalidHeader,
//     ErrBodyNotRewindable, ErrRequestBody, ErrAbandoned, ErrNotFound,
//     ErrNotSent wrapped), or the context's error, matching its cause too, when the
//     request's context was done before the call; never a *url.Error,
//     which http.Client adds. http.Client.Timeout bounds the whole call, retries and waits
//     included, and when it fires http.Client may replace this error with
//     its own, which only says that the time ran out (it does when its own
//     timer is seen before the Transport returns: for a timeout that fires
//     during an attempt, usually): errors.Is(err,
//     ErrPending) and errors.As with a *PendingError then fail, although
//     the operation stays pending. Bound a call with its request's context
//     (context.WithTimeout) and each attempt with Policy.AttemptTimeout
//     instead.
//   - The horizon (Policy.Horizon, 24 h) runs from the first-send time
//     stored in the jar, not from an in-memory timer that a restart would
//     reset. Past it, RoundTrip returns a *ReconcileError without sending,
//     and a pending operation is marked StateReconcile (a done or failed
//     one keeps its known outcome).
//   - At most one holder sends an operation at a time: a lease in the jar
//     (Lease) covers each call, across goroutines and processes sharing
//     the jar, and is renewed before each attempt. A holder whose process
//     is gone (same host) is taken over at once; any other waits for the
//     lease to end. An attempt that may run longer than half the lease
//     renews it every half lease while it runs; one whose renewal the jar
//     refuses or cannot write may be joined by another holder's attempt
//     once the lease ends: the server's in-flight claim answers it 409.
//   - http.Transport may itself re-send one attempt on a dead reused
//     connection, because the key header makes the request replayable: the
//     server can see more attempts than the SDK counts. That is safe. Over
//     HTTP/2 it sends a request again, whatever its headers, when the
//     server refused its stream, or reset it with PROTOCOL_ERROR (a
//     stream it may have run), or the connection could take no new one:
//     up to 7 times, with waits of up to 32 s between them, within the
//     attempt's context.
//   - A 307 or 308 answer is final: the operation is done. An http.Client
//     that follows it sends the request again, to the new URL, through
//     the Transport, which takes it for a new request: unnamed, it is an
//     operation of its own with a new key; named by WithOperation or by
//     the caller's Idempotency-Key, it is refused with a *MismatchError
//     (nothing is sent to the new URL), wrapped in an error that names the
//     redirect, which http.Client returns. To get
//     the redirect back as the answer instead, set the http.Client's
//     CheckRedirect to return http.ErrUseLastResponse for the methods in
//     Methods, as package client does.
//   - CloseIdleConnections is forwarded to Base.
type Transport struct {
	// Base sends each attempt, a copy of the request with the key in its
	// header and the operation's name in its context. A RoundTripper that
	// sends a request again on a 401 (an OAuth2 client refreshing its
	// token) belongs here, where its second send is the same attempt under
	// the same key. Outside the Transport its second send is another call:
	// unnamed, an operation of its own under a new key (the first, refused
	// at its only send, done with its 401); named, the same operation under
	// the same key. Nil means http.DefaultTransport, whose pool
	// keeps 2 idle connections per host (MaxIdleConnsPerHost): with many
	// concurrent calls to one host, most connections are closed and dialed
	// again, which costs 32–42 % of the throughput at 32 callers (see
	// BENCHMARKS.md). For such callers, set Base to an *http.Transport with
	// MaxIdleConnsPerHost at least their concurrency.
	Base http.RoundTripper

	// Jar stores the operations. It is required for keyed requests: a nil
	// Jar fails each one with ErrNilJar. When it is a Deferrer, a call does
	// not wait for the writes it makes after an answer (the outcome, the
	// lease's release).
	Jar Jar

	// Policy is the retry policy; the zero value is the default.
	Policy retry.Policy

	// Budget, when not nil, is a retry quota shared by every call through
	// this Transport (and any other Transport given the same Budget): each
	// retry draws from it and final answers refill it. When it cannot pay
	// for a retry, the call stops as when its attempts run out: the last
	// retryable response comes back as is, or a *PendingError when there
	// is none, and the operation stays pending. First attempts never draw,
	// and a retry paid for but never sent (the call's context ended during
	// its wait, or a hook panicked) gives its cost back. Nil means retries
	// are limited by Policy alone.
	Budget *retry.Budget

	// Methods are the methods that get a key. Nil means POST and PATCH.
	// Names match in any case, those of nil too: a "post" is keyed. An
	// entry that is not a method (a token) fails every request with
	// ErrInvalidMethods.
	Methods []string

	// MaxBuffer bounds the body read into memory: to buffer a body without
	// GetBody, and to canonicalise a JSON body (a larger body with GetBody
	// is fingerprinted byte for byte, streamed). Zero or negative means 8
	// MiB. The bytes of a streamed body, sent again under its operation's
	// name through a Transport whose MaxBuffer holds them (client's, or
	// this one's after a restart with a larger MaxBuffer), are the same
	// request.
	// A canonicalised body streamed by a Transport with a smaller MaxBuffer
	// is not, unless it is in canonical form: a *MismatchError.
	MaxBuffer int64

	// MaxStoredBody is the largest body stored in the jar with the request,
	// so that the operation can be resumed after a restart without the
	// caller. Zero means 64 KiB; negative means never store bodies. A body
	// larger than MaxBuffer is never stored, whatever MaxStoredBody says:
	// it is streamed, never held whole. The fingerprint is stored whatever
	// it says: an unsalted SHA-256 of the method, URL and body, from which
	// a secret in the body that can be guessed (a password) can be found
	// again by trying candidates.
	MaxStoredBody int64

	// Lease is how long one call holds an operation before another holder
	// may take it over. Zero or negative means one minute, or twice
	// Policy.AttemptTimeout when that is longer (at most a century). An
	// attempt that may run longer than half of it (no AttemptTimeout, or a
	// longer one) renews it every half lease while it runs, an Acquire of
	// the jar's each time.
	Lease time.Duration

	// Hooks are called on each attempt, retry, give-up, replay and
	// reconciliation. The zero value calls nothing. A hook's panic reaches
	// the caller of RoundTrip after the call gave its lease back and
	// closed the response it held (see Hooks).
	Hooks Hooks

	// Logger receives a record per retry, per wait for another holder's
	// lease (naming the holder and the lease's end) and per wait for the next attempt time an earlier call stored
	// (Info), give-up and reconciliation (Warn), and attempt (Debug), and
	// one (Warn) when the
	// jar does not take a change of a call's progress (its outcome, which
	// leaves the operation pending while the caller gets the answer; a
	// Retry-After; its lease's release), with the jar's error: a jar
	// closed, or, from a Jar that is not a Deferrer, an Update refused,
	// ErrLeaseLost once another holder took the lease over. A Deferrer
	// drops a change refused when it applies it, and the Transport logs
	// nothing (see Deferrer): keyjar's and pgjar's own Options.Logger do. Each record's err is the error's message with the
	// passwords it quotes masked (user:xxxxx@, password=xxxxx), as the jar's
	// LastError keeps it; Hooks get the error itself. Nil means silent. A
	// panic in its handler is handled as a hook's.
	Logger *slog.Logger
}

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) keyed(method string) bool { return keyhdr.Keyed(t.Methods, method) }

func (t *Transport) maxBuffer() int64 {
	if t.MaxBuffer > 0 {
		return t.MaxBuffer
	}
	return 8 << 20
}

func (t *Transport) maxStoredBody() int64 {
	switch {
	case t.MaxStoredBody < 0:
		return -1
	case t.MaxStoredBody == 0:
		return 64 << 10
	}
	return t.MaxStoredBody
}

func (t *Transport) lease(p retry.Policy) time.Duration {
	if t.Lease > 0 {
		return t.Lease
	}
	// Capped before doubling: a timeout near the largest duration must not
	// wrap around into the floor, nor end in a time no jar can store.
	return max(time.Minute, 2*min(p.AttemptTimeout, maxLease/2))
}

// maxLease is the longest default lease: a century.
const maxLease = 100 * 365 * 24 * time.Hour

// maxNextAttempt is the farthest a call stores an operation's next attempt
// time from its first send, whatever the Horizon: a century, which every
// jar of this module can hold.
const maxNextAttempt = maxLease

// CloseIdleConnections closes the idle connections of Base, when it has
// such a method.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base().(closeIdler); ok {
		ci.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper with the rules in the Transport
// documentation.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if i := sendable.NonMethod(t.Methods); i >= 0 {
		// A request it was meant to key would go out unkeyed, unrecorded.
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("%w: Transport.Methods[%d] is %q, which no request's method matches (a method is a token: letters, digits and !#$%%&'*+-.^_`|~, no space or comma); nothing was sent", ErrInvalidMethods, i, t.Methods[i])
	}
	if !t.keyed(req.Method) {
		if req.Response != nil && hasKeyHeader(req.Header) && req.Method != redirect.First(req).Method {
			// A redirect http.Client follows with another method (a 303's
			// GET): the key it copied from the chain's first request is
			// that request's, not this one's. A 307 or 308 sends the same
			// request again, with the key its caller set.
			req = req.Clone(req.Context())
			keyhdr.Delete(req.Header)
		}
		return t.base().RoundTrip(req)
	}
	if req.Body != nil {
		defer req.Body.Close()
	}
	if t.Jar == nil {
		return nil, ErrNilJar
	}
	key, err := callerKey(req.Header)
	if err != nil {
		return nil, err
	}
	if req.URL == nil || req.URL.Host == "" {
		return nil, fmt.Errorf("%w: it has no host (nothing was stored or sent); give the server's address with its scheme, as in https://api.example.com/v1/charges", ErrInvalidURL)
	}
	if sendable.Over(t.base()) {
		// Refused by net/http before it sends anything, each attempt
		// alike, and a resume too.
		if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
			return nil, fmt.Errorf("%w: scheme %q is neither http nor https, which an http.Transport sends (nothing was stored or sent)", ErrInvalidURL, req.URL.Scheme)
		}
		if what := sendable.Head(req); what != "" {
			return nil, fmt.Errorf("%w: %s, which an http.Transport does not send (nothing was stored or sent)", ErrInvalidHeader, what)
		}
	}
	if p := req.URL.Port(); p != "" {
		// url.Parse takes any digits; the dial refuses the port, each
		// attempt alike, and a resume would too.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: port %s is not one from 1 to 65535 (nothing was stored or sent)", ErrInvalidURL, p)
		}
	}
	if err := retry.CtxErr(req.Context()); err != nil {
		// Done before the call began: nothing is read, stored or sent,
		// and the operation, if the jar has it, stays as it is.
		return nil, err
	}
	c := &call{t: t, req: req, policy: t.Policy.Defaults(), op: Operation(req.Context()), callerKey: key}
	if err := t.prepareBody(req, &c.body); err != nil {
		return nil, err
	}
	defer c.unwind(req.Context())
	resp, err := c.run(req.Context())
	c.returned = true
	return resp, err
}

// maxKeyLen is the longest key a server accepts (Stripe, testserver).
const maxKeyLen = keyhdr.MaxLen

// callerKey returns the key the caller set in the Idempotency-Key header, or
// "" when there is none, and refuses one that no server would accept. A
// header set in the map directly under another spelling (net/http sends it
// as it is) counts too: the attempts carry the key under KeyHeader only.
func callerKey(h http.Header) (string, error) {
	vs := h[KeyHeader]
	for name, v := range h {
		if keyhdr.Is(name) && name != KeyHeader {
			vs = append(vs[:len(vs):len(vs)], v...)
		}
	}
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("%w: the header is set %d times; set it once", ErrInvalidKey, len(vs))
	}
	k := vs[0]
	switch {
	case k == "":
		return "", fmt.Errorf("%w: the key is empty; delete the header to have one generated", ErrInvalidKey)
	case len(k) > maxKeyLen:
		// The value as sent, quotes included: a server that knows no
		// quoted form takes them as part of the key.
		return "", fmt.Errorf("%w: the key is %d characters long; the limit is %d", ErrInvalidKey, len(k), maxKeyLen)
	}
	if _, err := keyhdr.Parse(k); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return k, nil
}

// hasKeyHeader reports whether h holds KeyHeader in any spelling.
func hasKeyHeader(h http.Header) bool {
	for name := range h {
		if keyhdr.Is(name) {
			return true
		}
	}
	return false
}

// reqBody is how a request's body is produced for each attempt.
type reqBody struct {
	open func() (io.ReadCloser, error) // nil for no body
	size int64
	fp   string // hex SHA-256 of method, URL and canonical body
	// oldFPs are the fingerprints that earlier versions wrote for the
	// request: with the URL's fragment, and with its userinfo too. None
	// for a URL without either.
	oldFPs []string
	// rawFP is the fingerprint of a canonicalised body's bytes as they
	// are, as a Transport with a smaller MaxBuffer streams it; "" when
	// they are their canonical form, or were streamed. For a body the
	// jar stores, it is only made when a stored fingerprint is not fp
	// (matches), from raw: a call pays no second hash to meet a record
	// that a smaller MaxBuffer wrote, which is rare.
	rawFP  string
	raw    []byte // the body whose rawFP is yet to be made, or nil
	method string // the request's method, when raw is set
	saved  []byte // the body, when it is small enough to store in the jar
	url    string // the request's URL
}

// matches reports whether a stored fingerprint is this request's.
func (rb *reqBody) matches(fp string) bool {
	if fp == rb.fp || slices.Contains(rb.oldFPs, fp) {
		return true
	}
	if rb.raw != nil {
		rb.rawFP, rb.raw = fingerprint(rb.method, rb.url, rb.raw), nil
	}
	return rb.rawFP != "" && fp == rb.rawFP
}

// same reports whether rec is this request: its fingerprint is, or rec
// holds this request's method, URL and body, byte for byte. The second is
// for a record whose fingerprint an earlier version made of a body this
// version fingerprints otherwise (a JSON body with a key twice, bytes that
// are not UTF-8 or half a surrogate pair, its type under a key that is not
// canonical: see canon.JSON), which its resume sends unchanged.
func (rb *reqBody) same(rec Record, method string) bool {
	if rb.matches(rec.Fingerprint) {
		return true
	}
	return rb.saved != nil && rec.Body != nil && rec.BodyStored() &&
		rec.Method == method && rec.URL == rb.url && bytes.Equal(rec.Body, rb.saved)
}

// fingerprint returns the fingerprint of a request whose body is hashed
// as body is, as prepareBody makes it of a body it does not canonicalise.
func fingerprint(method, url string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method + "\n" + url + "\n"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// prepareBody fingerprints the body into rb and arranges to produce it
// again for every attempt, before anything is sent.
func (t *Transport) prepareBody(req *http.Request, rb *reqBody) error {
	rb.url = publicURL(req.URL)
	// h is only ever called, never passed on as an io.Writer, so that it
	// and the buffers written to it stay on the stack.
	h := sha256.New()
	var head [256]byte
	h.Write(append(append(append(append(head[:0], req.Method...), '\n'), rb.url...), '\n'))
	var old oldHashes // the fingerprints of earlier versions, for records that have them
	for _, u := range oldURLs(req.URL) {
		h := sha256.New()
		h.Write([]byte(req.Method + "\n" + u + "\n"))
		old = append(old, h)
	}
	if req.Body == nil || req.Body == http.NoBody {
		rb.saved = []byte{}
	} else {
		buf, rest, err := t.readBody(req, rb)
		if err != nil {
			return err
		}
		if rest == nil {
			rb.size = int64(len(buf))
			cb := canonBuffers.Get().(*canon.Buffer)
			c := cb.Body(canon.ContentType(req.Header), buf)
			h.Write(c)
			old.write(c)
			stored := rb.size <= t.maxStoredBody()
			if !bytes.Equal(c, buf) {
				// A Transport whose MaxBuffer this body exceeds hashed its
				// bytes as they are: that fingerprint is this request's too.
				// A body the jar stores is kept anyway: its fingerprint is
				// made if a record needs it (matches).
				if stored {
					rb.raw, rb.method = buf, req.Method
				} else {
					rb.rawFP = fingerprint(req.Method, rb.url, buf)
				}
			}
			if cb.Cap() <= maxPooledCanon {
				canonBuffers.Put(cb)
			}
			if stored {
				rb.saved = slices.Clip(buf)
			}
		} else {
			// Too large to canonicalise: hash it byte for byte, streamed.
			h.Write(buf)
			old.write(buf)
			rb.size = int64(len(buf))
			chunk := make([]byte, 32<<10)
			for err == nil {
				var n int
				n, err = rest.Read(chunk)
				h.Write(chunk[:n])
				old.write(chunk[:n])
				rb.size += int64(n)
			}
			rest.Close()
			if err != io.EOF {
				return fmt.Errorf("%w: %w", ErrRequestBody, err)
			}
		}
	}
	if req.ContentLength > 0 && rb.size != req.ContentLength {
		// net/http refuses it too, but only as it sends: after Begin.
		return fmt.Errorf("%w: ContentLength is %d, the body has %d bytes", ErrRequestBody, req.ContentLength, rb.size)
	}
	var sum [sha256.Size]byte
	var text [2 * sha256.Size]byte
	hex.Encode(text[:], h.Sum(sum[:0]))
	rb.fp = string(text[:])
	for _, o := range old {
		rb.oldFPs = append(rb.oldFPs, hex.EncodeToString(o.Sum(nil)))
	}
	return nil
}

// oldHashes are the hashes of a request's earlier fingerprints.
type oldHashes []hash.Hash

func (hs oldHashes) write(p []byte) {
	for _, h := range hs {
		h.Write(p)
	}
}

// publicURL is u as a record keeps it and as it is fingerprinted: without
// its userinfo (user:password@), which net/http sends as Basic credentials,
// and without its fragment (#...), which net/http does not send.
func publicURL(u *url.URL) string {
	if u.User == nil && u.Fragment == "" {
		return u.String()
	}
	v := *u
	v.User, v.Fragment, v.RawFragment = nil, "", ""
	return v.String()
}

// oldURLs are u as earlier versions fingerprinted it, when that was not
// publicURL(u): with its userinfo and fragment, and with its fragment
// alone (the versions that left the userinfo out).
func oldURLs(u *url.URL) []string {
	if u.User == nil && u.Fragment == "" {
		return nil
	}
	urls := []string{u.String()}
	if u.User != nil && u.Fragment != "" {
		v := *u
		v.User = nil
		urls = append(urls, v.String())
	}
	return urls
}

// readBody arranges in rb.open to produce the body again for every
// attempt, and returns the body when it is at most MaxBuffer bytes. A
// larger body with GetBody is returned in two parts: the MaxBuffer bytes
// read and rest, a reader of the others that the caller must close.
func (t *Transport) readBody(req *http.Request, rb *reqBody) (buf []byte, rest io.ReadCloser, err error) {
	limit := t.maxBuffer()
	if req.GetBody == nil {
		buf, err := body.ReadAtMostContext(req.Context(), req.Body, limit, req.ContentLength)
		if errors.Is(err, body.ErrTooLarge) {
			return nil, nil, fmt.Errorf("%w: it has no GetBody and is longer than MaxBuffer (%d bytes); build the request with http.NewRequest from a bytes.Reader or set GetBody", ErrBodyNotRewindable, limit)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrRequestBody, err)
		}
		rb.open = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		return buf, nil, nil
	}
	rb.open = req.GetBody
	rc, err := getBody(req.GetBody)
	if err != nil {
		return nil, nil, err
	}
	// A slow, stalled or endless body ends with the request.
	buf, err = body.ReadAtMostContext(req.Context(), rc, limit, req.ContentLength)
	if errors.Is(err, body.ErrTooLarge) {
		return buf, body.WithContext(req.Context(), rc), nil
	}
	rc.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRequestBody, err)
	}
	return buf, nil, nil
}

// getBody returns a new reader of the request's body from get, its
// GetBody. A nil reader without an error is refused: the request has a body
// to send (net/http's redirects would send none).
func getBody(get func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	rc, err := get()
	if err != nil {
		return nil, fmt.Errorf("%w: GetBody: %w", ErrRequestBody, err)
	}
	if rc == nil {
		return nil, fmt.Errorf("%w: GetBody returned no body and no error", ErrRequestBody)
	}
	return rc, nil
}

// canonBuffers keep the space of canonical forms from one call to the
// next: a canonical form is only hashed, never kept. A buffer that grew
// beyond maxPooledCanon for a large body is left to the collector.
var canonBuffers = sync.Pool{New: func() any { return new(canon.Buffer) }}

const maxPooledCanon = 64 << 10

// newKey returns a fresh key, a UUID v4, and the name of an operation that
// has none, a UUID v7 (RFC 9562): 48 bits of Unix milliseconds, then random
// bits. Both are drawn from crypto/rand at once. A jar indexes its records
// by operation: a name that grows with time adds to the end of a B-tree
// index, where random names would each dirty a page of their own
// (BENCHMARKS.md has the figures). newKey fails closed when the system's
// random source does.
func newKey(now time.Time) (key, op string, err error) {
	var buf [72]byte
	text, err := appendKey(buf[:0], now)
	if err != nil {
		return "", "", err
	}
	s := string(text) // one allocation for the two
	return s[:36], s[36:], nil
}

// newIDs returns newKey's key and name, and a lease holder id as NewHolder
// makes it: one allocation for the three.
func newIDs(now time.Time) (key, op, holder string, err error) {
	prefix, err := holderPrefix()
	if err != nil {
		return "", "", "", err
	}
	var buf [256]byte
	text, err := appendKey(buf[:0], now)
	if err != nil {
		return "", "", "", err
	}
	s := string(appendHolder(text, prefix))
	return s[:36], s[36:72], s[72:], nil
}

// appendKey appends the text of newKey's key and name to dst.
func appendKey(dst []byte, now time.Time) ([]byte, error) {
	var b [32]byte // drawn here, not by the uuid package, to stay on the stack
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("idem: generating key: %w", err)
	}
	k, o := b[:16], b[16:]
	k[6] = k[6]&0x0f | 0x40 // version 4
	k[8] = k[8]&0x3f | 0x80 // variant 10
	ms := uint64(now.UnixMilli())
	o[0], o[1], o[2], o[3], o[4], o[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	o[6] = o[6]&0x0f | 0x70 // version 7
	o[8] = o[8]&0x3f | 0x80
	return appendUUID(appendUUID(dst, k), o), nil
}

// appendUUID appends the canonical text of the UUID u (16 bytes), as
// uuid.UUID.String writes it.
func appendUUID(dst, u []byte) []byte {
	const digits = "0123456789abcdef"
	for i, b := range u[:16] {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst = append(dst, '-')
		}
		dst = append(dst, digits[b>>4], digits[b&0x0f])
	}
	return dst
}
