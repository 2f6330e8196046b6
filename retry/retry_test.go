package retry_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/retry"
)

func resp(code int) *http.Response { return &http.Response{StatusCode: code, Header: http.Header{}} }

func replayed(code int) *http.Response {
	r := resp(code)
	r.Header.Set("Idempotent-Replayed", "true")
	return r
}

// shouldRetry is an answer that says whether to retry, as Stripe's API does.
func shouldRetry(code int, v string) *http.Response {
	r := resp(code)
	r.Header.Set("Stripe-Should-Retry", v)
	return r
}

func TestClassify(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		name string
		resp *http.Response
		err  error
		want retry.Decision
	}{
		{"no response, no error", nil, nil, retry.Stop},
		{"200", resp(200), nil, retry.Final},
		{"201", resp(201), nil, retry.Final},
		{"302", resp(302), nil, retry.Final},
		{"400", resp(400), nil, retry.Final},
		{"404", resp(404), nil, retry.Final},
		{"408", resp(408), nil, retry.Retry},
		{"408 replayed", replayed(408), nil, retry.Final},
		{"409", resp(409), nil, retry.Retry},
		{"422", resp(422), nil, retry.Stop},
		{"425", resp(425), nil, retry.Retry},
		{"425 replayed", replayed(425), nil, retry.Final},
		{"425 Stripe-Should-Retry: false", shouldRetry(425, "false"), nil, retry.Final},
		{"429", resp(429), nil, retry.Retry},
		{"500", resp(500), nil, retry.Final},
		{"502", resp(502), nil, retry.Retry},
		{"503", resp(503), nil, retry.Retry},
		{"504", resp(504), nil, retry.Retry},
		{"409 replayed", replayed(409), nil, retry.Final},
		{"429 replayed", replayed(429), nil, retry.Final},
		{"503 replayed", replayed(503), nil, retry.Final},
		{"422 replayed", replayed(422), nil, retry.Stop},
		{"201 replayed", replayed(201), nil, retry.Final},
		{"nil response", nil, nil, retry.Stop},
		{"500 Stripe-Should-Retry: true", shouldRetry(500, "true"), nil, retry.Retry},
		{"409 Stripe-Should-Retry: false", shouldRetry(409, "false"), nil, retry.Final},
		{"503 Stripe-Should-Retry: false", shouldRetry(503, " false "), nil, retry.Final},
		{"503 Stripe-Should-Retry: maybe", shouldRetry(503, "maybe"), nil, retry.Retry},
		{"422 Stripe-Should-Retry: true", shouldRetry(422, "true"), nil, retry.Stop},
		{"200 Stripe-Should-Retry: true", shouldRetry(200, "true"), nil, retry.Final},
		{"303 Stripe-Should-Retry: true", shouldRetry(303, "true"), nil, retry.Final},
		{"500 replayed, Stripe-Should-Retry: true", func() *http.Response {
			r := replayed(500)
			r.Header.Set("Stripe-Should-Retry", "true")
			return r
		}(), nil, retry.Final},
		{"io.EOF", nil, io.EOF, retry.Retry},
		{"unexpected EOF wrapped", nil, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), retry.Retry},
		{"*net.OpError", nil, opErr, retry.Retry},
		{"url.Error around OpError", nil, &url.Error{Op: "Post", URL: "http://x", Err: opErr}, retry.Retry},
		{"ECONNRESET", nil, fmt.Errorf("write: %w", syscall.ECONNRESET), retry.Retry},
		{"attempt deadline", nil, context.DeadlineExceeded, retry.Retry},
		{"cancelled ctx", nil, cancelled.Err(), retry.Stop},
		{"cancelled ctx wrapped", nil, &url.Error{Op: "Post", URL: "http://x", Err: context.Canceled}, retry.Stop},
		{"dial cancelled", nil, &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: context.Canceled}}, retry.Stop},
		{"url.Error around a non-network error", nil, &url.Error{Op: "Post", URL: "http://x", Err: errors.New("x509: bad certificate")}, retry.Stop},
		{"other error", nil, errors.New("x509: certificate signed by unknown authority"), retry.Stop},
		{"error with 'connection reset' text only", nil, errors.New("connection reset by peer"), retry.Stop},
		{"invalid port", nil, &url.Error{Op: "Post", URL: "http://127.0.0.1:99999/x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "invalid port", Addr: "99999"}}}, retry.Stop},
		// A name that does not exist stops; a resolver that failed is retried.
		{"unknown host", nil, &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}}}, retry.Stop},
		{"resolver timeout", nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "x", IsTimeout: true}}, retry.Retry},
		{"resolver failure", nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}}, retry.Retry},
		{"unknown host, resolver failure", nil, &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true, IsTemporary: true}, retry.Retry},
		{"TLS alert from the server", nil, &url.Error{Op: "Post", URL: "https://x", Err: &net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}}, retry.Stop},
		{"TLS alert internal_error from the server", nil, &url.Error{Op: "Post", URL: "https://x", Err: &net.OpError{Op: "remote error", Err: tls.AlertError(80)}}, retry.Retry},
		{"TLS alert internal_error, by its text", nil, &net.OpError{Op: "remote error", Err: errors.New("tls: internal error")}, retry.Retry},
		{"TLS alert handshake_failure from the server", nil, &net.OpError{Op: "remote error", Err: tls.AlertError(40)}, retry.Stop},
		// net/http's HTTP/2 connection errors, untyped: matched by their whole text.
		{"HTTP/2 connection lost", nil, &url.Error{Op: "Post", URL: "https://x", Err: errors.New("http2: client connection lost")}, retry.Retry},
		{"HTTP/2 connection closed before its first request", nil, errors.New("http2: client conn could not be established"), retry.Retry},
		{"new connection closed before the request was written", nil, &url.Error{Op: "Post", URL: "http://x", Err: errors.New("http: server closed idle connection")}, retry.Retry},
		{"HTTP/2 connection closed under the body", nil, fmt.Errorf("send: %w", errors.New("http2: client conn is closed")), retry.Retry},
		{"HTTP/2 GOAWAY, then the connection closed", nil, errors.New(`http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, debug=""`), retry.Retry},
		{"HTTP/2 GOAWAY with an error code", nil, &url.Error{Op: "Post", URL: "https://x", Err: errors.New("http2: Transport received GOAWAY from server ErrCode:ENHANCE_YOUR_CALM")}, retry.Retry},
		{"HTTP/2 GOAWAY: HTTP/1.1 required", nil, errors.New("http2: Transport received GOAWAY from server ErrCode:HTTP_1_1_REQUIRED"), retry.Stop},
		{"HTTP/2 GOAWAY, a protocol error, then the connection closed", nil, errors.New(`http2: server sent GOAWAY and closed the connection; LastStreamID=41, ErrCode=PROTOCOL_ERROR, debug=""`), retry.Retry},
		{"HTTP/2 GOAWAY, an internal error, then the connection closed", nil, errors.New(`http2: server sent GOAWAY and closed the connection; LastStreamID=3, ErrCode=INTERNAL_ERROR, debug="x"`), retry.Retry},
		{"HTTP/2 connection text inside another message", nil, errors.New("proxy said: http2: client connection lost"), retry.Stop},
		{"HTTP/2 connection closed by the program", nil, errors.New("http2: client connection force closed via ClientConn.Close"), retry.Stop},
	}
	for _, tt := range tests {
		if got := retry.Classify(tt.resp, tt.err); got != tt.want {
			t.Errorf("%s: got %v; want %v", tt.name, got, tt.want)
		}
	}
}

func TestExpiredHorizon(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var p retry.Policy
	for _, tt := range []struct {
		after time.Duration
		want  bool
	}{
		{0, false},
		{23*time.Hour + 59*time.Minute, false},
		{24 * time.Hour, false},
		{24*time.Hour + time.Minute, true},
	} {
		if got := p.Expired(created, created.Add(tt.after)); got != tt.want {
			t.Errorf("Expired after %v: got %v; want %v", tt.after, got, tt.want)
		}
	}
	short := retry.Policy{Horizon: time.Hour}
	if !short.Expired(created, created.Add(61*time.Minute)) {
		t.Errorf("Horizon 1h, 61m later: got not expired; want expired")
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 12 ", 12 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"abc", 0, false},
		{"99999999999999999999999", time.Duration(1<<63 - 1), true},
		{"9999999999999", time.Duration(1<<63 - 1), true}, // a uint64, but longer than a Duration
		// Malformed however long its digits run before the fault.
		{"99999999999999999999999x", 0, false},
		{"99999999999999999999, 5", 0, false},
		{"18446744073709551616.5", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Sun, 06 Nov 1994 08:49:37 GMT", 0, true},
		{"Sunday, 06-Nov-94 08:49:37 GMT", 0, true},
		{"Mon, 30 Nov 2026 12:00:05 +0000", 0, false},
	}
	for _, tt := range tests {
		got, ok := retry.ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
	if got, ok := retry.RetryAfter(nil, now); got != 0 || ok {
		t.Errorf("RetryAfter(nil) = %v, %v; want 0, false", got, ok)
	}
}

// TestRetryAfterMeasuredFromDate: an HTTP-date Retry-After is measured
// from the answer's Date, the server's clock, not from the local clock,
// when the answer has a valid Date; the wait is clamped as
// ParseRetryAfter clamps it.
func TestRetryAfterMeasuredFromDate(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	date := func(t time.Time) string { return t.Format(http.TimeFormat) }
	tests := []struct {
		name       string
		retryAfter string
		date       string
		want       time.Duration
		wantOK     bool
	}{
		{"server's clock 2h ahead", date(now.Add(2*time.Hour + 90*time.Second)), date(now.Add(2 * time.Hour)), 90 * time.Second, true},
		{"server's clock 2h behind", date(now.Add(-2*time.Hour + 90*time.Second)), date(now.Add(-2 * time.Hour)), 90 * time.Second, true},
		{"clocks agree", date(now.Add(90 * time.Second)), date(now), 90 * time.Second, true},
		{"RFC 850 date", now.Add(-time.Hour + 30*time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT"), date(now.Add(-time.Hour)), 30 * time.Second, true},
		{"before its Date", date(now.Add(time.Hour - time.Minute)), date(now.Add(time.Hour)), 0, true},
		{"no Date", date(now.Add(90 * time.Second)), "", 90 * time.Second, true},
		{"malformed Date", date(now.Add(90 * time.Second)), "yesterday", 90 * time.Second, true},
		{"Date with a numeric zone", date(now.Add(90 * time.Second)), "Mon, 30 Nov 2026 10:00:00 +0000", 90 * time.Second, true},
		{"delay-seconds, Date ignored", "7", date(now.Add(time.Hour)), 7 * time.Second, true},
		{"malformed Retry-After", "soon", date(now.Add(time.Hour)), 0, false},
		{"beyond the largest Duration", "Fri, 31 Dec 9999 23:59:59 GMT", date(now.Add(-time.Hour)), time.Duration(1<<63 - 1), true},
	}
	for _, tt := range tests {
		r := resp(503)
		r.Header.Set("Retry-After", tt.retryAfter)
		if tt.date != "" {
			r.Header.Set("Date", tt.date)
		}
		if got, ok := retry.RetryAfter(r, now); got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: RetryAfter(Retry-After %q, Date %q) = %v, %v; want %v, %v", tt.name, tt.retryAfter, tt.date, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestDefaults(t *testing.T) {
	p := retry.Policy{}.Defaults()
	if p.MaxAttempts != 5 || p.InitialInterval != 200*time.Millisecond || p.MaxInterval != 10*time.Second ||
		p.Multiplier != 2 || p.MaxRetryAfter != 30*time.Second || p.MaxElapsed != time.Minute || p.Horizon != 24*time.Hour {
		t.Fatalf("zero Policy defaults: got %+v", p)
	}
	if q := (retry.Policy{MaxAttempts: 2, Horizon: time.Hour}).Defaults(); q.MaxAttempts != 2 || q.Horizon != time.Hour {
		t.Fatalf("set fields changed: got %+v", q)
	}
	// A negative duration, count or Multiplier is its default.
	negative := retry.Policy{MaxAttempts: -1, InitialInterval: -1, MaxInterval: -1, Multiplier: -1,
		MaxRetryAfter: -1, MaxElapsed: -1, AttemptTimeout: -1, Horizon: -1}
	if q := negative.Defaults(); q != p {
		t.Fatalf("negative fields: got %+v; want the defaults %+v", q, p)
	}
}

func TestScheduleExponentialWithoutJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := retry.Policy{InitialInterval: time.Second, MaxInterval: 4 * time.Second, NoJitter: true, MaxElapsed: time.Hour}.Schedule()
		for i, want := range []time.Duration{1, 2, 4, 4} {
			wait, more, deferred := s.Next(0, false)
			if !more || deferred || wait != want*time.Second {
				t.Fatalf("retry %d: got %v, more=%v, deferred=%v; want %v, true, false", i, wait, more, deferred, want*time.Second)
			}
			time.Sleep(wait) // fake time inside the bubble
		}
	})
}

// TestScheduleReset: a Schedule kept by value and Reset starts anew, under
// the new policy with its defaults: its budget from the time of Reset, its
// intervals from the first.
func TestScheduleReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s retry.Schedule
		s.Reset(retry.Policy{InitialInterval: time.Second, MaxInterval: 8 * time.Second, NoJitter: true, MaxElapsed: 5 * time.Second})
		for range 2 {
			wait, _, _ := s.Next(0, false)
			time.Sleep(wait)
		}
		if _, more, _ := s.Next(0, false); more {
			t.Fatalf("after %v of a 5s budget: got more; want budget spent", s.Elapsed())
		}
		s.Reset(retry.Policy{InitialInterval: 2 * time.Second, NoJitter: true})
		if e := s.Elapsed(); e != 0 {
			t.Fatalf("after Reset: elapsed %v; want 0", e)
		}
		for i, want := range []time.Duration{2, 4, 8, 10} { // MaxInterval's default, 10 s
			wait, more, _ := s.Next(0, false)
			if !more || wait != want*time.Second {
				t.Fatalf("retry %d after Reset: got %v, more=%v; want %v, true (MaxElapsed's default, a minute)", i, wait, more, want*time.Second)
			}
			time.Sleep(wait)
		}
	})
}

func TestScheduleFullJitterBounded(t *testing.T) {
	s := retry.Policy{InitialInterval: time.Second, MaxInterval: time.Second}.Schedule()
	seen := map[time.Duration]bool{}
	for range 50 {
		wait, more, _ := s.Next(0, false)
		if !more || wait < 0 || wait >= time.Second {
			t.Fatalf("got %v, more=%v; want in [0, 1s)", wait, more)
		}
		seen[wait] = true
	}
	if len(seen) < 10 {
		t.Fatalf("got %d distinct waits in 50; want jitter", len(seen))
	}
}

func TestScheduleBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := retry.Policy{InitialInterval: 10 * time.Second, MaxInterval: 10 * time.Second, NoJitter: true, MaxElapsed: 25 * time.Second}.Schedule()
		for i := range 2 {
			wait, more, _ := s.Next(0, false)
			if !more {
				t.Fatalf("retry %d: got budget spent after %v; want more", i, s.Elapsed())
			}
			time.Sleep(wait)
		}
		if _, more, _ := s.Next(0, false); more {
			t.Fatalf("after %v of a 25s budget: got more; want budget spent", s.Elapsed())
		}
	})
}

func TestScheduleRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := retry.Policy{InitialInterval: time.Millisecond, NoJitter: true, MaxRetryAfter: 30 * time.Second, MaxElapsed: time.Minute}
		s := p.Schedule()
		if wait, more, deferred := s.Next(7*time.Second, true); wait != 7*time.Second || !more || deferred {
			t.Fatalf("Retry-After 7s: got %v, %v, %v; want 7s, true, false", wait, more, deferred)
		}
		if wait, more, deferred := s.Next(time.Hour, true); wait != time.Hour || more || !deferred {
			t.Fatalf("Retry-After 1h over a 30s cap: got %v, %v, %v; want 1h, false, true", wait, more, deferred)
		}
		s = p.Schedule()
		time.Sleep(50 * time.Second)
		// A wait that ends with the budget does not end after it.
		if wait, more, deferred := s.Next(10*time.Second, true); wait != 10*time.Second || !more || deferred {
			t.Fatalf("Retry-After 10s with 10s of budget left: got %v, %v, %v; want 10s, true, false", wait, more, deferred)
		}
		if _, more, deferred := s.Next(20*time.Second, true); more || deferred {
			t.Fatalf("Retry-After 20s with 10s of budget left: got more=%v deferred=%v; want budget spent", more, deferred)
		}
		// Past the budget, a Retry-After over the cap is still deferred: the
		// operation must record it.
		time.Sleep(20 * time.Second)
		if wait, more, deferred := s.Next(time.Hour, true); wait != time.Hour || more || !deferred {
			t.Fatalf("Retry-After 1h with the budget spent: got %v, %v, %v; want 1h, false, true", wait, more, deferred)
		}
	})
}

func TestSleepEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("shutting down")
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() {
			time.Sleep(time.Second)
			cancel(cause)
		}()
		start := time.Now()
		err := retry.Sleep(ctx, time.Hour)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
			t.Fatalf("got %v; want context.Canceled and the cause", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("slept %v; want 1s (until cancel)", d)
		}
		if err := retry.Sleep(context.Background(), 5*time.Second); err != nil {
			t.Fatalf("uncancelled: got %v; want nil", err)
		}
		// Zero or less waits for nothing, and says whether ctx is done.
		start = time.Now()
		for _, d := range []time.Duration{0, -time.Second} {
			if err := retry.Sleep(context.Background(), d); err != nil {
				t.Errorf("Sleep(%v), uncancelled: got %v; want nil", d, err)
			}
			if err := retry.Sleep(ctx, d); !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
				t.Errorf("Sleep(%v), cancelled: got %v; want context.Canceled and the cause", d, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Sleep of zero or less took %v; want none", d)
		}
	})
}

// MaxInterval caps every interval, the first included: an InitialInterval
// above it starts at the cap.
func TestScheduleInitialIntervalCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := retry.Policy{InitialInterval: time.Minute, NoJitter: true, MaxElapsed: time.Hour}.Schedule()
		for i := range 3 {
			wait, more, _ := s.Next(0, false)
			if !more || wait != 10*time.Second {
				t.Fatalf("retry %d with InitialInterval 1m over the 10s MaxInterval: got %v, more=%v; want 10s, true", i, wait, more)
			}
			time.Sleep(wait)
		}
	})
}

// A Multiplier that is not a number is not a positive one: it means the
// default, never an interval that is not a duration.
func TestScheduleMultiplierNaN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := retry.Policy{InitialInterval: time.Second, Multiplier: math.NaN(), NoJitter: true, MaxElapsed: time.Hour}
		if m := p.Defaults().Multiplier; m != 2 {
			t.Fatalf("Defaults of a NaN Multiplier: got %v; want 2", m)
		}
		s := p.Schedule()
		for i, want := range []time.Duration{1, 2, 4} {
			wait, more, _ := s.Next(0, false)
			if !more || wait != want*time.Second {
				t.Fatalf("retry %d with a NaN Multiplier: got %v, more=%v; want %v, true", i, wait, more, want*time.Second)
			}
			time.Sleep(wait)
		}
	})
}

// A Multiplier between 0 and 1 would shrink the interval towards zero: a
// call with many attempts would send them to a failing server without
// waiting (10 000 in 2 ms). It is 1: every interval is InitialInterval,
// never less, as Spring's ExponentialBackOff, which refuses a multiplier
// below 1, has it.
func TestScheduleMultiplierBelowOne(t *testing.T) {
	for _, m := range []float64{0.5, 0.999, math.SmallestNonzeroFloat64} {
		synctest.Test(t, func(t *testing.T) {
			p := retry.Policy{InitialInterval: 10 * time.Millisecond, Multiplier: m, NoJitter: true, MaxElapsed: time.Hour, MaxAttempts: 10000}
			if got := p.Defaults().Multiplier; got != 1 {
				t.Errorf("Defaults of Multiplier %v: got %v; want 1", m, got)
			}
			s := p.Schedule()
			for i := range 100 {
				wait, more, _ := s.Next(0, false)
				if !more || wait != p.InitialInterval {
					t.Fatalf("retry %d with Multiplier %v: got %v, more=%v; want %v, true", i, m, wait, more, p.InitialInterval)
				}
				time.Sleep(wait)
			}
		})
	}
}

// A Retry-After near the largest duration, honoured because MaxRetryAfter
// is as large, still does not fit in the call's budget.
func TestScheduleHugeRetryAfterKeepsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const huge = time.Duration(1<<63 - 1)
		s := retry.Policy{MaxRetryAfter: huge, MaxElapsed: time.Minute}.Schedule()
		time.Sleep(time.Second)
		for _, v := range []string{"99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"} {
			ra, ok := retry.ParseRetryAfter(v, time.Now())
			if wait, more, deferred := s.Next(ra, ok); more || deferred {
				t.Fatalf("Retry-After %q 1s into a 1m budget: got %v, more=%v, deferred=%v; want budget spent", v, wait, more, deferred)
			}
		}
	})
}

// TestClassifyHTTP2StreamReset: a server that resets an HTTP/2 stream
// (RST_STREAM, here INTERNAL_ERROR after its handler aborted) fails the
// attempt as a connection closed under an HTTP/1.1 request does: it is
// retried. net/http's error for it is of an unexported type, matched by
// errors.As through the As method net/http gives it.
func TestClassifyHTTP2StreamReset(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s; want a stream error", resp.Status)
	}
	if got := retry.Classify(nil, err); got != retry.Retry {
		t.Errorf("Classify(%v) = %v; want %v", err, got, retry.Retry)
	}
}

// TestClassifyTLSInternalError: a server that fails its side of the
// handshake for a reason of its own (here its GetConfigForClient; a
// GetCertificate that cannot load a certificate is another) sends the
// alert internal_error, which crypto/tls reports as a "remote error" of an
// unexported type: a passing fault, retried; the handshake failed, so the
// request was not processed.
func TestClassifyTLSInternalError(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return nil, errors.New("certificate store unavailable")
	}}
	srv.StartTLS()
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s; want the server's alert", resp.Status)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "remote error" {
		t.Fatalf("got %v; want a *net.OpError \"remote error\"", err)
	}
	if got := retry.Classify(nil, err); got != retry.Retry {
		t.Errorf("Classify(%v) = %v; want %v", err, got, retry.Retry)
	}
}

// TestClassifyProxyConnect: net/http wraps whatever fails on the way to a
// proxy in a *net.OpError "proxyconnect", itself a net.Error. It is judged
// by what it wraps, as a *url.Error is: a proxy's certificate the client
// refuses, or the proxy's TLS alert refusing the client's, stops as the same
// failure with the server does; a proxy that refuses the connection is
// retried.
func TestClassifyProxyConnect(t *testing.T) {
	quiet := log.New(io.Discard, "", 0) // the proxies' handshake errors
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.Config.ErrorLog = quiet
	untrusted.StartTLS()
	defer untrusted.Close()
	demanding := httptest.NewUnstartedServer(http.NotFoundHandler())
	demanding.Config.ErrorLog = quiet
	demanding.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MaxVersion: tls.VersionTLS12}
	demanding.StartTLS()
	defer demanding.Close()
	for _, tt := range []struct {
		name  string
		proxy string
		roots *x509.CertPool
		want  retry.Decision
	}{
		{"proxy certificate refused", untrusted.URL, nil, retry.Stop},
		{"proxy refuses the client certificate", demanding.URL, demanding.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, retry.Stop},
		{"proxy refuses the connection", "https://" + refusetest.Addr(t), nil, retry.Retry},
	} {
		proxy, err := url.Parse(tt.proxy)
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: tt.roots}}
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodPost, "https://api.example.test/v1/charges", strings.NewReader(`{}`)))
		tr.CloseIdleConnections()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: got %s; want an error", tt.name, resp.Status)
		}
		if got := retry.Classify(nil, err); got != tt.want {
			t.Errorf("%s: Classify(%v) = %v; want %v", tt.name, err, got, tt.want)
		}
	}
}

// TestClassifyUnsendableURL: a URL that url.Parse accepts but no connection
// can be made to as written (a port above 65535) fails each attempt alike,
// at once, with nothing sent: net/http reports it as the dial's
// *net.OpError around a *net.AddrError, a net.Error, which is not taken
// for a network fault.
func TestClassifyUnsendableURL(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:99999/x", "https://127.0.0.1:65536/x"} {
		resp, err := (&http.Transport{}).RoundTrip(httptest.NewRequest(http.MethodPost, u, strings.NewReader(`{}`)))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: got %s; want an error", u, resp.Status)
		}
		var ae *net.AddrError
		if !errors.As(err, &ae) {
			t.Fatalf("%s: got %T %v; want a *net.AddrError", u, err, err)
		}
		if got := retry.Classify(nil, err); got != retry.Stop {
			t.Errorf("%s: Classify(%v) = %v; want %v", u, err, got, retry.Stop)
		}
	}
}

// fakeDNS is a DNS server on 127.0.0.1 that answers every query with
// rcode and no record, and a resolver that asks it alone.
func fakeDNS(t *testing.T, rcode byte) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for range 1000 { // until the test closes it
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			// The query, its question kept, made an answer: QR and RA set,
			// RD kept, the rcode; no answer, authority or additional record.
			ans := append([]byte(nil), buf[:n]...)
			ans[2] = 0x80 | ans[2]&0x01
			ans[3] = 0x80 | rcode
			clear(ans[6:12])
			if end := questionEnd(ans); end > 0 {
				pc.WriteTo(ans[:end], from)
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// questionEnd returns the end of a DNS message's one question, or 0.
func questionEnd(m []byte) int {
	i := 12
	for i < len(m) && m[i] != 0 { // the name's labels, uncompressed in a query
		i += 1 + int(m[i])
	}
	if i+5 > len(m) {
		return 0
	}
	return i + 5 // the root label, QTYPE, QCLASS
}

// TestClassifyDNS: a host name that does not exist (NXDOMAIN) stops, as a
// URL that cannot be sent as written does; a resolver that fails
// (SERVFAIL) is retried, as any network fault. The resolver is a server on
// 127.0.0.1 that gives the answer each case needs.
func TestClassifyDNS(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rcode byte
		want  retry.Decision
	}{
		{"NXDOMAIN", 3, retry.Stop},
		{"SERVFAIL", 2, retry.Retry},
	} {
		tr := &http.Transport{DialContext: (&net.Dialer{Resolver: fakeDNS(t, tt.rcode)}).DialContext}
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodPost, "http://api.idem.example/v1/charges", strings.NewReader(`{}`)))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: got %s; want an error", tt.name, resp.Status)
		}
		// The answer is the kind the case is about: not found and not
		// temporary, or the other way round.
		var de *net.DNSError
		if !errors.As(err, &de) || de.IsNotFound == de.Temporary() || de.IsNotFound != (tt.want == retry.Stop) {
			t.Fatalf("%s: got %T %v; want a *net.DNSError, not found %v", tt.name, err, err, tt.want == retry.Stop)
		}
		if got := retry.Classify(nil, err); got != tt.want {
			t.Errorf("%s: Classify(%v) = %v; want %v", tt.name, err, got, tt.want)
		}
	}
}

// proxyRefusal is a net.Error of a program's own, returned by
// http.Transport.OnProxyConnectResponse for a proxy's 502 or 503.
type proxyRefusal struct{ status string }

func (e proxyRefusal) Error() string   { return "proxy refused CONNECT: " + e.status }
func (e proxyRefusal) Timeout() bool   { return false }
func (e proxyRefusal) Temporary() bool { return true }

// TestClassifyProxyRefusesConnect: a proxy that answers CONNECT with 502 or
// 503 fails the attempt with the error net/http makes of it, errors.New of
// the proxy's reason phrase ("Bad Gateway", or whatever text it sent;
// "unknown status code" for none), with no type and no status code: it
// cannot be told from any other error, and stops. An error that
// OnProxyConnectResponse returns for it instead is what the attempt fails
// with: a net.Error of the program's own is retried.
func TestClassifyProxyRefusesConnect(t *testing.T) {
	for _, code := range []int{http.StatusBadGateway, http.StatusServiceUnavailable} {
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodConnect {
				t.Errorf("proxy got %s; want CONNECT", r.Method)
			}
			w.WriteHeader(code)
		}))
		defer proxy.Close()
		proxyURL, err := url.Parse(proxy.URL)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			name string
			hook func(context.Context, *url.URL, *http.Request, *http.Response) error
			want retry.Decision
		}{
			{"net/http's error", nil, retry.Stop},
			{"OnProxyConnectResponse's net.Error", func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
				if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable {
					return proxyRefusal{resp.Status}
				}
				return nil
			}, retry.Retry},
		} {
			tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), OnProxyConnectResponse: tt.hook}
			resp, err := (&http.Client{Transport: tr}).Post("https://api.example.test/v1/charges", "application/json", strings.NewReader(`{}`))
			tr.CloseIdleConnections()
			if err == nil {
				resp.Body.Close()
				t.Fatalf("%d, %s: got %s; want an error", code, tt.name, resp.Status)
			}
			if tt.hook == nil {
				// Should net/http give it a type one day, Classify can judge
				// it by its status as a response's.
				var ue *url.Error
				if !errors.As(err, &ue) || ue.Err.Error() != http.StatusText(code) || fmt.Sprintf("%T", ue.Err) != "*errors.errorString" {
					t.Fatalf("%d, %s: got %v; want a *url.Error around net/http's errors.New(%q)", code, tt.name, err, http.StatusText(code))
				}
			}
			if got := retry.Classify(nil, err); got != tt.want {
				t.Errorf("%d, %s: Classify(%v) = %v; want %v", code, tt.name, err, got, tt.want)
			}
		}
	}
}

// TestReplayedNil: no response is no replayed answer, as errors.Is(nil, x)
// is false; and a response without a header map is not one either.
func TestReplayedNil(t *testing.T) {
	for _, tt := range []struct {
		name string
		resp *http.Response
		want bool
	}{
		{"nil response", nil, false},
		{"nil header", &http.Response{StatusCode: 503}, false},
		{"replayed", replayed(503), true},
		{"not replayed", resp(503), false},
	} {
		got := func() (got bool) {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Replayed panicked: %v", tt.name, r)
				}
			}()
			return retry.Replayed(tt.resp)
		}()
		if got != tt.want {
			t.Errorf("%s: Replayed = %v; want %v", tt.name, got, tt.want)
		}
	}
}

// TestReplayedAnySpelling: Idempotent-Replayed's value is a boolean, taken
// in any case and with spaces around it, as a server may write it; any
// other value is not a replay.
func TestReplayedAnySpelling(t *testing.T) {
	for value, want := range map[string]bool{
		"true": true, "True": true, "TRUE": true, " true ": true,
		"": false, "false": false, "1": false, "yes": false, "truer": false,
	} {
		r := resp(503)
		r.Header.Set("Idempotent-Replayed", value)
		if got := retry.Replayed(r); got != want {
			t.Errorf("Replayed with Idempotent-Replayed %q = %v; want %v", value, got, want)
		}
	}
}

// TestClassifyCutResponseHead: a server (or a proxy on the way) whose
// connection ends within the status line or the header of its answer, once
// the request was written, may have run the request: net/http reports it
// as a broken connection, wrapping a textproto.ProtocolError for a header
// line cut short ("malformed MIME header"), or an error of no type for a
// status line cut short. Each is retried under the same key, as the EOF
// of a connection that ends before the header does.
func TestClassifyCutResponseHead(t *testing.T) {
	for _, head := range []string{
		"HTTP/1.1 200 OK\r\nContent-Le", // within a header line
		"HTTP/1.1 200 OK\r\n",           // after a header line: io.ErrUnexpectedEOF
		"HTTP/1.1 20",                   // within the status code
		"HTTP/1.1",                      // before the status code
		"HTT",                           // within the version
	} {
		t.Run(head, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
					client, server := net.Pipe()
					go func() {
						defer server.Close()
						req, err := http.ReadRequest(bufio.NewReader(server))
						if err != nil {
							return
						}
						io.Copy(io.Discard, req.Body)
						io.WriteString(server, head)
					}()
					return client, nil
				}}
				defer tr.CloseIdleConnections()
				req, _ := http.NewRequest("POST", "http://api.example.test/v1/charges", strings.NewReader(`{}`))
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
					t.Fatalf("%q: got %s; want an error", head, resp.Status)
				}
				if got := retry.Classify(nil, err); got != retry.Retry {
					t.Errorf("%q: Classify(%v) = %v; want retry", head, err, got)
				} else {
					t.Logf("%q: %v", head, err)
				}
			})
		})
	}
}
