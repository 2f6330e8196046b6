package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/resume"
	"github.com/idemkit/idem/internal/unwritten"
	"github.com/idemkit/idem/retry"
)

// newReleaseTransport returns a Transport over a releaseJar over a
// MemoryJar, which retries every 100 ms for an hour, and a context naming
// the operation "op", with its cancel.
func newReleaseTransport(t *testing.T) (*idem.Transport, *recorder, *idem.MemoryJar, *releaseJar, context.Context, context.CancelFunc) {
	t.Helper()
	tr, rec, mj := newTransport(t, status(201))
	tr.Policy = retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxElapsed: time.Hour}
	jar := &releaseJar{MemoryJar: mj}
	tr.Jar = jar
	ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
	return tr, rec, mj, jar, ctx, cancel
}

// releaseJar is a Deferrer over a MemoryJar that records the holder of
// each change that releases a lease, written or deferred (applied at
// once), and lets a test step into Begin and Acquire.
type releaseJar struct {
	*idem.MemoryJar
	mu       sync.Mutex
	releases []string // the holder of each release, in order
	acquires int
	// afterBegin, when set, runs after Begin, and acquire in place of
	// each Acquire, given its number (1 for the first).
	afterBegin func()
	acquire    func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error)
}

func (j *releaseJar) note(holder string, c idem.Change) {
	if c.Release {
		j.mu.Lock()
		j.releases = append(j.releases, holder)
		j.mu.Unlock()
	}
}

func (j *releaseJar) released() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.releases...)
}

func (j *releaseJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	rec, created, err := j.MemoryJar.Begin(ctx, r)
	if j.afterBegin != nil {
		j.afterBegin()
	}
	return rec, created, err
}

func (j *releaseJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	j.mu.Lock()
	j.acquires++
	n := j.acquires
	j.mu.Unlock()
	if j.acquire != nil {
		return j.acquire(n, ctx, op, holder, now, ttl)
	}
	return j.MemoryJar.Acquire(ctx, op, holder, now, ttl)
}

func (j *releaseJar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	j.note(holder, c)
	return j.MemoryJar.Update(ctx, op, holder, c)
}

func (j *releaseJar) Defer(op, holder string, c idem.Change) error {
	j.note(holder, c)
	return j.MemoryJar.Defer(op, holder, c)
}

// pendingFree puts in jar the operation "op", key k1 and fingerprint fp,
// pending after one attempt, its lease held by holder until until ("" and
// the zero time: free).
func pendingFree(t *testing.T, jar *idem.MemoryJar, fp, holder string, until time.Time) {
	t.Helper()
	now := time.Now()
	if _, _, err := jar.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
		Created: now, Updated: now, Attempts: 1, Holder: holder, LeaseUntil: until}); err != nil {
		t.Fatal(err)
	}
}

// TestNoReleaseOfALeaseNeverTaken: a call that stops before it took the
// operation's lease (its context ended after Begin found the operation,
// during a wait for another holder's lease, or as the jar withdrew its
// Acquire unwritten, as keyjar does while another process holds its write
// lock) writes and defers no release: it has none to give back, and a
// release the jar must write, fenced to nothing, would wait for that lock
// (idemctl resume interrupted while the jar is locked, at Close).
func TestNoReleaseOfALeaseNeverTaken(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, tc := range []struct {
		name string
		// setup seeds jar and arms it to end the call's context (cancel),
		// and returns the context the call runs with.
		setup func(t *testing.T, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context
	}{
		{"context ends after Begin found the operation", func(t *testing.T, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			jar.afterBegin = cancel
			return ctx
		}},
		{"context ends as the Acquire after a wait for another holder is withdrawn", func(t *testing.T, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "other", time.Now().Add(time.Second))
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				if n == 1 {
					return jar.MemoryJar.Acquire(ctx, op, holder, now, ttl) // ErrLeased
				}
				cancel()
				return idem.Record{}, unwritten.Mark(ctx.Err())
			}
			return ctx
		}},
		{"context ends during a wait for another holder's lease", func(t *testing.T, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "other", time.Now().Add(time.Hour))
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx
		}},
		{"a resume whose Acquire is withdrawn as its context ends", func(t *testing.T, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				cancel()
				return idem.Record{}, unwritten.Mark(ctx.Err())
			}
			return resume.Mark(ctx, "k1")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, mj, jar, ctx, cancel := newReleaseTransport(t)
				defer cancel()
				ctx = tc.setup(t, jar, ctx, cancel)
				before, _ := mj.Get(context.Background(), "op")
				_, err := post(t, ctx, tr, `{}`)
				if !errors.Is(err, idem.ErrPending) || !errors.Is(err, context.Canceled) || rec.attempts() != 0 {
					t.Fatalf("got %v after %d sends; want a *PendingError wrapping context.Canceled, nothing sent", err, rec.attempts())
				}
				if got := jar.released(); len(got) != 0 {
					t.Errorf("releases written or deferred by %q; want none: the call never took the lease", got)
				}
				if after, _ := mj.Get(context.Background(), "op"); after.Holder != before.Holder || after.Attempts != before.Attempts {
					t.Errorf("record after the call: holder %q, %d attempts; want as before, %q, %d", after.Holder, after.Attempts, before.Holder, before.Attempts)
				}
			})
		})
	}
}

// TestReleaseOfALeaseItMayHold: a call that stops while it may hold the
// operation's lease gives it back: one it took (an attempt its context
// ended, a hook that panicked), and one an Acquire or a Begin whose answer
// the jar lost may have given it (the write made, its answer an error),
// so that the next call sends at once rather than wait the lease out.
func TestReleaseOfALeaseItMayHold(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	lost := errors.New("connection reset after COMMIT")
	for _, tc := range []struct {
		name string
		// setup seeds jar and tr, and returns the context the call runs
		// with; the call's error must match want.
		setup func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context
		want  func(err error) bool
		panic bool
	}{
		{"Acquire's answer lost as the context ends", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				if _, err := jar.MemoryJar.Acquire(ctx, op, holder, now, ttl); err != nil {
					t.Fatal(err)
				}
				cancel()
				return idem.Record{}, ctx.Err()
			}
			return ctx
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, context.Canceled) }, false},
		{"a resume's Acquire, its answer lost as the context ends", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				if _, err := jar.MemoryJar.Acquire(ctx, op, holder, now, ttl); err != nil {
					t.Fatal(err)
				}
				cancel()
				return idem.Record{}, ctx.Err()
			}
			return resume.Mark(ctx, "k1")
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, context.Canceled) }, false},
		{"Acquire's answer lost before any attempt", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				if _, err := jar.MemoryJar.Acquire(ctx, op, holder, now, ttl); err != nil {
					t.Fatal(err)
				}
				return idem.Record{}, lost
			}
			return ctx
		}, func(err error) bool { var je *idem.JarError; return errors.As(err, &je) && errors.Is(err, lost) }, false},
		{"Acquire's answer lost after an attempt", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})
			jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
				if _, err := jar.MemoryJar.Acquire(ctx, op, holder, now, ttl); err != nil {
					t.Fatal(err)
				}
				return idem.Record{}, lost
			}
			return ctx
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, lost) }, false},
		{"the context ends during an attempt", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				cancel()
				return nil, r.Context().Err()
			})
			return ctx
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, context.Canceled) }, false},
		{"the context ends during a resume's attempt", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				cancel()
				return nil, r.Context().Err()
			})
			return resume.Mark(ctx, "k1")
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, context.Canceled) }, false},
		{"OnAttempt panics", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			pendingFree(t, jar.MemoryJar, fp, "", time.Time{})
			tr.Hooks.OnAttempt = func(idem.Event) { panic("boom") }
			return ctx
		}, nil, true},
		{"Begin's answer lost as the context ends", func(t *testing.T, tr *idem.Transport, jar *releaseJar, ctx context.Context, cancel context.CancelFunc) context.Context {
			tr.Jar = lateBeginJar{jar.MemoryJar, cancel}
			return ctx
		}, func(err error) bool { return errors.Is(err, idem.ErrPending) && errors.Is(err, context.Canceled) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, _, mj, jar, ctx, cancel := newReleaseTransport(t)
				defer cancel()
				ctx = tc.setup(t, tr, jar, ctx, cancel)
				err := func() (err error) {
					defer func() {
						if v := recover(); v != nil && !tc.panic {
							panic(v)
						} else if v == nil && tc.panic {
							t.Errorf("RoundTrip returned; want the hook's panic")
						}
					}()
					_, err = post(t, ctx, tr, `{}`)
					return err
				}()
				if !tc.panic && !tc.want(err) {
					t.Fatalf("got %T %v", err, err)
				}
				r, gerr := mj.Get(context.Background(), "op")
				if gerr != nil || r.Holder != "" || r.State != idem.StatePending {
					t.Fatalf("record %+v, %v; want pending, its lease given back", r, gerr)
				}
				if _, isLate := tr.Jar.(lateBeginJar); !isLate && len(jar.released()) != 1 {
					t.Errorf("releases by %q; want one", jar.released())
				}
			})
		})
	}
}

// TestReleaseAfterLostAcquireKeepsTheOutcome: a resume whose Acquire's
// answer was lost (made, as pgjar's may be, its answer an error) gives
// back the lease it may hold, and leaves the record's last outcome and the
// server's next attempt time as they were: the resume never read the
// record, and a release built from nothing would clear them (Change's
// LastStatus 0, LastError "" and zero NextAttempt clear), so that the
// next call sent at once what the server asked to wait for.
func TestReleaseAfterLostAcquireKeepsTheOutcome(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	lost := errors.New("connection reset after COMMIT")
	for _, ctxEnds := range []bool{false, true} {
		t.Run(map[bool]string{false: "answer lost", true: "answer lost as the context ends"}[ctxEnds], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, mj := newTransport(t, status(201))
				jar := &releaseJar{MemoryJar: mj}
				tr.Jar = jar
				now := time.Now()
				next := now.Add(10 * time.Minute) // the server's Retry-After
				if _, _, err := mj.Begin(context.Background(), idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
					Created: now, Updated: now, Attempts: 1, LastStatus: 503, LastError: "unavailable", NextAttempt: next}); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
				defer cancel()
				jar.acquire = func(n int, ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
					if _, err := jar.MemoryJar.Acquire(ctx, op, holder, now, ttl); err != nil {
						t.Fatal(err)
					}
					if ctxEnds {
						cancel()
						return idem.Record{}, ctx.Err()
					}
					return idem.Record{}, lost
				}
				if _, err := post(t, resume.Mark(ctx, "k1"), tr, `{}`); err == nil || rec.attempts() != 0 {
					t.Fatalf("resume: %v after %d sends; want an error, nothing sent", err, rec.attempts())
				}
				r, err := mj.Get(context.Background(), "op")
				if err != nil || r.Holder != "" || r.LastStatus != 503 || r.LastError != "unavailable" || !r.NextAttempt.Equal(next) {
					t.Fatalf("record after the resume: holder %q, last %d %q, next attempt %v (%v); want the lease given back, last 503 \"unavailable\", next attempt %v",
						r.Holder, r.LastStatus, r.LastError, r.NextAttempt, err, next)
				}
			})
		})
	}
}
