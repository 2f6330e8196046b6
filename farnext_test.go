package idem_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
)

// TestFarRetryAfterUnderLongHorizonIsStored: a Retry-After that no call
// waits for (a server's "Retry-After: 99999999999") under a Policy whose
// Horizon is far longer than a century is recorded as a next attempt time
// the durable jar can hold (Unix nanoseconds: before 2262), so that the
// call's outcome and the release of its lease are written: the next call
// is told when to send, at once, rather than wait for a lease the jar
// never released and then send, the server's Retry-After forgotten.
func TestFarRetryAfterUnderLongHorizonIsStored(t *testing.T) {
	ctx := context.Background()
	jar, err := keyjar.Open(ctx, filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer jar.Close()
	tr, rec, _ := newTransport(t, status(503, "Retry-After", "99999999999"), status(201))
	tr.Jar = jar
	tr.Policy = retry.Policy{Horizon: math.MaxInt64}
	opCtx := idem.WithOperation(ctx, "op")
	start := time.Now()
	resp, err := post(t, opCtx, tr, `{}`)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v; want the 503 back with a nil error", resp, err)
	}
	resp.Body.Close()
	callCtx, cancel := context.WithTimeout(opCtx, 10*time.Second)
	defer cancel()
	_, err = post(t, callCtx, tr, `{}`)
	var pe *idem.PendingError
	if !errors.As(err, &pe) || pe.NextAttempt.Before(start.Add(50*365*24*time.Hour)) || errors.Is(err, idem.ErrLeased) ||
		errors.Is(err, context.DeadlineExceeded) || rec.attempts() != 1 {
		t.Fatalf("second call: got %v after %d attempts; want a *PendingError naming a next attempt decades away, nothing sent", err, rec.attempts())
	}
	r, err := jar.Get(ctx, "op")
	if err != nil || r.State != idem.StatePending || r.LastStatus != 503 || r.NextAttempt.IsZero() || r.Holder != "" {
		t.Fatalf("record %+v, %v; want pending, last status 503, a next attempt time, no holder", r, err)
	}
}
