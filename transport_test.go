package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jarcoal/httpmock"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/resume"
	"github.com/idemkit/idem/retry"
)

const chargeURL = "https://api.example.test/v1/charges"

// fastPolicy retries without real waits: tests that wait run in a synctest
// bubble, where time is fake.
var fastPolicy = retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, MaxAttempts: 5}

// recorder is an httpmock responder that answers from a script and
// records the key of every attempt and whether each body was closed.
type recorder struct {
	mu     sync.Mutex
	keys   []string
	ops    []string // each attempt's idem.Operation
	bodies []string
	script []func() (*http.Response, error)
	closed []*closeTracker
}

type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

func (r *recorder) respond(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, _ := io.ReadAll(req.Body)
	r.keys = append(r.keys, req.Header.Get(idem.KeyHeader))
	r.ops = append(r.ops, idem.Operation(req.Context()))
	r.bodies = append(r.bodies, string(b))
	i := len(r.keys) - 1
	if i >= len(r.script) {
		i = len(r.script) - 1
	}
	resp, err := r.script[i]()
	if resp != nil {
		ct := &closeTracker{Reader: resp.Body}
		resp.Body = ct
		r.closed = append(r.closed, ct)
		resp.Request = req
	}
	return resp, err
}

func (r *recorder) attempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}

func status(code int, header ...string) func() (*http.Response, error) {
	return func() (*http.Response, error) {
		resp := httpmock.NewStringResponse(code, `{"status":`+http.StatusText(code)+`}`)
		for i := 0; i+1 < len(header); i += 2 {
			resp.Header.Set(header[i], header[i+1])
		}
		return resp, nil
	}
}

func netErr(errno syscall.Errno) func() (*http.Response, error) {
	return func() (*http.Response, error) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: errno}
	}
}

func newTransport(t *testing.T, steps ...func() (*http.Response, error)) (*idem.Transport, *recorder, *idem.MemoryJar) {
	t.Helper()
	rec := &recorder{script: steps}
	mt := httpmock.NewMockTransport()
	mt.RegisterResponder(http.MethodPost, chargeURL, rec.respond)
	jar := &idem.MemoryJar{}
	return &idem.Transport{Base: mt, Jar: jar, Policy: fastPolicy}, rec, jar
}

func post(t *testing.T, ctx context.Context, tr http.RoundTripper, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return tr.RoundTrip(req)
}

func TestSameKeyOnEveryRetryNewKeyPerOperation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(503), netErr(syscall.ECONNRESET), status(201))
		resp, err := post(t, context.Background(), tr, `{"amount":100}`)
		if err != nil {
			t.Fatalf("got %v; want the 201", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || len(rec.keys) != 3 {
			t.Fatalf("got status %d after %d attempts; want 201 after 3", resp.StatusCode, len(rec.keys))
		}
		if rec.keys[0] == "" || rec.keys[1] != rec.keys[0] || rec.keys[2] != rec.keys[0] {
			t.Fatalf("keys %q; want one non-empty key on every attempt", rec.keys)
		}
		if rec.bodies[2] != `{"amount":100}` {
			t.Fatalf("third attempt's body %q; want the original body again", rec.bodies[2])
		}
		if _, err := post(t, context.Background(), tr, `{"amount":100}`); err != nil {
			t.Fatal(err)
		}
		if rec.keys[3] == rec.keys[0] {
			t.Fatalf("a second unnamed operation reused key %q; want a new key", rec.keys[0])
		}
	})
}

// An operation is named by WithOperation, else by the caller's key, else
// by a fresh UUID v7 that sorts by creation time. Every attempt's context
// carries the name, and the jar holds the record under it.
func TestOperationNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		ctx := context.Background()
		for range 3 {
			resp, err := post(t, ctx, tr, `{"amount":100}`)
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("got %v, %v; want 201", resp, err)
			}
			time.Sleep(time.Millisecond)
		}
		for i, op := range rec.ops {
			u, err := uuid.Parse(op)
			if err != nil || u.Version() != 7 || op == rec.keys[i] {
				t.Fatalf("unnamed operation %d named %q (key %q); want a UUID v7 of its own", i, op, rec.keys[i])
			}
			if i > 0 && op <= rec.ops[i-1] {
				t.Fatalf("operation names %q do not sort by creation time", rec.ops)
			}
			if r, err := jar.Get(ctx, op); err != nil || r.Key != rec.keys[i] {
				t.Fatalf("jar's record of %q: %+v, %v; want key %q", op, r, err, rec.keys[i])
			}
		}

		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, strings.NewReader(`{}`))
		req.Header.Set(idem.KeyHeader, "callers-key-1")
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if got := rec.ops[len(rec.ops)-1]; got != "callers-key-1" {
			t.Fatalf("operation with the caller's key named %q; want the key", got)
		}
		if _, err := post(t, idem.WithOperation(ctx, "charge:order-42"), tr, `{}`); err != nil {
			t.Fatal(err)
		}
		if got := rec.ops[len(rec.ops)-1]; got != "charge:order-42" {
			t.Fatalf("named operation's attempt carried %q; want its name", got)
		}
	})
}

// TestWithOperationIsAContext: WithOperation's context behaves as
// context.WithValue's would: its name seen through contexts derived from
// it, the innermost name winning, the parent's values, deadline and
// cancellation passed through, and a cancel of a child that needs no
// goroutine of its own (as for context.WithValue's).
func TestWithOperationIsAContext(t *testing.T) {
	type otherKey struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), otherKey{}, "v"))
	ctx := idem.WithOperation(parent, "charge:1")
	if got := idem.Operation(ctx); got != "charge:1" {
		t.Fatalf("Operation = %q; want charge:1", got)
	}
	if got := ctx.Value(otherKey{}); got != "v" {
		t.Fatalf("parent's value = %v; want v", got)
	}
	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	if got := idem.Operation(child); got != "charge:1" {
		t.Fatalf("Operation of a derived context = %q; want charge:1", got)
	}
	if got := idem.Operation(idem.WithOperation(child, "charge:2")); got != "charge:2" {
		t.Fatalf("Operation of a context named twice = %q; want the inner name, charge:2", got)
	}
	if got := idem.Operation(parent); got != "" {
		t.Fatalf("Operation of the parent = %q; want none", got)
	}
	if s := fmt.Sprint(ctx); !strings.Contains(s, `WithOperation("charge:1")`) {
		t.Fatalf("String = %q; want the name in it", s)
	}
	before := runtime.NumGoroutine()
	var stops []context.CancelFunc
	for range 200 {
		_, stop := context.WithCancel(ctx)
		stops = append(stops, stop)
	}
	if n := runtime.NumGoroutine() - before; n >= 100 {
		t.Errorf("200 contexts derived with WithCancel started %d goroutines; want none (the parent's cancellation found through Value)", n)
	}
	for _, stop := range stops {
		stop()
	}
	cancel()
	select {
	case <-child.Done():
	default:
		t.Fatal("a context derived from WithOperation's is not cancelled with its parent")
	}
	if !errors.Is(child.Err(), context.Canceled) || !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("Err = %v, %v; want context.Canceled", child.Err(), ctx.Err())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("WithOperation of a nil context did not panic, as context.WithValue does")
		}
	}()
	var none context.Context
	idem.WithOperation(none, "x")
}

func TestConflictThenCreated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(409, "Retry-After", "1"), status(201))
		ctx := idem.WithOperation(context.Background(), "charge:order-1")
		resp, err := post(t, ctx, tr, `{"amount":100}`)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v, %v; want 201", resp, err)
		}
		if len(rec.keys) != 2 || rec.keys[0] != rec.keys[1] {
			t.Fatalf("keys %q; want 2 attempts with one key", rec.keys)
		}
		if !rec.closed[0].closed {
			t.Errorf("the superseded 409's body was not closed")
		}
		r, err := jar.Get(context.Background(), "charge:order-1")
		if err != nil || r.State != idem.StateDone || r.Attempts != 2 || r.Key != rec.keys[0] || r.LastStatus != 201 {
			t.Fatalf("jar record %+v, %v; want done, 2 attempts, the key sent, last status 201", r, err)
		}
		if r.Holder != "" {
			t.Errorf("lease still held by %q after the call; want released", r.Holder)
		}
	})
}

func TestUnprocessableStopsAndReturnsResponse(t *testing.T) {
	tr, rec, jar := newTransport(t, status(422), status(201))
	ctx := idem.WithOperation(context.Background(), "op")
	resp, err := post(t, ctx, tr, `{}`)
	if err != nil {
		t.Fatalf("got error %v; want the 422 response with a nil error", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 422 || rec.attempts() != 1 {
		t.Fatalf("got %d after %d attempts; want 422 after 1", resp.StatusCode, rec.attempts())
	}
	if b, _ := io.ReadAll(resp.Body); len(b) == 0 {
		t.Errorf("the final response's body is empty; want it readable")
	}
	if r, _ := jar.Get(ctx, "op"); r.State != idem.StateFailed {
		t.Fatalf("state %q; want failed", r.State)
	}
}

// TestSettledOperationKeepsItsOutcome: a call made again on a done or
// failed operation, for the server's saved answer, returns what it gets,
// under the operation's key; what it meets on the way (a 503 to the end of
// its attempts, with or without a Retry-After past MaxRetryAfter, a reset,
// a 401) is not the operation's outcome, which the jar keeps as it was. A
// done operation that succeeded stays so whatever final answer comes (a
// 500 or a 404 of a proxy; a 422 of the server, which compared this request
// with the one it applied): a failed one, or one whose 2xx became a 5xx,
// would read as never charged. A failed operation, or a done one that did
// not succeed, takes the call's final answer, the server's latest for the
// key. Before, every answer's status was written over the outcome, and a
// 503's next attempt time was stored on a done operation.
func TestSettledOperationKeepsItsOutcome(t *testing.T) {
	for _, c := range []struct {
		name        string
		first, then func() (*http.Response, error)
		thenStatus  int // the second call's answer; 0 for an error
		state       idem.State
		last        int
	}{
		{"done, then 422", status(201), status(422), 422, idem.StateDone, 201},
		{"done, then 503 to the end", status(201), status(503), 503, idem.StateDone, 201},
		{"done, then a long Retry-After", status(201), status(503, "Retry-After", "3600"), 503, idem.StateDone, 201},
		{"done, then 500", status(201), status(500), 500, idem.StateDone, 201},
		{"done, then 404", status(201), status(404), 404, idem.StateDone, 201},
		{"done, then 401", status(201), status(401), 401, idem.StateDone, 201},
		{"done, then resets", status(201), netErr(syscall.ECONNRESET), 0, idem.StateDone, 201},
		{"failed, then 503 to the end", status(422), status(503), 503, idem.StateFailed, 422},
		{"failed, then 500", status(422), status(500), 500, idem.StateDone, 500},
		{"done with a 404, then 201", status(404), status(201), 201, idem.StateDone, 201},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, c.first, c.then)
				ctx := idem.WithOperation(context.Background(), "op")
				if resp, err := post(t, ctx, tr, `{}`); err == nil {
					resp.Body.Close()
				}
				before, _ := jar.Get(ctx, "op")
				resp, err := post(t, ctx, tr, `{}`)
				got := 0
				if err == nil {
					got = resp.StatusCode
					resp.Body.Close()
				}
				if got != c.thenStatus {
					t.Fatalf("second call: %v, %v; want %d", resp, err, c.thenStatus)
				}
				r, _ := jar.Get(ctx, "op")
				if r.State != c.state || r.LastStatus != c.last || !r.NextAttempt.IsZero() {
					t.Errorf("after it: state %q, last status %d, next attempt %v; want %s, %d, none", r.State, r.LastStatus, r.NextAttempt, c.state, c.last)
				}
				if c.state == before.State && c.last == before.LastStatus && r.LastError != before.LastError {
					t.Errorf("last error %q; want the first's, %q", r.LastError, before.LastError)
				}
				for _, k := range rec.keys {
					if k != rec.keys[0] {
						t.Fatalf("keys sent %q; want the operation's every time", rec.keys)
					}
				}
			})
		})
	}
}

// TestTooEarlyRetriedUnderTheSameKey: a 425 Too Early says the server did
// not process the request (RFC 8470): it is sent again under its key, and
// the operation is settled by the answer that follows.
func TestTooEarlyRetriedUnderTheSameKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(425), status(201))
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v, %v; want 201 after the 425", resp, err)
		}
		resp.Body.Close()
		if rec.attempts() != 2 || rec.keys[0] != rec.keys[1] {
			t.Fatalf("keys %q; want 2 attempts with one key", rec.keys)
		}
		if r, _ := jar.Get(ctx, "op"); r.State != idem.StateDone || r.LastStatus != 201 {
			t.Fatalf("state %q, last status %d; want done with 201", r.State, r.LastStatus)
		}
	})
}

func TestFinalStatusesAreNotRetried(t *testing.T) {
	for _, code := range []int{200, 201, 302, 400, 404, 500} {
		tr, rec, _ := newTransport(t, status(code), status(201))
		resp, err := post(t, context.Background(), tr, `{}`)
		if err != nil || resp.StatusCode != code || rec.attempts() != 1 {
			t.Errorf("%d: got %v, %v after %d attempts; want it returned after 1", code, resp, err, rec.attempts())
		}
	}
}

// TestReplayedRetryableStatusIsFinal: a 409 or 503 that the server replays
// (Idempotent-Replayed: true) is the answer it saved for the key, which
// every retry would get again: it is returned at once and the operation is
// done.
func TestReplayedRetryableStatusIsFinal(t *testing.T) {
	for _, code := range []int{409, 425, 429, 503} {
		tr, rec, jar := newTransport(t, status(code, "Idempotent-Replayed", "true", "Retry-After", "1"), status(201))
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != code || rec.attempts() != 1 {
			t.Fatalf("replayed %d: got %v, %v after %d attempts; want it returned after 1", code, resp, err, rec.attempts())
		}
		resp.Body.Close()
		if r, _ := jar.Get(ctx, "op"); r.State != idem.StateDone || r.LastStatus != code {
			t.Fatalf("replayed %d: state %q, last status %d; want done with it", code, r.State, r.LastStatus)
		}
	}
}

// TestRefusedCredentialsLeaveTheOperationAsItWas: a 401 or 407 says the
// request was not applied (its credentials were refused), so it settles
// nothing: returned at once, not retried, and the operation keeps its
// state, pending after an attempt whose outcome is unknown, as a resume
// without the first credential meets it.
func TestRefusedCredentialsLeaveTheOperationAsItWas(t *testing.T) {
	for _, code := range []int{401, 407} {
		tr, rec, jar := newTransport(t, netErr(syscall.ECONNRESET), status(code), status(201))
		tr.Policy.MaxAttempts = 1
		ctx := idem.WithOperation(context.Background(), "op")
		if _, err := post(t, ctx, tr, `{}`); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("first call: %v; want pending", err)
		}
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != code || rec.attempts() != 2 {
			t.Fatalf("%d: got %v, %v after %d attempts; want it returned, not retried", code, resp, err, rec.attempts())
		}
		resp.Body.Close()
		r, _ := jar.Get(ctx, "op")
		if r.State != idem.StatePending || r.LastStatus != code || r.Attempts != 2 || r.Holder != "" {
			t.Fatalf("%d: record %+v; want pending, last status %d, 2 attempts, the lease released", code, r, code)
		}
	}
}

// TestRefusedCredentialsOfAnUnnamedCall: a call without a name whose only
// send is refused (401, 407) was never applied, and no later call can
// name its operation: done, with the answer its caller has, not left
// pending for a resume of every pending operation to send once more. One
// refused after an earlier send, whose outcome is unknown, stays pending.
func TestRefusedCredentialsOfAnUnnamedCall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []func() (*http.Response, error)
		state idem.State
	}{
		{"refused at its only send", []func() (*http.Response, error){status(401)}, idem.StateDone},
		{"refused by a proxy", []func() (*http.Response, error){status(407)}, idem.StateDone},
		{"refused after a send whose outcome is unknown", []func() (*http.Response, error){netErr(syscall.ECONNRESET), status(401)}, idem.StatePending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec, jar := newTransport(t, tc.steps...)
			var giveUps int
			tr.Hooks.OnGiveUp = func(idem.Event) { giveUps++ }
			resp, err := post(t, context.Background(), tr, `{}`)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			ops, err := jar.List(context.Background(), idem.Filter{})
			if err != nil || len(ops) != 1 {
				t.Fatalf("jar holds %v, %v; want one operation", ops, err)
			}
			want := 0
			if tc.state == idem.StatePending {
				want = 1
			}
			if r := ops[0]; r.State != tc.state || r.Holder != "" || rec.attempts() != len(tc.steps) || giveUps != want {
				t.Fatalf("operation %s (holder %q) after %d attempts, %d give-ups; want %s, released, %d attempts, %d give-ups",
					r.State, r.Holder, rec.attempts(), giveUps, tc.state, len(tc.steps), want)
			}
		})
	}
}

func TestResetConnectionIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, netErr(syscall.ECONNRESET), func() (*http.Response, error) { return nil, io.EOF }, status(200))
		resp, err := post(t, context.Background(), tr, `{}`)
		if err != nil || resp.StatusCode != 200 || rec.attempts() != 3 {
			t.Fatalf("got %v, %v after %d attempts; want 200 after 3", resp, err, rec.attempts())
		}
	})
}

func TestRetryAfterHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent []time.Time
		tr, _, _ := newTransport(t, status(503, "Retry-After", "7"), status(201))
		base := tr.Base
		tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, time.Now())
			return base.RoundTrip(r)
		})
		if _, err := post(t, context.Background(), tr, `{}`); err != nil {
			t.Fatal(err)
		}
		if len(sent) != 2 || sent[1].Sub(sent[0]) != 7*time.Second {
			t.Fatalf("attempts at %v; want two, 7s apart", sent)
		}
	})
}

// TestRetryAfterDateFromTheServersClock: an HTTP-date Retry-After is
// measured from the answer's Date: a server whose clock is an hour ahead
// of this one, asking for 7 s, is called again after 7 s, not deferred an
// hour; one whose clock is an hour behind is not called again at once.
func TestRetryAfterDateFromTheServersClock(t *testing.T) {
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			server := time.Now().Add(skew)
			var sent []time.Time
			tr, _, _ := newTransport(t, status(503, "Date", server.Format(http.TimeFormat),
				"Retry-After", server.Add(7*time.Second).Format(http.TimeFormat)), status(201))
			base := tr.Base
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sent = append(sent, time.Now())
				return base.RoundTrip(r)
			})
			resp, err := post(t, context.Background(), tr, `{}`)
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("server's clock %v off: got %v, %v; want 201", skew, resp, err)
			}
			if len(sent) != 2 || sent[1].Sub(sent[0]) != 7*time.Second {
				t.Fatalf("server's clock %v off: attempts at %v; want two, 7s apart", skew, sent)
			}
		})
	}
}

// TestTooManyRequestsWithoutRetryAfterBacksOff: a 429 without
// Retry-After is retried after the policy's backoff, not at once, within
// MaxAttempts; the last 429 comes back and the operation stays pending,
// with no next attempt time.
func TestTooManyRequestsWithoutRetryAfterBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, _, jar := newTransport(t, status(429))
		tr.Policy = retry.Policy{InitialInterval: time.Second, Multiplier: 2, NoJitter: true, MaxAttempts: 4}
		var sent []time.Time
		base := tr.Base
		tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, time.Now())
			return base.RoundTrip(r)
		})
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 429 {
			t.Fatalf("got %v, %v; want the last 429", resp, err)
		}
		resp.Body.Close()
		var gaps []time.Duration
		for i := 1; i < len(sent); i++ {
			gaps = append(gaps, sent[i].Sub(sent[i-1]))
		}
		if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}; fmt.Sprint(gaps) != fmt.Sprint(want) {
			t.Fatalf("waits between attempts %v; want %v", gaps, want)
		}
		if r, _ := jar.Get(ctx, "op"); r.State != idem.StatePending || r.Attempts != 4 || !r.NextAttempt.IsZero() {
			t.Fatalf("record %+v; want pending after 4 attempts, no next attempt time", r)
		}
	})
}

func TestRetryAfterBeyondCapIsDeferred(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(503, "Retry-After", "3600"), status(201))
		ctx := idem.WithOperation(context.Background(), "op")
		start := time.Now()
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the 503 back with a nil error", resp, err)
		}
		if time.Since(start) != 0 || rec.attempts() != 1 {
			t.Fatalf("waited %v and sent %d; want no wait beyond the 30s cap and 1 attempt", time.Since(start), rec.attempts())
		}
		r, _ := jar.Get(ctx, "op")
		if r.State != idem.StatePending || !r.NextAttempt.Equal(start.Add(time.Hour)) {
			t.Fatalf("record %s next attempt %v; want pending, next attempt %v", r.State, r.NextAttempt, start.Add(time.Hour))
		}
		_, err = post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || !pe.NextAttempt.Equal(start.Add(time.Hour)) || rec.attempts() != 1 {
			t.Fatalf("second call: got %v after %d attempts; want *PendingError saying when, nothing sent", err, rec.attempts())
		}
		time.Sleep(time.Hour)
		resp, err = post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 201 || rec.keys[1] != rec.keys[0] {
			t.Fatalf("after the hour: got %v, %v, keys %q; want 201 with the same key", resp, err, rec.keys)
		}
	})
}

// TestRetryAfterRecordedWhenTheCallStops: whatever stops a call (its
// budget, its attempts), the last answer's Retry-After is recorded, and the
// next call does not send before it.
func TestRetryAfterRecordedWhenTheCallStops(t *testing.T) {
	for _, tt := range []struct {
		name       string
		policy     retry.Policy
		last       string // the last answer's Retry-After, in seconds
		retryAfter time.Duration
	}{
		{"budget spent, over the cap", retry.Policy{InitialInterval: 5 * time.Second, MaxInterval: 10 * time.Second,
			MaxElapsed: 20 * time.Second, NoJitter: true}, "3600", time.Hour},
		{"attempts spent, within the cap", retry.Policy{InitialInterval: time.Second, MaxAttempts: 3, NoJitter: true}, "20", 20 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(503), status(503), status(503, "Retry-After", tt.last), status(201))
				tr.Policy = tt.policy
				ctx := idem.WithOperation(context.Background(), "op")
				resp, err := post(t, ctx, tr, `{}`)
				if err != nil || resp.StatusCode != 503 || rec.attempts() != 3 {
					t.Fatalf("got %v, %v after %d attempts; want the last 503 after 3", resp, err, rec.attempts())
				}
				stopped := time.Now()
				if r, _ := jar.Get(ctx, "op"); !r.NextAttempt.Equal(stopped.Add(tt.retryAfter)) {
					t.Fatalf("NextAttempt %v; want %v, the server's Retry-After", r.NextAttempt, stopped.Add(tt.retryAfter))
				}
				tr.Policy = retry.Policy{MaxRetryAfter: time.Hour, MaxElapsed: 2 * time.Hour}
				resp, err = post(t, ctx, tr, `{}`)
				if err != nil || resp.StatusCode != 201 || rec.attempts() != 4 || time.Since(stopped) != tt.retryAfter {
					t.Fatalf("next call: got %v, %v, attempt %d sent %v after the stop; want 201, sent %v after", resp, err, rec.attempts(), time.Since(stopped), tt.retryAfter)
				}
			})
		})
	}
}

// TestRetryAfterKeptWhenTheWaitIsCut: a call whose context ends while it
// waits out a Retry-After leaves the server's time in the record and in its
// *PendingError, and the next call does not send before it.
func TestRetryAfterKeptWhenTheWaitIsCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(503, "Retry-After", "20"), status(201))
		start := time.Now()
		ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op"), 5*time.Second)
		defer cancel()
		_, err := post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		want := start.Add(20 * time.Second)
		if !errors.As(err, &pe) || !pe.NextAttempt.Equal(want) {
			t.Fatalf("got %v; want a *PendingError with NextAttempt %v", err, want)
		}
		if r, _ := jar.Get(context.Background(), "op"); !r.NextAttempt.Equal(want) {
			t.Fatalf("record NextAttempt %v; want %v", r.NextAttempt, want)
		}
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil || resp.StatusCode != 201 || rec.attempts() != 2 || time.Since(start) != 20*time.Second {
			t.Fatalf("next call: %v, %v, sent at +%v; want 201 sent at +20s", resp, err, time.Since(start))
		}
	})
}

// TestStoredNextAttemptWithinTheCallsLimits: a call that finds a stored
// NextAttempt (an earlier answer's Retry-After) waits for it only when the
// wait is within both Policy.MaxRetryAfter and Policy.MaxElapsed; beyond
// either, it sends nothing and returns a *PendingError that says when.
func TestStoredNextAttemptWithinTheCallsLimits(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, tt := range []struct {
		name   string
		policy retry.Policy
		sent   bool
	}{
		{"within both", retry.Policy{MaxRetryAfter: 30 * time.Second, MaxElapsed: time.Minute}, true},
		{"beyond MaxRetryAfter", retry.Policy{MaxRetryAfter: 10 * time.Second, MaxElapsed: time.Minute}, false},
		{"beyond MaxElapsed", retry.Policy{MaxRetryAfter: 30 * time.Second, MaxElapsed: 10 * time.Second}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(201))
				tr.Policy = tt.policy
				ctx := idem.WithOperation(context.Background(), "op")
				now := time.Now()
				next := now.Add(20 * time.Second)
				if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
					Created: now, Updated: now, Attempts: 1, LastStatus: 503, NextAttempt: next}); err != nil {
					t.Fatal(err)
				}
				resp, err := post(t, ctx, tr, `{}`)
				if tt.sent {
					if err != nil || resp.StatusCode != 201 || rec.attempts() != 1 || rec.keys[0] != "k1" || time.Since(now) != 20*time.Second {
						t.Fatalf("got %v, %v, %d sent at +%v; want 201, sent once with k1 at +20s", resp, err, rec.attempts(), time.Since(now))
					}
					return
				}
				var pe *idem.PendingError
				if !errors.As(err, &pe) || !pe.NextAttempt.Equal(next) || rec.attempts() != 0 || time.Since(now) != 0 {
					t.Fatalf("got %v, %d sent after %v; want a *PendingError with NextAttempt %v at once, nothing sent", err, rec.attempts(), time.Since(now), next)
				}
				if r, _ := jar.Get(ctx, "op"); r.State != idem.StatePending || !r.NextAttempt.Equal(next) || r.Holder != "" || r.Attempts != 1 {
					t.Fatalf("record %+v; want pending as it was, NextAttempt %v, the lease released", r, next)
				}
			})
		})
	}
}

func TestCallerRequestUnchanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(503), status(201))
		req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{"a":1}`))
		req.Header.Set("Content-Type", "application/json")
		before := req.Header.Clone()
		url := req.URL.String()
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 201 || rec.attempts() != 2 {
			t.Fatalf("got %v, %v", resp, err)
		}
		if req.Header.Get(idem.KeyHeader) != "" || len(req.Header) != len(before) || req.URL.String() != url {
			t.Fatalf("caller's request changed: header %v, url %s", req.Header, req.URL)
		}
		b, _ := req.GetBody()
		if got, _ := io.ReadAll(b); string(got) != `{"a":1}` {
			t.Fatalf("caller's GetBody now yields %q", got)
		}
	})
}

// TestDefaultMethods: with Methods nil, POST and PATCH get a key, are
// retried and are recorded in the jar; every other method passes through
// to Base untouched: one attempt, no key, no record. Names match in any
// case, as with Methods {POST, PATCH}: nil once compared them exactly, and
// sent a "post" without a key.
func TestDefaultMethods(t *testing.T) {
	for _, tt := range []struct {
		method  string
		keyed   bool
		methods []string
	}{
		{http.MethodPost, true, nil}, {http.MethodPatch, true, nil}, {"post", true, nil}, {"Patch", true, nil},
		{"post", true, []string{http.MethodPost, http.MethodPatch}},
		{http.MethodGet, false, nil}, {http.MethodHead, false, nil}, {http.MethodPut, false, nil}, {http.MethodDelete, false, nil},
		{"put", false, nil},
	} {
		t.Run(fmt.Sprintf("%s/%q", tt.method, tt.methods), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{script: []func() (*http.Response, error){status(503), status(200)}}
				mt := httpmock.NewMockTransport()
				mt.DontCheckMethod = true // a "post" is sent as it is
				mt.RegisterResponder(tt.method, chargeURL, rec.respond)
				jar := &idem.MemoryJar{}
				tr := &idem.Transport{Base: mt, Jar: jar, Policy: fastPolicy, Methods: tt.methods}
				req, err := http.NewRequest(tt.method, chargeURL, strings.NewReader(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				recs, _ := jar.List(context.Background(), idem.Filter{})
				if tt.keyed {
					if resp.StatusCode != 200 || rec.attempts() != 2 || rec.keys[0] == "" || rec.keys[1] != rec.keys[0] || len(recs) != 1 {
						t.Fatalf("got %d after %d attempts with keys %q, %d records; want 200 after 2 attempts with one key, 1 record",
							resp.StatusCode, rec.attempts(), rec.keys, len(recs))
					}
					return
				}
				if resp.StatusCode != 503 || rec.attempts() != 1 || rec.keys[0] != "" || len(recs) != 0 {
					t.Fatalf("got %d after %d attempts with keys %q, %d records; want the 503 of one attempt without a key, no record",
						resp.StatusCode, rec.attempts(), rec.keys, len(recs))
				}
			})
		})
	}
}

func TestCallersOwnKeyKeptAndPersisted(t *testing.T) {
	tr, rec, jar := newTransport(t, status(201))
	req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
	req.Header.Set(idem.KeyHeader, "my-key-1")
	req = req.WithContext(idem.WithOperation(req.Context(), "op"))
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if rec.keys[0] != "my-key-1" {
		t.Fatalf("sent key %q; want the caller's my-key-1", rec.keys[0])
	}
	if r, _ := jar.Get(context.Background(), "op"); r.Key != "my-key-1" {
		t.Fatalf("jar key %q; want my-key-1", r.Key)
	}
	req2, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
	req2.Header.Set(idem.KeyHeader, "my-key-2")
	req2 = req2.WithContext(idem.WithOperation(req2.Context(), "op"))
	_, err := tr.RoundTrip(req2)
	var me *idem.MismatchError
	if !errors.As(err, &me) || rec.attempts() != 1 {
		t.Fatalf("same operation, other key: got %v; want *MismatchError, nothing sent", err)
	}
}

// TestCallersKeyInAnySpelling: a key set in the header map directly, under
// a spelling other than the canonical one, is the caller's key: sent once,
// under KeyHeader, stored as the record's key and not in its header.
func TestCallersKeyInAnySpelling(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Values(idem.KeyHeader)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Base: srv.Client().Transport}
	ctx := idem.WithOperation(context.Background(), "op")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Header["idempotency-key"] = []string{"caller-key-1"}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "caller-key-1" {
		t.Fatalf("server got Idempotency-Key %q; want the caller's one key", got)
	}
	r, _ := jar.Get(ctx, "op")
	if r.Key != "caller-key-1" || len(r.Header) != 0 {
		t.Fatalf("stored key %q, header %v; want the caller's key and no key header", r.Key, r.Header)
	}

	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Header.Set(idem.KeyHeader, "caller-key-1")
	req.Header["IDEMPOTENCY-KEY"] = []string{"caller-key-2"}
	if _, err := tr.RoundTrip(req); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("two keys under two spellings: got %v; want ErrInvalidKey", err)
	}
}

func TestNamedOperationMismatchRefusedLocally(t *testing.T) {
	tr, rec, _ := newTransport(t, status(201))
	ctx := idem.WithOperation(context.Background(), "charge:order-7")
	if _, err := post(t, ctx, tr, `{"amount": 100, "currency": "eur"}`); err != nil {
		t.Fatal(err)
	}
	// Same JSON, other key order and whitespace: the same operation.
	if _, err := post(t, ctx, tr, "{\"currency\":\"eur\",\n \"amount\":100}"); err != nil {
		t.Fatalf("equivalent JSON: got %v; want it sent as the same operation", err)
	}
	if rec.attempts() != 2 || rec.keys[1] != rec.keys[0] {
		t.Fatalf("keys %q; want the same key twice", rec.keys)
	}
	_, err := post(t, ctx, tr, `{"amount": 200, "currency": "eur"}`)
	var me *idem.MismatchError
	if !errors.As(err, &me) || !errors.Is(err, idem.ErrMismatch) || me.Op != "charge:order-7" || me.Key != rec.keys[0] || me.State != idem.StateDone {
		t.Fatalf("different amount: got %v; want *MismatchError for the operation, its key and its state, done", err)
	}
	if strings.Contains(err.Error(), "pending") {
		t.Errorf("message %q speaks of a pending operation; this one is done", err)
	}
	if rec.attempts() != 2 {
		t.Fatalf("a mismatched request was sent")
	}
}

// TestMismatchOfAPendingOperationSaysItStaysPending: a new request under the
// name of an operation whose outcome is unknown (here its only attempt got a
// 503) is refused, and the error says what resolves the first: a new name
// would leave it pending for ever.
func TestMismatchOfAPendingOperationSaysItStaysPending(t *testing.T) {
	tr, rec, jar := newTransport(t, status(503))
	tr.Policy.MaxAttempts = 1
	ctx := idem.WithOperation(context.Background(), "charge:order-8")
	resp, err := post(t, ctx, tr, `{"amount": 100}`)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("first call: %v, %v; want the 503", resp, err)
	}
	resp.Body.Close()
	_, err = post(t, ctx, tr, `{"amount": 200}`)
	var me *idem.MismatchError
	if !errors.As(err, &me) || me.State != idem.StatePending || rec.attempts() != 1 {
		t.Fatalf("other body: %v after %d attempts; want *MismatchError of a pending operation, nothing sent", err, rec.attempts())
	}
	for _, want := range []string{"stays pending", "sent again unchanged", "abandoned"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q; want it to say %q", err, want)
		}
	}
	if r, _ := jar.Get(ctx, "charge:order-8"); r.State != idem.StatePending || r.Holder != "" {
		t.Errorf("record %s, holder %q after the mismatch; want pending and free, as it was", r.State, r.Holder)
	}
}

// TestPendingErrorSaysWhatToDo: the message of a call that stopped with its
// outcome unknown says that the operation is resumed under its name, and
// when, before the last error.
func TestPendingErrorSaysWhatToDo(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		err  *idem.PendingError
		want string
	}{
		{&idem.PendingError{Op: "charge:o1", Key: "k1", Attempts: 5, Err: io.EOF},
			`idem: operation "charge:o1" (key "k1") still pending after 5 attempt(s) in 0s, outcome unknown; resume it later under the same name: EOF`},
		{&idem.PendingError{Op: "charge:o1", Key: "k1", Attempts: 1, LastStatus: 503, NextAttempt: at},
			`idem: operation "charge:o1" (key "k1") still pending after 1 attempt(s) in 0s, outcome unknown; resume it under the same name after 2025-03-01T12:00:00Z`},
		{&idem.PendingError{Op: "charge:o1", Key: "k1", Attempts: 1, Err: io.EOF, Reason: "retry budget empty after network error"},
			`idem: operation "charge:o1" (key "k1") still pending after 1 attempt(s) in 0s (retry budget empty after network error), outcome unknown; resume it later under the same name: EOF`},
		{&idem.PendingError{Op: "charge:o1", Key: "k1", Attempts: 2, Err: io.EOF, State: idem.StateDone},
			`idem: operation "charge:o1" (key "k1") is done, its outcome known, but this call, which sent it again for the server's saved answer, got none after 2 attempt(s) in 0s; call it again later under the same name: EOF`},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got %q; want %q", got, c.want)
		}
	}
}

// TestPendingErrorSaysWhy: a *PendingError's Reason, and its message, say
// what stopped the call, as OnGiveUp's Event does: a caller whose call
// stopped after one attempt learns that the shared budget, not the
// policy, stopped it.
func TestPendingErrorSaysWhy(t *testing.T) {
	refused := netErr(syscall.ECONNREFUSED)
	for _, c := range []struct {
		name   string
		steps  []func() (*http.Response, error)
		set    func(*idem.Transport)
		ctx    func(context.Context) (context.Context, context.CancelFunc)
		reason string
	}{
		{"attempts", []func() (*http.Response, error){refused, refused, refused}, func(tr *idem.Transport) { tr.Policy.MaxAttempts = 3 }, nil,
			"MaxAttempts (3) reached after network error"},
		{"budget", []func() (*http.Response, error){refused, refused}, func(tr *idem.Transport) { tr.Budget = &retry.Budget{Capacity: 5} }, nil,
			"retry budget empty after network error"},
		{"elapsed", []func() (*http.Response, error){refused, refused}, func(tr *idem.Transport) {
			tr.Policy = retry.Policy{InitialInterval: 40 * time.Second, NoJitter: true, MaxElapsed: 30 * time.Second}
		}, nil, "the next wait would pass the call's MaxElapsed (30s) after network error"},
		{"deadline", []func() (*http.Response, error){refused, refused}, func(tr *idem.Transport) {
			tr.Policy = retry.Policy{InitialInterval: 10 * time.Second, NoJitter: true}
		}, func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 5*time.Second)
		},
			"the next wait would end past the context's deadline"},
		{"cancelled", []func() (*http.Response, error){refused, refused}, func(tr *idem.Transport) {
			tr.Policy = retry.Policy{InitialInterval: 10 * time.Second, NoJitter: true}
		}, func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(time.Second, cancel)
			return ctx, cancel
		}, "the call's context ended"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, _, _ := newTransport(t, c.steps...)
				c.set(tr)
				var gaveUp []string
				tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Reason) }
				ctx := idem.WithOperation(context.Background(), "op")
				if c.ctx != nil {
					var cancel context.CancelFunc
					ctx, cancel = c.ctx(ctx)
					defer cancel()
				}
				_, err := post(t, ctx, tr, `{}`)
				var pe *idem.PendingError
				if !errors.As(err, &pe) || pe.Reason != c.reason || !strings.Contains(err.Error(), "("+c.reason+")") {
					t.Fatalf("got %v; want a *PendingError whose Reason, and message, say %q", err, c.reason)
				}
				if !slices.Equal(gaveUp, []string{c.reason}) {
					t.Errorf("OnGiveUp saw %q; want %q", gaveUp, c.reason)
				}
			})
		})
	}
}

// TestMismatchErrorOfAServer422: a server's 422 (Stored and Got empty, as
// package client builds it) may be an API's own refusal of the request, not
// a key reused: the message says what the server did and what both
// meanings have in common, never that the request differs from the first.
// A local mismatch keeps its precise words.
func TestMismatchErrorOfAServer422(t *testing.T) {
	server := (&idem.MismatchError{Op: "charge:o1", Key: "k1"}).Error()
	for _, want := range []string{`"charge:o1"`, `"k1"`, "refused the request with 422", "used for a different request",
		"a request it will not process", "do not retry it under this key"} {
		if !strings.Contains(server, want) {
			t.Errorf("server's 422: message %q; want it to say %q", server, want)
		}
	}
	if strings.Contains(server, "first sent with a different") {
		t.Errorf("server's 422: message %q says the request differs from the first; the server does not say so", server)
	}
	local := (&idem.MismatchError{Op: "charge:o1", Key: "k1", Stored: "fp1", Got: "fp2", State: idem.StateDone}).Error()
	if want := `idem: operation "charge:o1" (key "k1") was first sent with a different method, URL or body; use a new operation name for a new request`; local != want {
		t.Errorf("local mismatch: got %q; want %q", local, want)
	}
}

func TestNilJarIsAnError(t *testing.T) {
	var sent bool
	tr := &idem.Transport{Base: roundTripFunc(func(*http.Request) (*http.Response, error) { sent = true; return nil, nil })}
	body := &closeTracker{Reader: strings.NewReader("{}")}
	req, _ := http.NewRequest(http.MethodPost, chargeURL, body)
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, idem.ErrNilJar) || sent {
		t.Fatalf("got %v, sent=%v; want ErrNilJar and nothing sent", err, sent)
	}
	if !body.closed {
		t.Fatalf("the caller's body was not closed on error")
	}
}

func TestBodyThatCannotBeRewoundIsRefused(t *testing.T) {
	tr, rec, jar := newTransport(t, status(201))
	tr.MaxBuffer = 16
	body := &closeTracker{Reader: strings.NewReader(strings.Repeat("x", 17))}
	req, _ := http.NewRequest(http.MethodPost, chargeURL, body) // no GetBody for a custom reader
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, idem.ErrBodyNotRewindable) || rec.attempts() != 0 || !body.closed {
		t.Fatalf("got %v, %d attempts, closed=%v; want ErrBodyNotRewindable, nothing sent, body closed", err, rec.attempts(), body.closed)
	}
	if recs, _ := jar.List(context.Background(), idem.Filter{}); len(recs) != 0 {
		t.Fatalf("jar holds %d records; want none for a refused request", len(recs))
	}
}

// TestRequestBodyErrors: a body that cannot be read, or produced again for
// the first attempt, is an error wrapping ErrRequestBody and its cause, and
// leaves nothing in the jar and nothing sent; one that cannot be produced
// for a retry leaves the operation pending, its attempts counted as sent.
func TestRequestBodyErrors(t *testing.T) {
	boom := errors.New("boom")
	getBodyFailing := func(after int) func() *http.Request {
		return func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
			calls := 0
			req.GetBody = func() (io.ReadCloser, error) {
				if calls++; calls > after {
					return nil, boom
				}
				return io.NopCloser(strings.NewReader(`{}`)), nil
			}
			return req
		}
	}
	for _, tt := range []struct {
		name string
		req  func() *http.Request
	}{
		{"GetBody fails", getBodyFailing(0)},
		{"GetBody fails for the first attempt", getBodyFailing(1)},
		{"the reader fails, no GetBody", func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, chargeURL, io.NopCloser(iotest.ErrReader(boom)))
			return req
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, rec, jar := newTransport(t, status(201))
			resp, err := tr.RoundTrip(tt.req())
			if resp != nil || !errors.Is(err, idem.ErrRequestBody) || !errors.Is(err, boom) || rec.attempts() != 0 {
				t.Fatalf("got %v, %v after %d sends; want an error wrapping ErrRequestBody and boom, nothing sent", resp, err, rec.attempts())
			}
			if recs, _ := jar.List(context.Background(), idem.Filter{}); len(recs) != 0 {
				t.Fatalf("jar holds %+v; want nothing stored", recs)
			}
		})
	}
	t.Run("the caller's context ends while the body is read", func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(201))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n := 0
		body := io.NopCloser(readFunc(func(p []byte) (int, error) {
			if n++; n == 2 {
				cancel()
			}
			p[0] = ' '
			return 1, nil
		}))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, body)
		if _, err := tr.RoundTrip(req); !errors.Is(err, idem.ErrRequestBody) || !errors.Is(err, context.Canceled) || rec.attempts() != 0 {
			t.Fatalf("got %v after %d sends; want an error wrapping ErrRequestBody and context.Canceled", err, rec.attempts())
		}
	})
	t.Run("GetBody fails for a retry", func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(503), status(201))
		req := getBodyFailing(2)()
		req = req.WithContext(idem.WithOperation(req.Context(), "op"))
		_, err := tr.RoundTrip(req)
		var pe *idem.PendingError
		r, _ := jar.Get(context.Background(), "op")
		if !errors.As(err, &pe) || !errors.Is(err, idem.ErrRequestBody) || pe.Attempts != 1 || rec.attempts() != 1 || r.Attempts != 1 || r.State != idem.StatePending {
			t.Fatalf("got %v after %d sends, record %s with %d attempts; want a *PendingError wrapping ErrRequestBody after 1 attempt, counted once",
				err, rec.attempts(), r.State, r.Attempts)
		}
	})
}

func TestBodyWithoutGetBodyIsBufferedForRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(503), status(201))
		req, _ := http.NewRequest(http.MethodPost, chargeURL, io.NopCloser(strings.NewReader("hello")))
		if req.GetBody != nil {
			t.Fatal("test needs a request without GetBody")
		}
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if len(rec.bodies) != 2 || rec.bodies[0] != "hello" || rec.bodies[1] != "hello" {
			t.Fatalf("bodies %q; want hello twice", rec.bodies)
		}
	})
}

func TestHorizonFromStoredFirstSend(t *testing.T) {
	for _, tt := range []struct {
		age  time.Duration
		sent bool
	}{
		{23*time.Hour + 59*time.Minute, true},
		{24*time.Hour + time.Minute, false},
		// A first send in the future, by a clock that ran ahead: within
		// retry.ClockAhead it is sent; beyond, its age is unknown.
		{-30 * time.Minute, true},
		{-2 * time.Hour, false},
	} {
		tr, rec, jar := newTransport(t, status(201))
		ctx := idem.WithOperation(context.Background(), "op")
		// The first send happened in an earlier process: only the jar knows when.
		if _, err := post(t, ctx, &idem.Transport{Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
		}), Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}, `{}`); err == nil {
			t.Fatal("want the first call to fail")
		}
		r, _ := jar.Get(ctx, "op")
		backdate(t, jar, r, time.Now().Add(-tt.age))

		resp, err := post(t, ctx, tr, `{}`)
		if tt.sent {
			if err != nil || resp.StatusCode != 201 || rec.attempts() != 1 || rec.keys[0] != r.Key {
				t.Fatalf("%v old: got %v, %v; want it sent with key %s", tt.age, resp, err, r.Key)
			}
			continue
		}
		var re *idem.ReconcileError
		if !errors.As(err, &re) || !errors.Is(err, idem.ErrReconcile) || rec.attempts() != 0 || re.Key != r.Key {
			t.Fatalf("%v old: got %v after %d attempts; want *ReconcileError, nothing sent", tt.age, err, rec.attempts())
		}
		if ahead := strings.Contains(err.Error(), "ahead of this clock"); ahead != (tt.age < 0) {
			t.Errorf("%v old: %q; says the clock ran ahead: %v, want %v", tt.age, err, ahead, tt.age < 0)
		}
		if got, _ := jar.Get(ctx, "op"); got.State != idem.StateReconcile || re.State != idem.StateReconcile {
			t.Fatalf("state %q, ReconcileError's %q; want reconcile", got.State, re.State)
		}
		if _, err := post(t, ctx, tr, `{}`); !errors.As(err, &re) || rec.attempts() != 0 || re.State != idem.StateReconcile {
			t.Fatalf("again: got %v (state %q); want *ReconcileError of a reconcile operation, nothing sent", err, re.State)
		}
	}
}

// TestNextAttemptWithinTheHorizon: a Retry-After that ends past the
// horizon, counted from the operation's first send, is stored as the
// horizon's end: the operation is reconciled then, not sent, and a call
// is not told to wait longer.
func TestNextAttemptWithinTheHorizon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, netErr(syscall.ECONNREFUSED), status(503, "Retry-After", "86400"))
		tr.Policy.MaxAttempts = 1
		ctx := idem.WithOperation(context.Background(), "op")
		if _, err := post(t, ctx, tr, `{}`); err == nil {
			t.Fatal("want the first call to fail")
		}
		r, _ := jar.Get(ctx, "op")
		created := time.Now().Add(-23 * time.Hour)
		backdate(t, jar, r, created)
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the 503", resp, err)
		}
		resp.Body.Close()
		got, _ := jar.Get(ctx, "op")
		if want := created.Add(24 * time.Hour); !got.NextAttempt.Equal(want) || rec.attempts() != 2 {
			t.Fatalf("NextAttempt %v after %d attempts; want the horizon's end, %v", got.NextAttempt, rec.attempts(), want)
		}
	})
}

// TestHorizonKeepsAKnownOutcome: a done operation called again past the
// horizon is not sent (the server may no longer know its key) and stays
// done.
func TestHorizonKeepsAKnownOutcome(t *testing.T) {
	tr, rec, jar := newTransport(t, status(201), status(201))
	ctx := idem.WithOperation(context.Background(), "op")
	if _, err := post(t, ctx, tr, `{}`); err != nil {
		t.Fatal(err)
	}
	r, _ := jar.Get(ctx, "op")
	backdate(t, jar, r, time.Now().Add(-25*time.Hour))
	_, err := post(t, ctx, tr, `{}`)
	got, _ := jar.Get(ctx, "op")
	if !errors.Is(err, idem.ErrReconcile) || rec.attempts() != 1 || got.State != idem.StateDone {
		t.Fatalf("got %v after %d sends, state %s; want *ReconcileError, nothing sent again, still done", err, rec.attempts(), got.State)
	}
}

// backdate rewrites a record's creation time, as if the first send were at t0.
func backdate(t *testing.T, jar *idem.MemoryJar, r idem.Record, t0 time.Time) {
	t.Helper()
	ctx := context.Background()
	if err := jar.Forget(ctx, r.Op); err != nil {
		t.Fatal(err)
	}
	r.Created = t0
	if _, created, err := jar.Begin(ctx, r); err != nil || !created {
		t.Fatal(err)
	}
}

func TestBudgetSpentLeavesOperationPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, netErr(syscall.ECONNREFUSED), netErr(syscall.ECONNREFUSED), netErr(syscall.ECONNREFUSED), status(201))
		tr.Policy.MaxAttempts = 3
		ctx := idem.WithOperation(context.Background(), "charge:order-9")
		_, err := post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || !errors.Is(err, idem.ErrPending) {
			t.Fatalf("got %v; want *PendingError", err)
		}
		var ne net.Error
		if pe.Op != "charge:order-9" || pe.Key != rec.keys[0] || pe.Attempts != 3 || !errors.As(err, &ne) {
			t.Fatalf("got %+v; want op, key, 3 attempts and the last network error", pe)
		}
		r, _ := jar.Get(ctx, "charge:order-9")
		if r.State != idem.StatePending || r.Attempts != 3 || r.LastError == "" || r.Holder != "" {
			t.Fatalf("record %+v; want pending with 3 attempts, the last error, no lease", r)
		}
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 201 || rec.keys[3] != rec.keys[0] {
			t.Fatalf("resume: got %v, %v, key %q; want 201 with the same key %q", resp, err, rec.keys[3], rec.keys[0])
		}
	})
}

// TestPendingErrorOfADoneOperation: a done operation called again is sent
// again, for the server's saved answer; when the call gets none, its
// *PendingError says the operation is done, not that its outcome is
// unknown, nor to resume it (Resume refuses a done operation), and the
// record stays done.
func TestPendingErrorOfADoneOperation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201), netErr(syscall.ECONNRESET))
		tr.Policy.MaxAttempts = 3
		ctx := idem.WithOperation(context.Background(), "charge:order-9")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("first call: %v, %v; want 201", resp, err)
		}
		resp.Body.Close()
		_, err = post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || pe.Attempts != 3 || pe.State != idem.StateDone || rec.attempts() != 4 {
			t.Fatalf("second call: %v after %d sends; want a *PendingError of a done operation after 3 more attempts", err, rec.attempts())
		}
		msg := err.Error()
		if strings.Contains(msg, "outcome unknown") || strings.Contains(msg, "pending") || strings.Contains(msg, "resume") || !strings.Contains(msg, `"charge:order-9" (key "`+rec.keys[0]+`") is done`) {
			t.Errorf("message %q; want it to say the operation is done, not pending or to resume", msg)
		}
		if r, _ := jar.Get(ctx, "charge:order-9"); r.State != idem.StateDone || r.Holder != "" {
			t.Fatalf("record %s held by %q; want done, no lease", r.State, r.Holder)
		}
	})
}

// TestRetryNotSentGivesItsCostBack: a call whose context ends while it
// waits for a retry it paid for gives the Budget that cost back: the retry
// never reached the server. A retry that was sent keeps its cost.
func TestRetryNotSentGivesItsCostBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(503, "Retry-After", "5"), status(503, "Retry-After", "5"))
		budget := &retry.Budget{Capacity: 100}
		tr.Budget = budget
		ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
		defer cancel()
		_, err := post(t, ctx, tr, `{}`)
		if !errors.Is(err, idem.ErrPending) || rec.attempts() != 2 {
			t.Fatalf("got %v after %d attempts; want pending after 2", err, rec.attempts())
		}
		// Two retries paid for (5 each): the first sent, the second cut
		// off by the context during its wait.
		if got := budget.Available(); got != 95 {
			t.Fatalf("budget holds %d; want 95: the sent retry's cost taken, the unsent one's given back", got)
		}
	})
}

func TestLastRetryableResponseReturnedWhenAttemptsRunOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(409))
		tr.Policy.MaxAttempts = 3
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 409 || rec.attempts() != 3 {
			t.Fatalf("got %v, %v after %d; want the last 409 with a nil error after 3", resp, err, rec.attempts())
		}
		if rec.closed[2].closed || !rec.closed[0].closed || !rec.closed[1].closed {
			t.Fatalf("want superseded bodies closed and the returned one open")
		}
		if r, _ := jar.Get(ctx, "op"); r.State != idem.StatePending {
			t.Fatalf("state %q; want pending", r.State)
		}
	})
}

// TestContextDoneBeforeTheCall: a call whose context is already done
// returns the context's error, not a body error, reads and sends nothing,
// and leaves the operation as the jar has it.
func TestContextDoneBeforeTheCall(t *testing.T) {
	tr, rec, jar := newTransport(t, netErr(syscall.ECONNREFUSED))
	tr.Policy.MaxAttempts = 1
	ctx := idem.WithOperation(context.Background(), "op")
	if _, err := post(t, ctx, tr, `{}`); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want pending", err)
	}
	before, _ := jar.Get(ctx, "op")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := post(t, cancelled, tr, `{}`)
	if !errors.Is(err, context.Canceled) || errors.Is(err, idem.ErrRequestBody) || rec.attempts() != 1 {
		t.Fatalf("got %v after %d attempts; want context.Canceled (not a body error), nothing sent", err, rec.attempts())
	}
	if after, _ := jar.Get(ctx, "op"); after.State != idem.StatePending || after.Attempts != before.Attempts || after.Updated != before.Updated {
		t.Fatalf("record %+v; want it unchanged: %+v", after, before)
	}
}

// TestContextDoneBeforeTheCallKeepsItsCause: the error of a context done
// before the call matches its cause, as the error of one cancelled during
// the call does.
func TestContextDoneBeforeTheCallKeepsItsCause(t *testing.T) {
	tr, rec, _ := newTransport(t, status(201))
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(idem.WithOperation(context.Background(), "op"))
	cancel(cause)
	_, err := post(t, ctx, tr, `{}`)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || rec.attempts() != 0 {
		t.Fatalf("got %v after %d attempts; want an error matching context.Canceled and its cause, nothing sent", err, rec.attempts())
	}
}

func TestCancelledContextStopsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(503, "Retry-After", "20"), status(201))
		ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
		go func() {
			time.Sleep(5 * time.Second)
			cancel()
		}()
		_, err := post(t, ctx, tr, `{}`)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, idem.ErrPending) || rec.attempts() != 1 {
			t.Fatalf("got %v after %d attempts; want a pending error matching context.Canceled after 1", err, rec.attempts())
		}
		if r, _ := jar.Get(context.Background(), "op"); r.State != idem.StatePending || r.Holder != "" {
			t.Fatalf("record %+v; want pending, lease released", r)
		}
	})
}

func TestAttemptTimeoutRetriesAndBodyStaysReadable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n int
		tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: retry.Policy{AttemptTimeout: time.Second, InitialInterval: time.Millisecond}}
		tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			n++
			if n == 1 {
				<-r.Context().Done() // a server that never answers
				return nil, r.Context().Err()
			}
			go func() {
				time.Sleep(2 * time.Second) // longer than the attempt timeout
			}()
			return &http.Response{StatusCode: 201, Body: io.NopCloser(&ctxReader{ctx: r.Context(), data: "ok"}), Header: http.Header{}}, nil
		})
		resp, err := post(t, context.Background(), tr, `{}`)
		if err != nil || n != 2 {
			t.Fatalf("got %v after %d attempts; want a response after 2", err, n)
		}
		time.Sleep(3 * time.Second)
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "ok" {
			t.Fatalf("reading the body after the attempt timeout: %q, %v; want ok", b, err)
		}
		resp.Body.Close()
	})
}

// ctxReader fails once its attempt's context is done, as a real response
// body does when its request is cancelled.
type ctxReader struct {
	ctx  context.Context
	data string
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	if r.data == "" {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestLeaseHeldElsewhereWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Policy.MaxElapsed = 10 * time.Second
		ctx := idem.WithOperation(context.Background(), "op")
		// Another process created the operation and holds its lease for 5s.
		now := time.Now()
		fp := fingerprintOf(t, `{}`)
		if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k-other", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: now, Updated: now, Holder: "other", LeaseUntil: now.Add(5 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v, %v; want 201 once the lease expired", resp, err)
		}
		if rec.keys[0] != "k-other" || time.Since(now) < 5*time.Second {
			t.Fatalf("sent key %q after %v; want k-other, not before the lease ended (5s)", rec.keys[0], time.Since(now))
		}

		// A lease longer than the budget: pending, nothing sent.
		if _, _, err := jar.Begin(ctx, idem.Record{Op: "op2", Key: "k2", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: time.Now(), Holder: "other", LeaseUntil: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		_, err = post(t, idem.WithOperation(context.Background(), "op2"), tr, `{}`)
		if !errors.Is(err, idem.ErrLeased) || !errors.Is(err, idem.ErrPending) || rec.attempts() != 1 {
			t.Fatalf("got %v after %d attempts; want pending with ErrLeased, nothing sent", err, rec.attempts())
		}
	})
}

// TestLeaseRenewedAfterStoredNextAttempt: a call that waits for a stored
// NextAttempt longer than its lease takes the lease again before it sends,
// so that a holder that took the operation meanwhile is not joined.
func TestLeaseRenewedAfterStoredNextAttempt(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Lease = 5 * time.Second
		ctx := idem.WithOperation(context.Background(), "op")
		now := time.Now()
		// An earlier call got Retry-After: 20 and released the lease.
		if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: now, Updated: now, Attempts: 1, LastStatus: 503, NextAttempt: now.Add(20 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		// Another holder takes the operation once this call's lease ran out.
		_, _, err := postWhileTaken(t, ctx, tr, jar, 10*time.Second, time.Minute)
		if !errors.Is(err, idem.ErrLeased) || rec.attempts() != 0 {
			t.Fatalf("got %v after %d sends; want pending with ErrLeased and nothing sent while another holder has the lease", err, rec.attempts())
		}
	})
}

// stallingJar is a MemoryJar whose first Update that counts an attempt
// stalls past the lease (a pause of the process, a slow jar), while another
// holder takes the operation's lease, which it then keeps for ttl.
type stallingJar struct {
	*idem.MemoryJar
	stalled bool
	otherAt time.Time // when the other holder took the lease
}

func (j *stallingJar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	if c.Attempts == 1 && !j.stalled {
		j.stalled = true
		time.Sleep(2 * time.Minute) // synctest's clock
		j.otherAt = time.Now()
		if _, err := j.MemoryJar.Acquire(ctx, op, "other", j.otherAt, time.Minute); err != nil {
			return idem.Record{}, err
		}
	}
	return j.MemoryJar.Update(ctx, op, holder, c)
}

// TestLeaseLostWhileCountingAnAttempt: a call that stalls as it counts an
// attempt, past its lease, while another holder takes the operation, is
// told so by the jar (ErrLeaseLost): it does not send, but waits for the
// lease as before any attempt, and sends once the other holder's lease
// ended: never two holders at once.
func TestLeaseLostWhileCountingAnAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent []time.Time
		rec := &recorder{script: []func() (*http.Response, error){status(503), status(201)}}
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, time.Now())
			return rec.respond(r)
		})
		jar := &stallingJar{MemoryJar: &idem.MemoryJar{}}
		tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{InitialInterval: time.Second, MaxElapsed: 10 * time.Minute}}
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil {
			t.Fatalf("got %v; want the 201 once the other holder's lease ended", err)
		}
		resp.Body.Close()
		if len(sent) != 2 || sent[1].Before(jar.otherAt.Add(time.Minute)) || rec.keys[1] != rec.keys[0] {
			t.Fatalf("sent %d times, the second at %v, keys %q; want 2 sends under one key, the second not before the other holder's lease ended (%v)",
				len(sent), sent[len(sent)-1].Sub(jar.otherAt), rec.keys, time.Minute)
		}
	})
}

// postWhileTaken posts {} while another holder takes the lease of "op",
// for ttl, after the given time, and returns the record that holder got
// and the call's answer.
func postWhileTaken(t *testing.T, ctx context.Context, tr *idem.Transport, jar *idem.MemoryJar, after, ttl time.Duration) (idem.Record, *http.Response, error) {
	t.Helper()
	var other idem.Record
	var otherErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(after)
		other, otherErr = jar.Acquire(context.Background(), "op", "other", time.Now(), ttl)
	})
	resp, err := post(t, ctx, tr, `{}`)
	wg.Wait()
	if otherErr != nil {
		t.Fatalf("the other holder could not take the expired lease: %v", otherErr)
	}
	return other, resp, err
}

// unrenewableJar is a MemoryJar whose Acquire fails, as a jar that is
// down does: a call's lease is not renewed while its attempt runs.
type unrenewableJar struct{ *idem.MemoryJar }

func (unrenewableJar) Acquire(context.Context, string, string, time.Time, time.Duration) (idem.Record, error) {
	return idem.Record{}, errors.New("jar unreachable")
}

// TestLateOutcomeFenced: a call whose attempt outlasted its lease, which
// it could not renew (the jar refused) and another holder took meanwhile,
// changes nothing in the record when its answer comes, neither a final one
// nor a give-up: the other holder keeps its lease, as a stalled worker's
// save and release are fenced on the server. Through a Deferrer and
// through a plain Jar.
func TestLateOutcomeFenced(t *testing.T) {
	for _, deferrer := range []bool{true, false} {
		for _, code := range []int{http.StatusCreated, http.StatusServiceUnavailable} {
			t.Run(fmt.Sprintf("deferrer=%v/%d", deferrer, code), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					mem := &idem.MemoryJar{}
					var jar idem.Jar = unrenewableJar{mem}
					if !deferrer {
						jar = struct{ idem.Jar }{jar} // no Defer method
					}
					base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
						time.Sleep(10 * time.Second) // past the 5 s lease
						return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
					})
					tr := &idem.Transport{Base: base, Jar: jar, Lease: 5 * time.Second, Policy: retry.Policy{MaxAttempts: 1}}
					ctx := idem.WithOperation(context.Background(), "op")
					other, resp, err := postWhileTaken(t, ctx, tr, mem, 6*time.Second, time.Hour)
					if err != nil || resp.StatusCode != code {
						t.Fatalf("got %v, %v; want the %d", resp, err, code)
					}
					if r, _ := mem.Get(ctx, "op"); r.Holder != "other" || !r.LeaseUntil.Equal(other.LeaseUntil) || r.State != idem.StatePending || r.LastStatus != 0 {
						t.Fatalf("record %+v; want it as the other holder took it: pending, its lease, no status", r)
					}
				})
			})
		}
	}
}

// TestAbandonedWhileWaiting: a call that waited for another holder's lease
// sends nothing when, meanwhile, the operation was abandoned (ErrAbandoned),
// or abandoned and begun again under a new key (*MismatchError): its key
// is no longer the operation's; or settled by that holder and pruned: an
// error matching ErrNotFound that says a call under its name begins it
// anew under a new key, not a *JarError, which says the jar failed.
func TestAbandonedWhileWaiting(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, then := range []string{"abandoned", "begun again", "pruned"} {
		t.Run(then, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(201))
				tr.Policy.MaxElapsed = time.Minute
				ctx := idem.WithOperation(context.Background(), "op")
				heldElsewhere(t, jar, fp)
				var wg sync.WaitGroup
				wg.Go(func() {
					time.Sleep(2 * time.Second) // the call waits for the lease meanwhile
					st := idem.StateAbandoned
					if then == "pruned" {
						st = idem.StateDone
					}
					if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: st, Release: true}); err != nil {
						t.Error(err)
					}
					switch then {
					case "begun again":
						if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k2", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
							Created: time.Now(), Holder: "new", LeaseUntil: time.Now().Add(time.Hour)}); err != nil {
							t.Error(err)
						}
					case "pruned":
						if n, err := jar.Prune(ctx, time.Now().Add(time.Second), 0); n != 1 || err != nil {
							t.Errorf("Prune = %d, %v; want the done operation pruned", n, err)
						}
					}
				})
				_, err := post(t, ctx, tr, `{}`)
				wg.Wait()
				want := map[string]error{"abandoned": idem.ErrAbandoned, "begun again": idem.ErrMismatch, "pruned": idem.ErrNotFound}[then]
				var je *idem.JarError
				if !errors.Is(err, want) || errors.As(err, &je) || rec.attempts() != 0 {
					t.Fatalf("got %v after %d sends; want %v, no *JarError, nothing sent", err, rec.attempts(), want)
				}
				switch r, err := jar.Get(ctx, "op"); then {
				case "abandoned":
					if r.State != idem.StateAbandoned || r.Holder != "" {
						t.Fatalf("record %s held by %q; want abandoned, its lease given back", r.State, r.Holder)
					}
				case "pruned":
					if !errors.Is(err, idem.ErrNotFound) {
						t.Fatalf("record %+v, %v after the call; want none", r, err)
					}
				}
			})
		})
	}
}

// TestResumeSettledWhileWaiting: a resume (client.Resume marks its call)
// that waited for another holder's lease sends nothing when that holder
// settled the operation meanwhile: a *resume.StateError with the state,
// and the lease it took given back. An ordinary call sends a done or failed
// operation again, for the server's saved answer.
func TestResumeSettledWhileWaiting(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, st := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateAbandoned} {
		for _, resuming := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/resume=%v", st, resuming), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					tr, rec, jar := newTransport(t, status(201))
					tr.Policy.MaxElapsed = time.Minute
					ctx := idem.WithOperation(context.Background(), "op")
					if resuming {
						ctx = resume.Mark(ctx, "k1")
					}
					heldElsewhere(t, jar, fp)
					var wg sync.WaitGroup
					wg.Go(func() {
						time.Sleep(2 * time.Second) // the call waits for the lease meanwhile
						if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: st, Release: true}); err != nil {
							t.Error(err)
						}
					})
					resp, err := post(t, ctx, tr, `{}`)
					wg.Wait()
					if resp != nil {
						resp.Body.Close()
					}
					var se *resume.StateError
					switch {
					case resuming:
						if !errors.As(err, &se) || se.State != string(st) || rec.attempts() != 0 {
							t.Fatalf("got %v after %d sends; want a *resume.StateError saying %s, nothing sent", err, rec.attempts(), st)
						}
					case st == idem.StateAbandoned:
						if !errors.Is(err, idem.ErrAbandoned) || rec.attempts() != 0 {
							t.Fatalf("got %v after %d sends; want ErrAbandoned, nothing sent", err, rec.attempts())
						}
					default:
						if err != nil || rec.attempts() != 1 {
							t.Fatalf("got %v after %d sends; want the answer to one send", err, rec.attempts())
						}
					}
					if r, _ := jar.Get(ctx, "op"); r.Holder != "" || r.State != st && resuming {
						t.Fatalf("record %s held by %q; want %s, its lease given back", r.State, r.Holder, st)
					}
				})
			})
		}
	}
}

// slowAcquireJar takes two seconds to answer Acquire, as a busy database
// jar may.
type slowAcquireJar struct{ *idem.MemoryJar }

func (j slowAcquireJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return idem.Record{}, ctx.Err()
	}
	return j.MemoryJar.Acquire(ctx, op, holder, now, ttl)
}

// TestContextEndingInAcquireLeavesPending: the caller's deadline passing
// while the jar takes the lease of a pending operation is the caller's
// context ending, not a jar failure: a *PendingError.
func TestContextEndingInAcquireLeavesPending(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mj := newTransport(t, status(201))
		tr.Jar = slowAcquireJar{mj}
		now := time.Now()
		if _, _, err := mj.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: now, Updated: now, Attempts: 1, LastError: "connection reset by peer"}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op"), time.Second)
		defer cancel()
		_, err := post(t, ctx, tr, `{}`)
		var je *idem.JarError
		if !errors.Is(err, idem.ErrPending) || !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &je) || rec.attempts() != 0 {
			t.Fatalf("got %T %v after %d sends; want a *PendingError wrapping the deadline, nothing sent", err, err, rec.attempts())
		}
	})
}

// TestWaitsForALeaseEndingWithinTheBudget: with the default policy, a call
// that finds the operation leased by a live holder elsewhere until just
// before its budget ends waits for the lease's end and sends, rather than
// give up when its next backoff interval would pass the budget: a lease
// and a budget of a minute each is the default, and the lease of a holder
// killed on another host has less than that left.
func TestWaitsForALeaseEndingWithinTheBudget(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Policy = retry.Policy{} // MaxElapsed 1 min, intervals up to 10 s
		start := time.Now()
		const left = 59 * time.Second
		if _, _, err := jar.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: start, Updated: start, Attempts: 1, Holder: "other", LeaseUntil: start.Add(left)}); err != nil {
			t.Fatal(err)
		}
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil || resp.StatusCode != 201 || rec.attempts() != 1 {
			t.Fatalf("after %v: %v, %d sends; want the lease waited out and the operation sent once", time.Since(start), err, rec.attempts())
		}
		resp.Body.Close()
		if took := time.Since(start); took != left {
			t.Fatalf("sent after %v; want at the lease's end, %v", took, left)
		}
	})
}

// heldElsewhere puts in jar the operation "op", key k1 and fingerprint fp,
// pending after one attempt, leased by another holder for an hour.
func heldElsewhere(t *testing.T, jar *idem.MemoryJar, fp string) {
	t.Helper()
	now := time.Now()
	if _, _, err := jar.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
		Created: now, Updated: now, Attempts: 1, Holder: "other", LeaseUntil: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
}

// fingerprintOf learns the fingerprint the transport computes for a POST of
// body to chargeURL, from what it stores.
func fingerprintOf(t *testing.T, body string) string {
	t.Helper()
	tr, _, jar := newTransport(t, status(201))
	if _, err := post(t, idem.WithOperation(context.Background(), "probe"), tr, body); err != nil {
		t.Fatal(err)
	}
	r, err := jar.Get(context.Background(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	return r.Fingerprint
}

func TestSecretHeadersNotStored(t *testing.T) {
	tr, _, jar := newTransport(t, status(201))
	req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer sk_live_secret")
	req.Header.Set("Cookie", "session=abc")
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Request-Source", "test")
	req = req.WithContext(idem.WithOperation(req.Context(), "op"))
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	r, _ := jar.Get(context.Background(), "op")
	for _, h := range []string{"Authorization", "Cookie", "X-Api-Key"} {
		if r.Header.Get(h) != "" {
			t.Errorf("jar stored %s", h)
		}
	}
	if r.Header.Get("X-Request-Source") != "test" || string(r.Body) != `{}` || r.Method != "POST" || r.URL != chargeURL {
		t.Errorf("record %+v; want the non-secret request stored for resume", r)
	}
}

// headerJar is a Jar that keeps what Begin is given, as the Jar contract
// allows: only its caller strips credentials. It records each header Begin
// got.
type headerJar struct {
	*idem.MemoryJar
	got []http.Header
}

func (j *headerJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	j.got = append(j.got, r.Header.Clone())
	return j.MemoryJar.Begin(ctx, r)
}

// The Transport strips credentials itself before Begin: a jar that keeps
// the header it is given, which the Jar contract allows, gets none of what
// SecretHeader names.
func TestSecretHeadersNeverGivenToTheJar(t *testing.T) {
	jar := &headerJar{MemoryJar: &idem.MemoryJar{}}
	tr, _, _ := newTransport(t, status(201))
	tr.Jar = jar
	req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer sk_live_secret")
	req.Header.Set("Cookie", "session=abc")
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Request-Source", "test")
	resp, err := tr.RoundTrip(req.WithContext(idem.WithOperation(req.Context(), "op")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(jar.got) != 1 {
		t.Fatalf("Begin called %d times; want 1", len(jar.got))
	}
	for name, vs := range jar.got[0] {
		if idem.SecretHeader(name) && len(vs) > 0 {
			t.Errorf("Begin got the header %s: %q; want no credential given to the jar", name, vs)
		}
	}
	want := []string{"Authorization", "Cookie", "X-Api-Key"}
	if got := (idem.Record{Header: jar.got[0]}).Withheld(); !slices.Equal(got, want) {
		t.Errorf("Begin got the header %v, which withholds %q; want the credentials' names kept, %q", jar.got[0], got, want)
	}
	if jar.got[0].Get("X-Request-Source") != "test" {
		t.Errorf("Begin got the header %v; want the non-secret header kept", jar.got[0])
	}
}

// TestURLCredentialsNotStored: the userinfo of a URL, which net/http sends
// as Basic credentials, is sent but neither stored nor fingerprinted.
func TestURLCredentialsNotStored(t *testing.T) {
	jar := &idem.MemoryJar{}
	var sent string
	tr := &idem.Transport{Jar: jar, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r.URL.User.String()
		return httpmock.NewStringResponse(201, "{}"), nil
	})}
	ctx := idem.WithOperation(context.Background(), "op")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://alice:s3cret@api.example.test/v1/charges?x=1", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r, _ := jar.Get(ctx, "op")
	if sent != "alice:s3cret" || r.URL != "http://api.example.test/v1/charges?x=1" {
		t.Fatalf("sent userinfo %q, stored URL %q; want the credentials sent and the URL stored without them", sent, r.URL)
	}
	// The request rebuilt from the record (as client.Resume does) has the
	// same fingerprint.
	req, _ = http.NewRequest(http.MethodPost, r.URL, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req = req.WithContext(ctx)
	if resp, err := tr.RoundTrip(req); err != nil {
		t.Fatalf("the stored request sent again: %v; want the same operation", err)
	} else {
		resp.Body.Close()
	}
}

// TestStoredHeader: the key the caller set is not stored with the request
// (it is the record's Key), and the stored header is the jar's copy, which
// a later change to the request's header does not reach.
func TestStoredHeader(t *testing.T) {
	for _, key := range []string{"", "caller-key-1"} {
		tr, _, jar := newTransport(t, status(201))
		req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{}`))
		req.Header.Set("X-Request-Source", "test")
		if key != "" {
			req.Header.Set(idem.KeyHeader, key)
		}
		req = req.WithContext(idem.WithOperation(req.Context(), "op"))
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Source", "changed")
		r, _ := jar.Get(context.Background(), "op")
		if r.Header.Get(idem.KeyHeader) != "" || r.Header.Get("X-Request-Source") != "test" || (key != "" && r.Key != key) {
			t.Errorf("caller key %q: stored key %q, header %v; want no key header, X-Request-Source: test", key, r.Key, r.Header)
		}
	}
}

func TestConcurrentOperationsGetDistinctKeys(t *testing.T) {
	tr, rec, _ := newTransport(t, status(201))
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := post(t, context.Background(), tr, `{"i":`+string(rune('0'+i%10))+`}`)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, k := range rec.keys {
		seen[k] = true
	}
	if len(rec.keys) != 32 || len(seen) != 32 {
		t.Fatalf("%d attempts with %d distinct keys; want 32 and 32", len(rec.keys), len(seen))
	}
}

// TestLastErrorStorable: a base transport's error message with a NUL byte
// or bytes that are not UTF-8 is stored as valid UTF-8, which every jar can
// hold.
func TestLastErrorStorable(t *testing.T) {
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: errors.New("bad header \"caf\xe9\x00\"")}
	})}
	ctx := idem.WithOperation(context.Background(), "op")
	if _, err := post(t, ctx, tr, `{}`); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("got %v; want pending", err)
	}
	r, _ := jar.Get(ctx, "op")
	if !utf8.ValidString(r.LastError) || strings.Contains(r.LastError, "\x00") || !strings.Contains(r.LastError, "bad header \"caf\uFFFD\uFFFD\"") {
		t.Fatalf("LastError %q; want the message as valid UTF-8, without NUL", r.LastError)
	}
}

// TestLastErrorHidesURLPasswords: a base transport's error that quotes a
// URL with its password (net/http's for a malformed HTTPS_PROXY, a
// *url.Error of a transport that does not mask it) is stored as LastError
// and logged with the password masked, as url.URL.Redacted masks it (and
// the user name, where an API key stands there with no password); the
// call returns the base's error itself, for errors.Is and errors.As, in a
// *PendingError whose message masks it too, as a program prints it.
func TestLastErrorHidesURLPasswords(t *testing.T) {
	const pw = "s3cretPW"
	proxy := "http://ops:" + pw + "%zz@proxy.internal:3128"
	for _, tc := range []struct {
		baseErr error
		secret  string
		want    string
	}{
		// As net/http words it, url.Parse's error after its own.
		{fmt.Errorf(`invalid proxy address %q: parse %q: invalid URL escape "%%zz"`, proxy, proxy), pw, "ops:xxxxx@"},
		{&url.Error{Op: "Post", URL: "https://ops:" + pw + "@api.example.test/v1/charges", Err: io.ErrUnexpectedEOF}, pw, "ops:xxxxx@"},
		// An API key as the user name, its password empty, as http.Client
		// quotes it (*** for the empty password): the user name is masked.
		{&url.Error{Op: "Post", URL: "https://sk_live_4f1d9a:***@api.example.test/v1/charges", Err: io.ErrUnexpectedEOF}, "sk_live_4f1d9a", "//xxxxx:xxxxx@"},
		{&url.Error{Op: "Post", URL: "https://ghp_4f1d9a@api.example.test/v1/charges", Err: io.ErrUnexpectedEOF}, "ghp_4f1d9a", "//xxxxx@"},
	} {
		baseErr, pw := tc.baseErr, tc.secret
		var logs bytes.Buffer
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1},
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Base:   roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, baseErr })}
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := post(t, ctx, tr, `{}`)
		if !errors.Is(err, idem.ErrPending) || !errors.Is(err, baseErr) {
			t.Fatalf("got %v; want pending, wrapping the base's error", err)
		}
		if strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the call's error %q; want the URL's secret masked in its message, %s", err, tc.want)
		}
		r, _ := jar.Get(ctx, "op")
		if strings.Contains(r.LastError, pw) || !strings.Contains(r.LastError, tc.want) {
			t.Errorf("LastError %q; want the URL's secret masked, %s", r.LastError, tc.want)
		}
		if strings.Contains(logs.String(), pw) || !strings.Contains(logs.String(), tc.want) {
			t.Errorf("logged:\n%s\nwant the URL's secret masked, %s", logs.String(), tc.want)
		}
	}
}

// TestLastErrorHidesQuerySecrets: a base transport's error that quotes the
// request's URL whole, as net/http's *url.Error does, is stored as
// LastError, logged and put in the *PendingError's message with the values
// of the query's secret parameters masked (an API key, an access token, a
// presigned URL's signature), the others as they are.
func TestLastErrorHidesQuerySecrets(t *testing.T) {
	const secret = "s3cretQS"
	var logs bytes.Buffer
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return nil, &url.Error{Op: "Post", URL: r.URL.String(), Err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")}
		})}
	ctx := idem.WithOperation(context.Background(), "op")
	u := chargeURL + "?api_key=" + secret + "&order=o1&access_token=" + secret + "&X-Amz-Signature=" + secret
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(`{}`))
	_, err := tr.RoundTrip(req)
	var pe *idem.PendingError
	if !errors.As(err, &pe) {
		t.Fatalf("got %v; want a *PendingError", err)
	}
	r, _ := jar.Get(ctx, "op")
	const want = "?api_key=xxxxx&order=o1&access_token=xxxxx&X-Amz-Signature=xxxxx"
	for _, msg := range []string{err.Error(), r.LastError, logs.String()} {
		if strings.Contains(msg, secret) || !strings.Contains(msg, want) {
			t.Errorf("%q; want the query's secrets masked, %s", msg, want)
		}
	}
}

// TestStoredLastErrorMasked: a LastError that an earlier version stored
// with a password in it, as the call's last error when it stops before
// sending (the server asked for a wait longer than MaxRetryAfter), is
// masked in the *PendingError, in the error it wraps, in OnGiveUp's
// Event and in the log: it comes back as a message, with nothing of its
// own to unwrap.
func TestStoredLastErrorMasked(t *testing.T) {
	const pw = "s3cretPW"
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		var logs bytes.Buffer
		tr.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var gaveUp []error
		tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Err) }
		now := time.Now()
		stored := `Post "https://ops:` + pw + `@api.example.test/v1/charges": EOF`
		if _, _, err := jar.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
			Created: now, Updated: now, Attempts: 1, LastError: stored, NextAttempt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		_, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || pe.Err == nil || rec.attempts() != 0 {
			t.Fatalf("got %T %v after %d sends; want a *PendingError with the stored error, nothing sent", err, err, rec.attempts())
		}
		if len(gaveUp) != 1 || gaveUp[0] == nil {
			t.Fatalf("OnGiveUp got %v; want the stored error once", gaveUp)
		}
		for _, msg := range []string{err.Error(), pe.Err.Error(), gaveUp[0].Error(), logs.String()} {
			if strings.Contains(msg, pw) || !strings.Contains(msg, "ops:xxxxx@") {
				t.Errorf("%q; want the stored URL's password masked, ops:xxxxx@", msg)
			}
		}
	})
}

// TestStoredLastErrorMaskedWhenWrittenBack: a LastError that an earlier
// version stored with a password in it is masked the first time a call
// writes the record again, also where it only gives a lease back and
// leaves the rest as it was: the release of a killed holder's lease, and
// that of a lease a resume took on an operation settled meanwhile.
func TestStoredLastErrorMaskedWhenWrittenBack(t *testing.T) {
	const pw = "s3cretPW"
	stored := `Post "https://ops:` + pw + `@api.example.test/v1/charges": EOF`
	fp := fingerprintOf(t, `{}`)
	holder, err := idem.NewHolder()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := strings.Cut(holder, "/")
	for _, tt := range []struct {
		name  string
		state idem.State
		ctx   func(context.Context) context.Context
		gone  bool // leased to a process that is gone
	}{
		{"killed holder's lease", idem.StatePending, func(ctx context.Context) context.Context { return idem.WithOperation(ctx, "op") }, true},
		{"resume of a settled operation", idem.StateDone, func(ctx context.Context) context.Context { return resume.Mark(idem.WithOperation(ctx, "op"), "k1") }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: tt.state, Method: http.MethodPost, URL: chargeURL,
				Created: time.Now(), Updated: time.Now(), Attempts: 1, LastError: stored}
			if tt.gone {
				if runtime.GOOS == "windows" {
					t.Skip("process liveness is not checked on windows: leases are waited out")
				}
				child := exec.Command(os.Args[0], "-test.run=^$")
				if err := child.Run(); err != nil {
					t.Fatal(err)
				}
				r.Holder, r.LeaseUntil = fmt.Sprintf("%s/%d/x.1", host, child.ProcessState.Pid()), time.Now().Add(time.Hour)
			}
			tr, _, mem := newTransport(t, status(201))
			jar := &heldJar{MemoryJar: mem}
			tr.Jar = jar
			if _, _, err := mem.Begin(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			resp, _ := post(t, tt.ctx(context.Background()), tr, `{}`)
			if resp != nil {
				resp.Body.Close()
			}
			jar.flush()
			written := append(jar.updated, jar.deferred...)
			if len(written) == 0 {
				t.Fatal("the call wrote nothing to the jar; want the lease given back at least")
			}
			for i, c := range written {
				if strings.Contains(c.LastError, pw) {
					t.Errorf("change %d of %d: LastError %q; want the stored URL's password masked, ops:xxxxx@", i+1, len(written), c.LastError)
				}
			}
		})
	}
}

// TestBaseBreakingItsContract: a base transport that returns a response and
// an error gets the error (the response's body closed), and one that returns
// neither gets an error: the call is pending, never (nil, nil), never marked
// failed.
func TestBaseBreakingItsContract(t *testing.T) {
	for _, tt := range []struct {
		name string
		resp bool
		err  error
	}{
		{"response and error", true, errors.New("tls: bad certificate")},
		{"neither", false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			jar := &idem.MemoryJar{}
			var bodies []*closeTracker
			tr := &idem.Transport{Jar: jar, Policy: fastPolicy, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				if !tt.resp {
					return nil, tt.err
				}
				resp := httpmock.NewStringResponse(201, "{}")
				ct := &closeTracker{Reader: resp.Body}
				bodies = append(bodies, ct)
				resp.Body = ct
				return resp, tt.err
			})}
			ctx := idem.WithOperation(context.Background(), "op")
			resp, err := post(t, ctx, tr, `{}`)
			r, _ := jar.Get(ctx, "op")
			if resp != nil || !errors.Is(err, idem.ErrPending) || r.State != idem.StatePending {
				t.Fatalf("got %v, %v, record %s; want no response, a *PendingError, the operation pending", resp, err, r.State)
			}
			for i, b := range bodies {
				if !b.closed {
					t.Errorf("the body of response %d was not closed", i)
				}
			}
		})
	}
}

func TestCloseIdleConnectionsForwarded(t *testing.T) {
	b := &idleCounter{}
	(&idem.Transport{Base: b}).CloseIdleConnections()
	if b.n != 1 {
		t.Fatalf("CloseIdleConnections reached Base %d times; want 1", b.n)
	}
}

type idleCounter struct{ n int }

func (c *idleCounter) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("unused")
}
func (c *idleCounter) CloseIdleConnections() { c.n++ }

// A base transport may write to the header of the attempt it is given; the
// caller's header stays as it was, backing arrays included, and the next
// attempt starts again from the caller's header.
func TestBaseWritingHeaderLeavesCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen [][]string
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			seen = append(seen, r.Header.Values("X-Trace"))
			r.Header.Add("X-Trace", "from-base")
			r.Header.Set("Content-Type", "text/plain")
			r.Header.Set(idem.KeyHeader, "changed-by-base")
			code := http.StatusServiceUnavailable
			if len(seen) == 2 {
				code = http.StatusCreated
			}
			return &http.Response{StatusCode: code, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
		})
		tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: fastPolicy}
		req, _ := http.NewRequest(http.MethodPost, chargeURL, strings.NewReader(`{"a":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header["X-Trace"] = append(make([]string, 0, 4), "caller") // room to append in place
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("got %v, %v; want 201", resp, err)
		}
		for i, v := range seen {
			if len(v) != 1 || v[0] != "caller" {
				t.Errorf("attempt %d saw X-Trace %q; want the caller's only", i+1, v)
			}
		}
		if got := req.Header["X-Trace"][:2]; got[0] != "caller" || got[1] != "" {
			t.Errorf("caller's X-Trace backing array now %q; want [caller \"\"]", got)
		}
		if got := req.Header.Get("Content-Type"); got != "application/json" || req.Header.Get(idem.KeyHeader) != "" {
			t.Errorf("caller's header changed: %v", req.Header)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// endless is a body that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestEndlessBodyEndsWithTheContext(t *testing.T) {
	tr, rec, _ := newTransport(t, status(201))
	tr.MaxBuffer = 1024
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, nil)
	var reads atomic.Int64
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(readFunc(func(p []byte) (int, error) {
			switch reads.Add(1) {
			case 100:
				cancel() // the caller gives up while the body is being hashed
			case 1000:
				return 0, io.EOF // bounded, so that a regression fails instead of hanging
			}
			return endless{}.Read(p)
		})), nil
	}
	req.Body, _ = req.GetBody()
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, context.Canceled) || rec.attempts() != 0 || reads.Load() >= 1000 {
		t.Fatalf("got %v after %d sends and %d reads; want context.Canceled, nothing sent, reading stopped", err, rec.attempts(), reads.Load())
	}
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// TestStalledBodyEndsWithTheContext: a body whose Read blocks (a pipe whose
// writer stalls) is read before anything is sent; the call ends with its
// context all the same, as it does through http.Transport, rather than wait
// in that Read for as long as the body stalls.
func TestStalledBodyEndsWithTheContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		getBody bool
		head    int // bytes the body gives before it stalls
	}{
		{"buffered", false, 10},
		{"GetBody", true, 10},
		{"GetBody past MaxBuffer", true, 2048},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, _ := newTransport(t, status(201))
				tr.MaxBuffer = 1024
				pr, pw := io.Pipe()
				defer pw.CloseWithError(errors.New("test over")) // frees a Read still blocked
				go func() { _, _ = pw.Write(make([]byte, tc.head)) }()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, pr)
				if tc.getBody {
					req.GetBody = func() (io.ReadCloser, error) { return pr, nil }
				}
				done := make(chan error, 1)
				go func() {
					_, err := tr.RoundTrip(req)
					done <- err
				}()
				select {
				case err := <-done:
					if !errors.Is(err, context.DeadlineExceeded) || rec.attempts() != 0 {
						t.Errorf("got %v after %d sends; want context.DeadlineExceeded, nothing sent", err, rec.attempts())
					}
				case <-time.After(time.Minute):
					t.Errorf("RoundTrip still reads the body a minute after its context ended")
				}
			})
		})
	}
}

// jsonHeader is the header a record keeps of a request post sends.
func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

// TestLeaseRenewedWhileAttemptRuns: an attempt that runs longer than the
// lease (no AttemptTimeout, or one longer than half the lease) keeps it,
// renewed every half lease: another holder (a resume, another process, an
// abandon) finds the operation leased throughout, not free once the first
// lease ends. Once the answer comes the lease is given back, and no
// renewal takes it again. Before, the other holder took it 7 s into a 5 s
// lease, and could send or abandon the operation while the first attempt
// still ran.
func TestLeaseRenewedWhileAttemptRuns(t *testing.T) {
	for _, timeout := range []time.Duration{0, 20 * time.Second} {
		t.Run(fmt.Sprintf("AttemptTimeout=%v", timeout), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				jar := &idem.MemoryJar{}
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					time.Sleep(12 * time.Second) // past the 5 s lease
					return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
				})
				tr := &idem.Transport{Base: base, Jar: jar, Lease: 5 * time.Second, Policy: retry.Policy{MaxAttempts: 1, AttemptTimeout: timeout}}
				start := time.Now()
				var taken []time.Duration
				var wg sync.WaitGroup
				wg.Go(func() {
					// At 1, 4, 7, 10 and 13 s: never when a lease ends
					// (5 s, then every 2.5 s as it is renewed).
					time.Sleep(time.Second)
					for range 5 {
						if _, err := jar.Acquire(context.Background(), "op", "other", time.Now(), time.Nanosecond); err == nil {
							taken = append(taken, time.Since(start))
						}
						time.Sleep(3 * time.Second)
					}
				})
				resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
				if err != nil || resp.StatusCode != 201 {
					t.Fatalf("got %v, %v; want the 201", resp, err)
				}
				wg.Wait()
				if len(taken) != 1 || taken[0] != 13*time.Second {
					t.Fatalf("the other holder took the lease at %v; want it leased until the answer came at 12 s, taken at 13 s", taken)
				}
				if r, _ := jar.Get(context.Background(), "op"); r.State != idem.StateDone {
					t.Fatalf("record %+v; want done", r)
				}
			})
		})
	}
}

// hangingAcquireJar is a MemoryJar whose Acquire waits for its context to
// end, as a jar on a database server that stopped answering does.
type hangingAcquireJar struct{ *idem.MemoryJar }

func (hangingAcquireJar) Acquire(ctx context.Context, _, _ string, _ time.Time, _ time.Duration) (idem.Record, error) {
	<-ctx.Done()
	return idem.Record{}, ctx.Err()
}

// TestLeaseRenewalDoesNotHoldTheAnswer: an answer that comes while a
// renewal of the lease waits for a jar that hangs is returned at once: the
// renewal is cancelled, not waited for until its own timeout (half the
// lease, 30 s here).
func TestLeaseRenewalDoesNotHoldTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			time.Sleep(40 * time.Second) // the renewal began at 30 s
			return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		tr := &idem.Transport{Base: base, Jar: hangingAcquireJar{&idem.MemoryJar{}}, Policy: retry.Policy{MaxAttempts: 1}}
		start := time.Now()
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v, %v; want the 201", resp, err)
		}
		if took := time.Since(start); took != 40*time.Second {
			t.Fatalf("the call returned after %v; want 40 s, when the answer came", took)
		}
	})
}
