package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

// TestPendingErrorSaysWhyStoredNextAttemptPastDeadline: a call whose
// context's deadline comes before the operation's stored next attempt time
// returns at once, and its Reason says so, as for a retry's wait past the
// deadline: its context has not ended, and the caller must not read that
// it was cancelled or ran out.
func TestPendingErrorSaysWhyStoredNextAttemptPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, _ := newTransport(t, status(503, "Retry-After", "3600"), status(201))
		var gaveUp []string
		tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Reason) }
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the 503 back", resp, err)
		}
		resp.Body.Close()
		gaveUp = nil
		tr.Policy.MaxRetryAfter, tr.Policy.MaxElapsed = 2*time.Hour, 2*time.Hour
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		_, err = post(t, ctx, tr, `{}`)
		const want = "the operation's next attempt time, stored in the jar (the server's Retry-After), would come past the context's deadline"
		var pe *idem.PendingError
		if !errors.As(err, &pe) || pe.Reason != want || !strings.Contains(err.Error(), "("+want+")") ||
			!errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 0 || rec.attempts() != 1 {
			t.Fatalf("got %v after %v, %d attempts; want at once a *PendingError matching context.DeadlineExceeded whose Reason, and message, say %q",
				err, time.Since(start), rec.attempts(), want)
		}
		if !slices.Equal(gaveUp, []string{want}) {
			t.Errorf("OnGiveUp saw %q; want %q", gaveUp, want)
		}
	})
}

// TestWaitPastHorizonStopsNow: a retry whose wait would end past the
// operation's horizon is not waited for, only to be reconciled after it:
// the call returns the last answer at once, as when MaxElapsed stops it,
// saying why, and the operation stays pending, reconciled by the next call
// under its name past the horizon.
func TestWaitPastHorizonStopsNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(503))
		tr.Policy = retry.Policy{Horizon: 2 * time.Second, InitialInterval: time.Second, NoJitter: true, MaxAttempts: 10}
		var gaveUp []string
		tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Reason) }
		ctx := idem.WithOperation(context.Background(), "op")
		start := time.Now()
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil || resp.StatusCode != 503 || time.Since(start) != time.Second || rec.attempts() != 2 {
			t.Fatalf("got %v, %v after %v and %d attempts; want the second 503 after 1s (the next wait, 2s, ends past the 2s horizon)",
				resp, err, time.Since(start), rec.attempts())
		}
		resp.Body.Close()
		const want = "the next wait would end past the retry horizon (2s) after status 503"
		if !slices.Equal(gaveUp, []string{want}) {
			t.Errorf("OnGiveUp saw %q; want %q", gaveUp, want)
		}
		if r, err := jar.Get(ctx, "op"); err != nil || r.State != idem.StatePending {
			t.Fatalf("record %+v, %v; want pending", r, err)
		}
		time.Sleep(2 * time.Second) // past the horizon, on synctest's clock
		var re *idem.ReconcileError
		if _, err := post(t, ctx, tr, `{}`); !errors.As(err, &re) || rec.attempts() != 2 {
			t.Fatalf("the next call: %v after %d attempts; want a *ReconcileError, nothing sent", err, rec.attempts())
		}
	})
}

// TestNotSentAfterAttemptTimeout: a Base that is still getting what it
// needs to send (a credential) when Policy.AttemptTimeout fires, and then
// says it sent nothing (ErrNotSent), is taken at its word, as before the
// timeout: the attempt is neither counted nor retried, and the call stops
// with a *PendingError wrapping ErrNotSent, not an attempt timeout.
func TestNotSentAfterAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls int
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Jar: jar, Policy: retry.Policy{AttemptTimeout: 100 * time.Millisecond, MaxAttempts: 3},
			Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				calls++
				<-r.Context().Done() // the token never comes
				return nil, fmt.Errorf("%w: getting a token: %w", idem.ErrNotSent, r.Context().Err())
			})}
		ctx := idem.WithOperation(context.Background(), "op")
		start := time.Now()
		_, err := post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || !errors.Is(err, idem.ErrNotSent) || calls != 1 || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("got %v after %v and %d calls of Base; want a *PendingError wrapping ErrNotSent after one call, 100ms", err, time.Since(start), calls)
		}
		if r, err := jar.Get(ctx, "op"); err != nil || r.Attempts != 0 || r.State != idem.StatePending {
			t.Fatalf("record %+v, %v; want pending, no attempt counted", r, err)
		}
	})
}
