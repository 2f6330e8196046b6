// Package retry decides whether one attempt of a keyed request is retried,
// and how long to wait before the next.
//
// A retry is only allowed because every attempt carries the same
// Idempotency-Key (RFC 9110 §9.2.2): the server replays the first answer.
// The decisions follow one table:
//
//	network error (dial, reset, EOF, attempt timeout)     Retry, same key
//	answer's status line or header cut short              Retry, same key
//	DNS resolver failure (timeout, SERVFAIL)              Retry, same key
//	409 Conflict (key still in flight on the server)      Retry, honour Retry-After up to a cap
//	408, 425, 429, 502, 503, 504                          Retry, honour Retry-After up to a cap
//	any of those seven replayed (Idempotent-Replayed)     Final: the server's saved outcome
//	422 Unprocessable (key reused, or request refused)    Stop: never retry
//	other 4xx, 2xx, 3xx, 500                              Final: return it
//	TLS alert internal_error (server)                     Retry, same key
//	context cancelled, TLS alert (server), other errors   Stop
//	an address no dial can reach (port above 65535)       Stop
//	a host name that does not exist (NXDOMAIN)            Stop
package retry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Decision is the verdict on one attempt.
type Decision int

const (
	// Final: the answer is the operation's outcome; return it.
	Final Decision = iota
	// Retry: send again with the same key.
	Retry
	// Stop: do not send again. For 422 the response is still returned;
	// for an error, the error is.
	Stop
)

func (d Decision) String() string {
	switch d {
	case Final:
		return "final"
	case Retry:
		return "retry"
	case Stop:
		return "stop"
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// Classify decides on one attempt's (resp, err), as http.RoundTripper
// returns them: resp is used when err is nil. Neither, which no
// RoundTripper returns, is Stop.
//
// A response with the header Idempotent-Replayed: true is the answer the
// server saved for the key (a handler's own 409, a 503 kept by a server
// that saves errors): every retry with the key would get it again, so it is
// Final whatever its status, but 422, which still stops.
//
// A 425 Too Early says that the server did not process the request, which
// reached it in TLS early data and might be a replay, and that the client
// may send it again once a handshake is complete (RFC 8470 §5.2): it is
// retried under the same key, as a 503 is. net/http sends no early data:
// a 425 comes through a proxy on the way that did.
//
// A server that says whether to retry, as Stripe's API does with the header
// Stripe-Should-Retry: true or false, is taken at its word before the
// status is looked at, as stripe-go does: a 500 it marks true is retried
// under the same key, a 409 or 503 it marks false is Final. It does not
// outrank a replay or a 422, nor a value other than those two, and an
// answer below 400 is not an error (stripe-go reads the header of errors
// only): a 200 marked true is Final. (idem.Transport returns a 401 or 407
// at once whatever it says: see NotApplied.)
//
// Errors are classified by type: context.Canceled stops; a net.Error
// (timeouts included, so an attempt's own deadline retries), io.EOF,
// io.ErrUnexpectedEOF, ECONNRESET, ECONNREFUSED, ECONNABORTED, EPIPE, an
// HTTP/2 stream reset (RST_STREAM), an HTTP/2 connection lost or closed
// under the request, a new HTTP/1.1 connection the server closed before
// the request was written to it, one the server ended with a GOAWAY
// (a shutdown past its deadline, or shedding load), and an answer whose
// status line or header does not parse, most often cut short by the
// connection's end once the request was written (a textproto.ProtocolError,
// "malformed MIME header", or http.ReadResponse's "malformed HTTP
// response", "status code" or "version") retry; any other error (a bad URL, a TLS certificate)
// stops, and so does a TLS alert from the server (a client certificate or
// a TLS version refused), although crypto/tls makes it a net.Error (but
// internal_error, the alert of a server that failed for a reason of its
// own, such as a certificate it could not load, which retries), and a
// *net.AddrError (a URL whose port is above 65535, which no dial can
// reach as written) or a host name that does not exist (a *net.DNSError
// IsNotFound, not Temporary), although net/http wraps them in a net.Error
// too; a resolver that failed (any other *net.DNSError: a timeout, a
// SERVFAIL) is retried as a network fault. The same holds on the way to
// an https proxy: net/http wraps what failed there
// in a *net.OpError "proxyconnect", a net.Error, which is judged by what it
// wraps (a proxy's certificate refused, or its alert, stops, but internal_error, as the server's; a proxy that
// refuses the connection is retried). A proxy that answers CONNECT with
// any status but 200, a 502 or 503 included, stops: net/http makes of it
// an errors.New of the proxy's reason phrase ("Bad Gateway", or whatever
// text the proxy sent), with neither a type nor the status, which no
// rule can tell from another error. http.Transport.OnProxyConnectResponse
// sees the status, and an error it returns is the attempt's: a net.Error
// of the program's own for a 502 or 503 is retried.
// net/http gives the lost HTTP/2 connection and the closed new
// connection no type, only a fixed text: those errors alone are matched by
// their whole message, and a status line that does not parse by the
// beginning of its own. The caller must check its own context first: a
// caller's expired deadline is a net.Error too.
func Classify(resp *http.Response, err error) Decision {
	if err != nil {
		return classifyError(err)
	}
	if resp == nil {
		return Stop
	}
	if resp.StatusCode >= 400 && resp.StatusCode != http.StatusUnprocessableEntity && !Replayed(resp) {
		switch strings.TrimSpace(resp.Header.Get("Stripe-Should-Retry")) {
		case "true":
			return Retry
		case "false":
			return Final
		}
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if Replayed(resp) {
			return Final
		}
		return Retry
	case http.StatusUnprocessableEntity:
		return Stop
	}
	return Final
}

// NotApplied reports whether a status says that the server did not apply
// the request because its credentials were refused (RFC 9110 §15.5.2:
// 401 "has not been applied"; 407, the same for a proxy). Classify calls
// it Final, as any other 4xx (Retry when Stripe-Should-Retry: true says
// so); the Transport returns it at once either way. The answer says
// nothing of an earlier attempt's outcome, so the Transport leaves the
// operation's state as it was (but for a call without a name refused at
// its only send: done, as no call can name it to resume it).
func NotApplied(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusProxyAuthRequired
}

// Replayed reports whether resp is an answer the server replayed from what
// it saved for the key: it carries Idempotent-Replayed: true (in any case,
// spaces around it ignored). A nil resp is no answer, and not replayed, as
// errors.Is(nil, target) is false.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get("Idempotent-Replayed")), "true")
}

func classifyError(err error) Decision {
	// *url.Error is itself a net.Error whatever it wraps, and so is the
	// *net.OpError "proxyconnect" in which net/http wraps whatever failed
	// on the way to a proxy (a refused certificate too): judge what they
	// wrap.
	for {
		var ue *url.Error
		var pe *net.OpError
		if errors.As(err, &ue) && ue.Err != nil {
			err = ue.Err
		} else if errors.As(err, &pe) && pe.Op == proxyConnect && pe.Err != nil {
			err = pe.Err
		} else {
			break
		}
	}
	if errors.Is(err, context.Canceled) {
		return Stop
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == tlsAlert {
		if isAlert(oe.Err, alertInternalError) {
			// The server failed for a reason of its own, not the
			// client's: a passing fault, as a 503 is. It processed
			// nothing of a handshake that failed.
			return Retry
		}
		// The server ended TLS with an alert: it refused the client's
		// certificate or version, and would refuse every retry alike.
		return Stop
	}
	var ae *net.AddrError
	if errors.As(err, &ae) {
		// An address that cannot be dialled as written: a URL's port above
		// 65535, which url.Parse accepts and the dial refuses before any
		// packet. net/http wraps it in the dial's *net.OpError, a net.Error,
		// but neither Timeout nor Temporary: every attempt fails alike.
		return Stop
	}
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound && !de.Temporary() {
		// The name has no address: it may come to have one (a record
		// being created, a negative answer cached), but not within the
		// seconds of one call's retries, which would ask again and get the
		// same answer. The standard library calls it not Temporary. The
		// operation stays pending, nothing sent, for a later call once
		// the name resolves. A resolver that failed (no answer in time,
		// SERVFAIL, another fault) is a network fault, retried below as a
		// net.Error.
		return Stop
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return Retry
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return Retry
	}
	var se http2StreamError
	if errors.As(err, &se) {
		return Retry
	}
	var pe textproto.ProtocolError
	if errors.As(err, &pe) {
		// A header line of the answer that does not parse: most often
		// one cut short by the connection's end, after the request was
		// written.
		return Retry
	}
	for _, errno := range []syscall.Errno{syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return Retry
		}
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		msg := e.Error()
		if _, ok := http2ConnErrors[msg]; ok || msg == serverClosedIdle || badStatusLine(msg) {
			return Retry
		}
		if http2GoAway(msg) {
			return Retry
		}
	}
	return Stop
}

// tlsAlert is the Op of the *net.OpError in which crypto/tls reports an
// alert the peer sent.
const tlsAlert = "remote error"

// alertInternalError is the TLS alert internal_error (80), which a server
// sends when it cannot go on for a reason "unrelated to the peer or the
// correctness of the protocol" (RFC 8446 §6.2): crypto/tls's server sends
// it when its GetConfigForClient fails, when its GetCertificate fails but
// for want of a certificate for the name, or when its source of
// randomness does.
const alertInternalError tls.AlertError = 80

// isAlert reports whether err, the Err of a "remote error", is the alert
// a. crypto/tls reports an alert the peer sent as a value of an unexported
// type of its own, which errors.As cannot take for an AlertError; its
// message is AlertError's, which crypto/tls writes from the same table.
// An AlertError, which crypto/tls wraps in the errors of a QUIC
// connection, is matched by type.
func isAlert(err error, a tls.AlertError) bool {
	var ae tls.AlertError
	if errors.As(err, &ae) {
		return ae == a
	}
	return err != nil && err.Error() == a.Error()
}

// proxyConnect is the Op of the *net.OpError in which net/http reports a
// failure to reach a proxy: to dial it, or to set up TLS with it.
const proxyConnect = "proxyconnect"

// serverClosedIdle is the message of the error, an errors.New of no type,
// that net/http's Transport fails a request with when the server closed
// the connection before the request was written to it (its reader saw
// the EOF first: a server at its connection limit, a balancer draining),
// or answered 408 on it unasked. net/http sends the request again itself
// on a reused connection only: on a new one the error is returned, and
// nothing was sent. The same close seen a moment later is an io.EOF.
const serverClosedIdle = "http: server closed idle connection"

// badStatusLine reports whether msg is the message of the error, of no
// type, that http.ReadResponse gives for a status line that does not
// parse: most often one cut short by the connection's end, after the
// request was written. net/http's Transport wraps it in a broken
// connection's error.
func badStatusLine(msg string) bool {
	for _, p := range []string{"malformed HTTP response ", "malformed HTTP status code ", "malformed HTTP version "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// http2ConnErrors are the messages of the errors that net/http's HTTP/2
// transport (and golang.org/x/net/http2's) fails a request with when its
// connection is lost or closed under it. Each is an errors.New of its own,
// unexported, with no type to match, so the whole message is compared: the
// same fault over HTTP/1.1 is a reset or an EOF, which retries.
var http2ConnErrors = map[string]struct{}{
	// A health check (HTTP2Config.SendPingTimeout) went unanswered.
	"http2: client connection lost": {},
	// The connection closed before its first request was written.
	"http2: client conn could not be established": {},
	// The connection closed while the request's body was being written.
	"http2: client conn is closed": {},
}

// http2GoAway reports whether msg is the message of an error that
// net/http's HTTP/2 transport fails a request with when the server ends
// the connection with a GOAWAY, which it does not send again itself, and
// that a new connection may not meet: a GOAWAY naming the stream as
// received, then the connection closed unanswered (http.Server's Shutdown
// past its deadline: a rolling deploy), whatever its code (on a shared
// connection, another stream's fault), and a GOAWAY with a code of a
// passing fault (NO_ERROR, INTERNAL_ERROR, REFUSED_STREAM, CANCEL,
// ENHANCE_YOUR_CALM: a server shedding load) on a new connection's first
// stream, where one that says the client is at fault (PROTOCOL_ERROR,
// HTTP_1_1_REQUIRED, INADEQUATE_SECURITY…) meets every new connection
// alike, as net/http reckons. Each error is of a type of
// its own, unexported, whose message holds the stream's and the code's
// figures; with the key, a retry is safe, as for the same fault over
// HTTP/1.1.
func http2GoAway(msg string) bool {
	if msg == "http2: Transport received Server's graceful shutdown GOAWAY" ||
		strings.HasPrefix(msg, "http2: server sent GOAWAY and closed the connection; ") {
		return true
	}
	code, ok := strings.CutPrefix(msg, "http2: Transport received GOAWAY from server ErrCode:")
	if !ok {
		return false
	}
	switch code {
	case "NO_ERROR", "INTERNAL_ERROR", "REFUSED_STREAM", "CANCEL", "ENHANCE_YOUR_CALM":
		return true
	}
	return false
}

// http2StreamError has the fields of net/http's (unexported) HTTP/2
// stream error, and of golang.org/x/net/http2.StreamError: net/http's
// gives itself an As method that fills any struct of this shape. It is
// the error of a stream the server (or the connection) reset, which an
// HTTP/1.1 request meets as a closed connection.
type http2StreamError struct {
	StreamID uint32
	Code     uint32
	Cause    error
}

func (e http2StreamError) Error() string {
	return fmt.Sprintf("http2 stream %d reset with code %d", e.StreamID, e.Code)
}

// ParseRetryAfter parses a Retry-After value, in delay-seconds or
// HTTP-date form, relative to now. It reports false for an empty, negative
// or malformed value: delay-seconds are digits alone, so a value with
// anything after its digits is malformed, however many digits it has. A
// date in the past is a zero wait; a wait longer than the largest
// time.Duration is the largest.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		// Every byte a digit: ParseUint reports a range error as soon as
		// the digits overflow, before it looks at what follows them.
		if strings.TrimLeft(v, "0123456789") != "" {
			return 0, false
		}
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return maxWait, true
			}
			return 0, false
		}
		if secs > uint64(maxWait/time.Second) {
			return maxWait, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// maxWait is the longest parsed Retry-After, the largest time.Duration
// (about 292 years, far beyond any horizon): a longer one saturates
// rather than wraps. Adding to it overflows.
const maxWait = time.Duration(1<<63 - 1)

// RetryAfter returns the wait that resp's Retry-After header asks for, as
// ParseRetryAfter reads it. An HTTP-date is measured from resp's Date
// header when it has a valid one: both are times of the server's clock,
// and their difference is the wait it meant, however far now (the local
// clock) is from that clock. Without a valid Date, it is measured from
// now. A nil resp asks for none: 0, false.
func RetryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	v := resp.Header.Get("Retry-After")
	if v = strings.TrimSpace(v); v != "" && (v[0] < '0' || v[0] > '9') {
		// Not delay-seconds: an HTTP-date, or malformed.
		if date, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			now = date
		}
	}
	return ParseRetryAfter(v, now)
}

// Policy is how one logical operation is retried. The zero value is the
// default written beside each field. A negative duration or count, and a
// negative or NaN Multiplier, is treated as its default; a Multiplier
// between 0 and 1 as 1.
type Policy struct {
	// MaxAttempts is the number of attempts one call may send, the first
	// included. Zero means 5.
	MaxAttempts int
	// InitialInterval is the backoff before the first retry. Zero means
	// 200 ms.
	InitialInterval time.Duration
	// MaxInterval caps one backoff interval. Zero means 10 s.
	MaxInterval time.Duration
	// Multiplier grows the interval after each retry. Zero means 2; one
	// between 0 and 1 means 1: every interval is InitialInterval, never
	// less. Below 1 the interval would shrink towards zero, and a call
	// with a large MaxAttempts would send its attempts to a failing
	// server without waiting (10 000 in milliseconds, stopped by the
	// Budget alone). github.com/cenkalti/backoff's ExponentialBackOff,
	// which Schedule uses, shrinks it so; Java's Spring refuses a
	// multiplier below 1, but a Policy has no constructor to return an
	// error from.
	Multiplier float64
	// NoJitter disables full jitter. With jitter (the default) each wait
	// is drawn uniformly from [0, interval), so that clients that failed
	// together do not retry together.
	NoJitter bool
	// MaxRetryAfter caps how long one call honours a server's Retry-After.
	// A longer Retry-After is not slept through: the call stops and the
	// operation records when it may be sent again. Zero means 30 s.
	MaxRetryAfter time.Duration
	// MaxElapsed is the per-call budget: a call never starts a wait that
	// would end after it. It is the MaxElapsedTime of the backoff, set on
	// purpose (backoff's own default is 15 minutes). Zero means 1 minute.
	MaxElapsed time.Duration
	// AttemptTimeout bounds one attempt, from sending to the response
	// headers; a timed-out attempt is a network error and is retried. Zero
	// means no per-attempt limit (the caller's context still applies).
	AttemptTimeout time.Duration
	// Horizon is how long after its first send an operation may still be
	// retried. Past it, the SDK stops in favour of reconciliation; a call
	// whose next wait would end past it stops before that wait. It must
	// stay below the server's key retention (Stripe keeps keys ≥ 24 h).
	// Zero means 24 h.
	Horizon time.Duration
}

// Defaults returns p with every zero or negative field (and a NaN
// Multiplier) set to its default, and a Multiplier between 0 and 1 set
// to 1.
func (p Policy) Defaults() Policy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = 200 * time.Millisecond
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = 10 * time.Second
	}
	if !(p.Multiplier > 0) { // NaN too
		p.Multiplier = 2
	} else if p.Multiplier < 1 {
		// The interval would shrink towards zero.
		p.Multiplier = 1
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = 30 * time.Second
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = time.Minute
	}
	if p.AttemptTimeout < 0 {
		p.AttemptTimeout = 0
	}
	if p.Horizon <= 0 {
		p.Horizon = 24 * time.Hour
	}
	return p
}

// Expired reports whether an operation first sent at created is past the
// horizon at now, or first sent, by this clock, more than ClockAhead after
// now: a time written by a clock that ran ahead (of another host, or of
// this one before it was set back), which says nothing of the operation's
// age; a server may have forgotten its key.
func (p Policy) Expired(created, now time.Time) bool {
	return now.Sub(created) > p.Defaults().Horizon || created.Sub(now) > ClockAhead
}

// ClockAhead is how far in the future a first-send time may be before
// Policy.Expired takes the operation for expired: the hour that the
// reference server's retention (25 h) leaves above the default horizon
// for clocks that disagree.
const ClockAhead = time.Hour

// Schedule is the retry schedule of one call. It is not safe for
// concurrent use: make one per call with Policy.Schedule (or Reset).
type Schedule struct {
	p    Policy
	b    backoff.ExponentialBackOff // by value: one allocation per call
	rand func() float64
}

// Schedule starts the schedule of one call at the current time.
func (p Policy) Schedule() *Schedule {
	s := new(Schedule)
	s.Reset(p)
	return s
}

// Reset starts s anew as the schedule of one call under p at the current
// time, as Policy.Schedule makes one: for a Schedule kept by value in a
// struct of the caller's, which spares an allocation per call.
func (s *Schedule) Reset(p Policy) {
	p = p.Defaults()
	*s = Schedule{p: p, rand: rand.Float64, b: backoff.ExponentialBackOff{
		// backoff caps an interval only when it grows: cap the first here.
		InitialInterval:     min(p.InitialInterval, p.MaxInterval),
		RandomizationFactor: 0, // full jitter is applied below
		Multiplier:          p.Multiplier,
		MaxInterval:         p.MaxInterval,
		MaxElapsedTime:      p.MaxElapsed,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}}
	s.b.Reset()
}

// Elapsed returns the time since the schedule started.
func (s *Schedule) Elapsed() time.Duration { return s.b.GetElapsedTime() }

// Next returns the wait before the next attempt, after an attempt that
// Classify judged Retry. retryAfter is the server's Retry-After, when it
// sent one (ok). Next reports false when the call's budget does not allow
// another attempt: the wait, or the backoff interval before its jitter is
// drawn, would end after MaxElapsed. It reports deferred when the server
// asked for a longer wait than MaxRetryAfter: the caller then records the
// time and stops rather than sleep, whatever is left of the budget. Next
// does not count attempts: its caller holds them to MaxAttempts, as
// idem.Transport does.
func (s *Schedule) Next(retryAfter time.Duration, ok bool) (wait time.Duration, more, deferred bool) {
	if ok && retryAfter > s.p.MaxRetryAfter {
		return retryAfter, false, true
	}
	interval := s.b.NextBackOff()
	if interval == backoff.Stop {
		return 0, false, false
	}
	wait = interval
	if !s.p.NoJitter {
		wait = time.Duration(s.rand() * float64(interval))
	}
	if ok {
		wait = max(wait, retryAfter)
	}
	if wait > s.p.MaxElapsed-s.Elapsed() { // a sum could overflow
		return wait, false, false
	}
	return wait, true, false
}

// Sleep waits for d or until ctx is done, whichever is first, and returns
// ctx's error in the second case. A d of zero or less waits for nothing:
// Sleep returns ctx's error, nil when ctx is not done.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return CtxErr(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return CtxErr(ctx)
	}
}

// CtxErr returns ctx's error, joined with its cause when the cause differs,
// so that errors.Is matches both context.Canceled (or DeadlineExceeded) and
// the cause. It returns nil while ctx is not done.
func CtxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
