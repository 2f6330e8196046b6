package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

func TestHooksAndLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		replayed := func() (*http.Response, error) {
			resp, _ := status(201)()
			resp.Header.Set("Idempotent-Replayed", "true")
			return resp, nil
		}
		tr, _, jar := newTransport(t, status(503, "Retry-After", "2"), netErr(syscall.ECONNRESET), replayed)
		var logs bytes.Buffer
		tr.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var attempts, replays, giveUps, reconciles []idem.Event
		var retries []idem.Event
		tr.Hooks = idem.Hooks{
			OnAttempt:   func(e idem.Event) { attempts = append(attempts, e) },
			OnRetry:     func(e idem.Event) { retries = append(retries, e) },
			OnGiveUp:    func(e idem.Event) { giveUps = append(giveUps, e) },
			OnReplay:    func(e idem.Event) { replays = append(replays, e) },
			OnReconcile: func(e idem.Event) { reconciles = append(reconciles, e) },
		}
		ctx := idem.WithOperation(context.Background(), "op")
		if _, err := post(t, ctx, tr, `{}`); err != nil {
			t.Fatal(err)
		}
		if len(attempts) != 3 || attempts[2].Attempt != 3 || attempts[0].Op != "op" || attempts[0].Key == "" {
			t.Fatalf("OnAttempt events %+v; want 3 numbered attempts with op and key", attempts)
		}
		if len(retries) != 2 || retries[0].Status != 503 || retries[0].Wait != 2*time.Second || retries[0].Reason != "status 503" ||
			retries[1].Reason != "network error" || retries[1].Err == nil {
			t.Fatalf("OnRetry events %+v; want a 503 with a 2s wait, then a network error", retries)
		}
		if len(replays) != 1 || replays[0].Status != 201 || len(giveUps) != 0 || len(reconciles) != 0 {
			t.Fatalf("replays %+v give-ups %+v reconciles %+v; want one replay only", replays, giveUps, reconciles)
		}
		for _, want := range []string{`level=INFO msg="idem: retrying"`, "status=503", "wait=2s", `level=DEBUG msg="idem: attempt"`} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs.String())
			}
		}

		// Give-up and reconcile.
		tr2, _, _ := newTransport(t, netErr(syscall.ECONNREFUSED))
		tr2.Jar = jar
		tr2.Policy.MaxAttempts = 2
		tr2.Hooks, tr2.Logger = tr.Hooks, tr.Logger
		if _, err := post(t, idem.WithOperation(context.Background(), "op2"), tr2, `{}`); err == nil {
			t.Fatal("want an error")
		}
		if len(giveUps) != 1 || giveUps[0].Op != "op2" || giveUps[0].Attempt != 2 {
			t.Fatalf("OnGiveUp events %+v; want one for op2 after 2 attempts", giveUps)
		}
		r, _ := jar.Get(ctx, "op2")
		backdate(t, jar, r, time.Now().Add(-25*time.Hour))
		if _, err := post(t, idem.WithOperation(context.Background(), "op2"), tr2, `{}`); err == nil {
			t.Fatal("want an error")
		}
		if len(reconciles) != 1 || reconciles[0].Op != "op2" {
			t.Fatalf("OnReconcile events %+v; want one for op2", reconciles)
		}
		// Marked StateReconcile already: the same error, and no event.
		_, err := post(t, idem.WithOperation(context.Background(), "op2"), tr2, `{}`)
		if re := (*idem.ReconcileError)(nil); !errors.As(err, &re) || re.State != idem.StateReconcile || len(reconciles) != 1 {
			t.Fatalf("a call on an operation marked reconcile: %v, %d OnReconcile events; want a *ReconcileError in StateReconcile, no new event", err, len(reconciles))
		}
		for _, want := range []string{`level=WARN msg="idem: giving up; operation stays pending" op=op2`, `level=WARN msg="idem: past the horizon; reconcile" op=op2`} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs.String())
			}
		}
	})
}

// releaseCounter is a MemoryJar that counts the changes that give a lease
// back, through Update and Defer.
type releaseCounter struct {
	*idem.MemoryJar
	releases atomic.Int32
}

func (j *releaseCounter) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	if c.Release {
		j.releases.Add(1)
	}
	return j.MemoryJar.Update(ctx, op, holder, c)
}

func (j *releaseCounter) Defer(op, holder string, c idem.Change) error {
	if c.Release {
		j.releases.Add(1)
	}
	return j.MemoryJar.Defer(op, holder, c)
}

// panicHandler is a slog.Handler that panics with v on the record whose
// message is msg.
type panicHandler struct {
	msg string
	v   any
}

func (h panicHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h panicHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		panic(h.v)
	}
	return nil
}
func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicHandler) WithGroup(string) slog.Handler      { return h }

// TestPanickingHook: a hook (or the Logger) that panics ends the call with
// its own panic, after the call gave its lease back, once, and closed the
// body of every response it was given: another call of the operation goes
// on at once, and an attempt counted but never sent is not counted.
func TestPanickingHook(t *testing.T) {
	replayed := func() (*http.Response, error) {
		resp, _ := status(201)()
		resp.Header.Set("Idempotent-Replayed", "true")
		return resp, nil
	}
	for _, c := range []struct {
		name        string
		steps       []func() (*http.Response, error)
		maxAttempts int
		past        bool // the operation is done and past its horizon
		// arm makes tr panic with v.
		arm func(tr *idem.Transport, v any)
		// What the call did before it panicked: the attempts Base saw,
		// the record's Attempts, State and LastStatus, and whether it
		// holds a NextAttempt.
		sent, attempts int
		state          idem.State
		lastStatus     int
		next           bool
	}{
		{
			name: "OnAttempt, first", steps: steps(status(201)),
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnAttempt = func(idem.Event) { panic(v) }
			},
			sent: 0, attempts: 0, state: idem.StatePending,
		},
		{
			name: "OnAttempt, second", steps: steps(status(503), status(201)),
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnAttempt = func(e idem.Event) {
					if e.Attempt == 2 {
						panic(v)
					}
				}
			},
			sent: 1, attempts: 1, state: idem.StatePending, lastStatus: 503,
		},
		{
			name: "OnReplay", steps: steps(replayed),
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnReplay = func(idem.Event) { panic(v) }
			},
			sent: 1, attempts: 1, state: idem.StatePending, lastStatus: 201,
		},
		{
			name: "OnRetry", steps: steps(status(503, "Retry-After", "2"), status(201)),
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnRetry = func(idem.Event) { panic(v) }
			},
			sent: 1, attempts: 1, state: idem.StatePending, lastStatus: 503, next: true,
		},
		{
			name: "Logger, retrying", steps: steps(status(503, "Retry-After", "2"), status(201)),
			arm: func(tr *idem.Transport, v any) {
				tr.Logger = slog.New(panicHandler{msg: "idem: retrying", v: v})
			},
			sent: 1, attempts: 1, state: idem.StatePending, lastStatus: 503, next: true,
		},
		{
			name: "OnGiveUp, last response", steps: steps(status(503, "Retry-After", "2")), maxAttempts: 1,
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnGiveUp = func(idem.Event) { panic(v) }
			},
			sent: 1, attempts: 1, state: idem.StatePending, lastStatus: 503, next: true,
		},
		{
			name: "OnGiveUp, no response", steps: steps(netErr(syscall.ECONNRESET)), maxAttempts: 1,
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnGiveUp = func(idem.Event) { panic(v) }
			},
			sent: 1, attempts: 1, state: idem.StatePending,
		},
		{
			name: "OnReconcile", steps: steps(status(201)), past: true,
			arm: func(tr *idem.Transport, v any) {
				tr.Hooks.OnReconcile = func(idem.Event) { panic(v) }
			},
			sent: 1, attempts: 1, state: idem.StateDone, lastStatus: 201,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, mem := newTransport(t, c.steps...)
				jar := &releaseCounter{MemoryJar: mem}
				tr.Jar = jar
				if c.maxAttempts != 0 {
					tr.Policy.MaxAttempts = c.maxAttempts
				}
				tr.Budget = &retry.Budget{}
				full := tr.Budget.Available()
				ctx := idem.WithOperation(context.Background(), "op")
				if c.past {
					resp, err := post(t, ctx, tr, `{}`)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					r, _ := jar.Get(ctx, "op")
					backdate(t, mem, r, time.Now().Add(-25*time.Hour))
					jar.releases.Store(0)
				}
				plain := *tr // the same Transport without the panicking hook

				v := &struct{ hook string }{c.name}
				c.arm(tr, v)
				func() {
					defer func() {
						if got := recover(); got != v {
							t.Errorf("RoundTrip panicked with %v; want the hook's %v", got, v)
						}
					}()
					resp, err := post(t, ctx, tr, `{}`)
					t.Errorf("RoundTrip returned %v, %v; want the hook's panic", resp, err)
				}()

				if got := rec.attempts(); got != c.sent {
					t.Errorf("Base saw %d attempts; want %d", got, c.sent)
				}
				for i, ct := range rec.closed {
					if !ct.closed {
						t.Errorf("response %d: body not closed", i+1)
					}
				}
				if got := jar.releases.Load(); got != 1 {
					t.Errorf("the call gave its lease back %d times; want once", got)
				}
				if got := tr.Budget.Available(); got != full {
					t.Errorf("Budget holds %d tokens; want %d: a retry paid for but never sent gives its cost back", got, full)
				}
				r, err := jar.Get(ctx, "op")
				if err != nil {
					t.Fatal(err)
				}
				if r.Holder != "" || !r.LeaseUntil.IsZero() {
					t.Errorf("lease held by %q until %v; want it free", r.Holder, r.LeaseUntil)
				}
				if r.Attempts != c.attempts || r.State != c.state || r.LastStatus != c.lastStatus || r.NextAttempt.IsZero() == c.next {
					t.Errorf("record: %d attempts, %s, last status %d, next attempt %v; want %d, %s, %d, next attempt %v",
						r.Attempts, r.State, r.LastStatus, r.NextAttempt, c.attempts, c.state, c.lastStatus, c.next)
				}

				// Another call of the operation does not wait for the
				// lease (a minute), at most for the server's Retry-After.
				start := time.Now()
				resp, err := post(t, ctx, &plain, `{}`)
				if resp != nil {
					resp.Body.Close()
				}
				if errors.Is(err, idem.ErrLeased) || time.Since(start) > 2*time.Second {
					t.Errorf("the next call ended after %v with %v; want no wait for a lease", time.Since(start), err)
				}
			})
		})
	}
}

func steps(s ...func() (*http.Response, error)) []func() (*http.Response, error) { return s }

// TestRetryEventOfANetworkError: the OnRetry event and the log record of
// an attempt that got no answer carry no status, although an earlier
// attempt of the call got one: Event.Status is the attempt's own.
func TestRetryEventOfANetworkError(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			w.Header().Set("Connection", "close") // the next attempt dials anew: net/http does not send it again
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close() // no answer
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	var logs bytes.Buffer
	var retries []idem.Event
	tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Hooks:  idem.Hooks{OnRetry: func(e idem.Event) { retries = append(retries, e) }}}
	resp, _, _ := postRead(t, idem.WithOperation(context.Background(), "op"), tr, srv.URL)
	if resp.StatusCode != http.StatusCreated || n.Load() != 3 {
		t.Fatalf("got %d after %d requests; want 201 after 3", resp.StatusCode, n.Load())
	}
	if len(retries) != 2 {
		t.Fatalf("OnRetry events %+v; want 2", retries)
	}
	if e := retries[0]; e.Attempt != 1 || e.Status != http.StatusServiceUnavailable || e.Err != nil || e.Reason != "status 503" {
		t.Errorf("first OnRetry event %+v; want attempt 1, status 503, no error", e)
	}
	if e := retries[1]; e.Attempt != 2 || e.Status != 0 || e.Err == nil || e.Reason != "network error" {
		t.Errorf("second OnRetry event %+v; want attempt 2, no status (the server did not answer), its error", e)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "status=503") || strings.Contains(lines[1], "status=") || !strings.Contains(lines[1], `reason="network error"`) {
		t.Errorf("log records:\n%s\nwant two retries, the second without a status", logs.String())
	}
}

// TestGiveUpOnRefusedCredentials: a 401 answer leaves a pending operation
// pending, a call that stops without a final answer: OnGiveUp runs once and
// the Logger warns, as for any other. It does not for an operation whose
// outcome is known, which the 401 leaves done.
func TestGiveUpOnRefusedCredentials(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	var logs bytes.Buffer
	var giveUps []idem.Event
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: fastPolicy, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Hooks: idem.Hooks{OnGiveUp: func(e idem.Event) { giveUps = append(giveUps, e) }}}
	ctx := idem.WithOperation(context.Background(), "op")
	for _, c := range []struct {
		token   string
		status  int
		state   idem.State
		giveUps int
	}{
		{"bad", http.StatusUnauthorized, idem.StatePending, 1},
		{"good", http.StatusCreated, idem.StateDone, 1},
		{"bad", http.StatusUnauthorized, idem.StateDone, 1},
	} {
		tr.Base = authBase{http.DefaultTransport, "Bearer " + c.token}
		resp, _, _ := postRead(t, ctx, tr, srv.URL)
		r, err := jar.Get(ctx, "op")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != c.status || r.State != c.state || len(giveUps) != c.giveUps {
			t.Fatalf("%s token: %d, operation %s, %d give-ups; want %d, %s, %d", c.token, resp.StatusCode, r.State, len(giveUps), c.status, c.state, c.giveUps)
		}
	}
	if e := giveUps[0]; e.Op != "op" || e.Attempt != 1 || e.Status != http.StatusUnauthorized || e.Reason != "credentials refused: status 401" {
		t.Errorf("OnGiveUp event %+v; want attempt 1, status 401, the credentials refused", e)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="idem: giving up; operation stays pending" op=op`); n != 1 {
		t.Errorf("%d give-up records; want 1:\n%s", n, logs.String())
	}
}

// authBase sends each request with its Authorization header set to auth.
type authBase struct {
	rt   http.RoundTripper
	auth string
}

func (b authBase) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", b.auth)
	return b.rt.RoundTrip(req)
}

// outcomeFailsJar fails every Update that records an outcome, as a jar
// closed under a running call does; it defers nothing.
type outcomeFailsJar struct{ idem.Jar }

var errJarClosed = errors.New("jar closed")

func (j outcomeFailsJar) Update(ctx context.Context, op, holder string, ch idem.Change) (idem.Record, error) {
	if ch.State != "" {
		return idem.Record{}, errJarClosed
	}
	return j.Jar.Update(ctx, op, holder, ch)
}

// TestLoggerSaysOutcomeNotRecorded: an outcome the jar fails to record
// (the call's answer still reaches its caller, and the operation stays
// pending) is logged at Warn with the jar's error, not dropped in silence.
func TestLoggerSaysOutcomeNotRecorded(t *testing.T) {
	tr, _, jar := newTransport(t, status(201))
	tr.Jar = outcomeFailsJar{jar}
	var logs bytes.Buffer
	tr.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("got %v, %v; want the 201", resp, err)
	}
	resp.Body.Close()
	if r, _ := jar.Get(context.Background(), "op"); r.State != idem.StatePending {
		t.Fatalf("operation %s; want it pending, its outcome not recorded", r.State)
	}
	want := `level=WARN msg="idem: the jar did not record the call's progress; the operation stays as the jar last recorded it" op=op`
	if !strings.Contains(logs.String(), want) || !strings.Contains(logs.String(), `err="jar closed"`) {
		t.Fatalf("log:\n%s\nwant a line %s with the jar's error", logs.String(), want)
	}
}

// TestLoggerSaysWhenACallWaits: a call that finds its operation leased by
// another holder alive (another process still sending it) waits for the
// lease, up to a minute by default, and one that finds a next attempt time
// a killed run stored (the server's Retry-After) waits for it, up to
// Policy.MaxRetryAfter. The Logger gets a record (Info) before each wait,
// with how long it waits, so that a program that seems hung says why. A
// Logger that panics on it ends the call, after it gave back a lease it
// held, nothing sent, and leaves another holder's lease alone.
func TestLoggerSaysWhenACallWaits(t *testing.T) {
	for _, c := range []struct {
		name, msg, reason string
		rec               func(now time.Time) idem.Record // the operation as another call left it
		holder            string                          // its holder after a Logger's panic
		also              string                          // more the record says
	}{
		{
			name: "lease", msg: "idem: waiting for another holder's lease", reason: "operation leased by another holder",
			rec: func(now time.Time) idem.Record {
				return idem.Record{Attempts: 1, Holder: "other", LeaseUntil: now.Add(5 * time.Second)}
			},
			holder: "other",
			// Whose lease, and until when (synctest's clock starts at
			// 2000-01-01 00:00:00 UTC).
			also: "holder=other lease_until=2000-01-01T00:00:05.000Z",
		},
		{
			name: "next attempt", msg: "idem: waiting for the operation's next attempt time", reason: "the server's Retry-After, stored in the jar",
			rec: func(now time.Time) idem.Record {
				return idem.Record{Attempts: 1, LastStatus: 503, NextAttempt: now.Add(5 * time.Second)}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, sent, jar := newTransport(t, status(201))
				var logs bytes.Buffer
				tr.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				begin := func(op string) context.Context {
					ctx := idem.WithOperation(context.Background(), op)
					r := c.rec(time.Now())
					r.Op, r.Key, r.Fingerprint, r.Header, r.State, r.Created, r.Updated = op, "k-"+op, fingerprintOf(t, `{}`), jsonHeader(), idem.StatePending, time.Now(), time.Now()
					if _, _, err := jar.Begin(ctx, r); err != nil {
						t.Fatal(err)
					}
					return ctx
				}
				ctx := begin("op")
				if resp, err := post(t, ctx, tr, `{}`); err != nil || resp.StatusCode != 201 || sent.attempts() != 1 {
					t.Fatalf("got %v, %v after %d attempts; want 201 after the wait", resp, err, sent.attempts())
				}
				var waited time.Duration
				for line := range strings.Lines(logs.String()) {
					if !strings.Contains(line, `msg="`+c.msg+`"`) {
						continue
					}
					if !strings.Contains(line, "level=INFO") || !strings.Contains(line, "op=op key=k-op") ||
						!strings.Contains(line, `reason="`+c.reason+`"`) || !strings.Contains(line, c.also) {
						t.Errorf("record %q; want Info, the operation, its key, why it waits and %q", line, c.also)
					}
					// A record leaves out a wait of zero, which full jitter
					// draws from fastPolicy's 1 ms interval about once in a
					// million waits: the sum below still catches a record
					// that leaves out a wait it sleeps.
					_, w, ok := strings.Cut(line, " wait=")
					if !ok {
						continue
					}
					w, _, _ = strings.Cut(w, " ")
					d, err := time.ParseDuration(w)
					if err != nil {
						t.Errorf("record %q: wait: %v", line, err)
					}
					waited += d
				}
				if waited != 5*time.Second {
					t.Errorf("the records' waits add up to %v; want 5 s; logs:\n%s", waited, logs.String())
				}

				ctx = begin("op2")
				tr.Logger = slog.New(panicHandler{msg: c.msg, v: "boom"})
				func() {
					defer func() {
						if v := recover(); v != "boom" {
							t.Errorf("recovered %v; want the Logger's panic", v)
						}
					}()
					_, _ = post(t, ctx, tr, `{}`)
				}()
				if r, err := jar.Get(ctx, "op2"); err != nil || r.Holder != c.holder || r.Attempts != 1 || r.State != idem.StatePending || sent.attempts() != 1 {
					t.Errorf("after the Logger's panic: %+v, %v, %d sent; want op2 pending, held by %q, 1 attempt, nothing sent", r, err, sent.attempts(), c.holder)
				}
			})
		})
	}
}

// TestRetryHookOnlyForARetry: a retry whose wait would end at or after the
// context's deadline is not made: the call stops at once, OnGiveUp runs
// with the deadline's error, and OnRetry and the "retrying" record do not,
// where they ran before the call found it could not wait. A Retry-After
// longer than MaxRetryAfter stops the call too: OnGiveUp's Reason says so,
// where it said the attempts or the budget ran out, and its Wait is the
// time until the next attempt stored; the next call, which that time
// stops before it sends, says that.
func TestRetryHookOnlyForARetry(t *testing.T) {
	for _, c := range []struct {
		name       string
		retryAfter string
		deadline   time.Duration // 0: none
		reason     string
		wait       time.Duration
		err        error
	}{
		{"deadline before the wait ends", "2", time.Second, "past the context's deadline", 2 * time.Second, context.DeadlineExceeded},
		{"Retry-After past MaxRetryAfter", "31", 0, "Retry-After, longer than MaxRetryAfter", 31 * time.Second, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, _ := newTransport(t, status(503, "Retry-After", c.retryAfter), status(201))
				var logs bytes.Buffer
				tr.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				var retries, giveUps []idem.Event
				tr.Hooks = idem.Hooks{
					OnRetry:  func(e idem.Event) { retries = append(retries, e) },
					OnGiveUp: func(e idem.Event) { giveUps = append(giveUps, e) },
				}
				ctx := idem.WithOperation(context.Background(), "op")
				if c.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.deadline)
					defer cancel()
				}
				resp, err := post(t, ctx, tr, `{}`)
				if resp != nil {
					resp.Body.Close()
				}
				if rec.attempts() != 1 || len(retries) != 0 || strings.Contains(logs.String(), "retrying") {
					t.Errorf("%d attempts, OnRetry %+v, log %q; want 1 attempt, no retry hook or record", rec.attempts(), retries, logs.String())
				}
				if len(giveUps) != 1 || !strings.Contains(giveUps[0].Reason, c.reason) || giveUps[0].Wait != c.wait || !errors.Is(giveUps[0].Err, c.err) {
					t.Fatalf("OnGiveUp %+v; want one, reason %q, wait %v, err %v", giveUps, c.reason, c.wait, c.err)
				}
				if c.err != nil && !errors.Is(err, c.err) {
					t.Errorf("call: %v; want %v", err, c.err)
				}
				if c.deadline > 0 {
					return
				}
				giveUps = nil
				if resp, err := post(t, ctx, tr, `{}`); err == nil {
					resp.Body.Close()
					t.Fatalf("the next call got %s; want it stopped before sending", resp.Status)
				}
				if rec.attempts() != 1 || len(giveUps) != 1 || !strings.Contains(giveUps[0].Reason, "next attempt time, stored in the jar") || giveUps[0].Wait != c.wait {
					t.Fatalf("the next call: %d attempts in all, OnGiveUp %+v; want nothing sent, one give-up for the stored next attempt time, wait %v", rec.attempts(), giveUps, c.wait)
				}
			})
		})
	}
}

// TestPanickingHookOfAnUnnamedOperation: an operation without a name whose
// first attempt's OnAttempt panicked sent nothing, and no call can name it
// to resume it: it is abandoned, as one that Base refused with ErrNotSent,
// and not left pending for a resume of every pending operation to send. One
// that an earlier attempt sent stays pending.
func TestPanickingHookOfAnUnnamedOperation(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []func() (*http.Response, error)
		panic int // the attempt whose OnAttempt panics
		sent  int
		state idem.State
	}{
		{"first attempt", steps(status(201)), 1, 0, idem.StateAbandoned},
		{"second attempt", steps(status(503), status(201)), 2, 1, idem.StatePending},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, c.steps...)
				tr.Hooks.OnAttempt = func(e idem.Event) {
					if e.Attempt == c.panic {
						panic("hook")
					}
				}
				func() {
					defer func() {
						if recover() == nil {
							t.Error("RoundTrip did not panic")
						}
					}()
					post(t, context.Background(), tr, `{}`)
				}()
				if got := rec.attempts(); got != c.sent {
					t.Errorf("Base saw %d attempts; want %d", got, c.sent)
				}
				r := onlyRecord(t, jar)
				if r.State != c.state || r.Attempts != c.sent || r.Holder != "" {
					t.Errorf("record: %s, %d attempts, holder %q; want %s, %d attempts, no holder", r.State, r.Attempts, r.Holder, c.state, c.sent)
				}
			})
		})
	}
}

// TestGiveUpAfterRetryAfterPassed: a call that stops after the time the
// server's Retry-After asked for has passed (its context ended during a
// longer backoff, or a later attempt failed) has no next attempt time left
// to report: OnGiveUp's Wait is not negative, and neither the
// *PendingError nor the record gives a time already past.
func TestGiveUpAfterRetryAfterPassed(t *testing.T) {
	for _, c := range []struct {
		name   string
		second func() (*http.Response, error)
		cancel time.Duration // 0: none
	}{
		{"context ended in a backoff longer than the Retry-After", status(201), 3 * time.Second},
		{"a later attempt stopped", func() (*http.Response, error) { return nil, errors.New("not retried") }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, _, jar := newTransport(t, status(503, "Retry-After", "1"), c.second)
				tr.Policy = retry.Policy{InitialInterval: 5 * time.Second, MaxInterval: 5 * time.Second, NoJitter: true}
				var giveUps []idem.Event
				tr.Hooks.OnGiveUp = func(e idem.Event) { giveUps = append(giveUps, e) }
				ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
				defer cancel()
				if c.cancel > 0 {
					time.AfterFunc(c.cancel, cancel)
				}
				resp, err := post(t, ctx, tr, `{}`)
				if resp != nil {
					resp.Body.Close()
				}
				var pe *idem.PendingError
				if !errors.As(err, &pe) {
					t.Fatalf("got %v; want a *PendingError", err)
				}
				now := time.Now()
				if len(giveUps) != 1 || giveUps[0].Wait < 0 {
					t.Errorf("OnGiveUp %+v; want one, with no negative Wait", giveUps)
				}
				if !pe.NextAttempt.IsZero() && pe.NextAttempt.Before(now) {
					t.Errorf("PendingError.NextAttempt %v, before now (%v): %v", pe.NextAttempt, now, err)
				}
				if r, _ := jar.Get(context.Background(), "op"); !r.NextAttempt.IsZero() && r.NextAttempt.Before(now) {
					t.Errorf("record's NextAttempt %v, before now (%v)", r.NextAttempt, now)
				}
			})
		})
	}
}
