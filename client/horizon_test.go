package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
)

var horizonCases = []struct {
	age  time.Duration
	sent bool
}{
	{23*time.Hour + 59*time.Minute, true},
	{24*time.Hour + time.Minute, false},
}

// checkHorizon resumes op, whose first send is age old, and checks that it
// is sent under the horizon and handed to reconciliation past it.
func checkHorizon(t *testing.T, c *client.Client, s *shop, op string, age time.Duration, sent bool, key string) {
	t.Helper()
	ctx := context.Background()
	before := s.sends()
	resp, err := c.Resume(ctx, op)
	if sent {
		if err != nil || resp.StatusCode != 201 || s.sends() != before+1 || s.key(before) != key {
			t.Fatalf("%v old: %v after %d new sends; want it sent once with key %s", age, err, s.sends()-before, key)
		}
		resp.Body.Close()
		return
	}
	var re *idem.ReconcileError
	if !errors.As(err, &re) || !errors.Is(err, idem.ErrReconcile) || re.Key != key || s.sends() != before {
		t.Fatalf("%v old: %v after %d new sends; want *idem.ReconcileError, nothing sent", age, err, s.sends()-before)
	}
	if got := state(t, c.Jar(), op); got != idem.StateReconcile {
		t.Fatalf("%v old: state %q; want reconcile", age, got)
	}
	if _, err := c.Resume(ctx, op); !errors.As(err, &re) || s.sends() != before {
		t.Fatalf("resumed again: %v; want *idem.ReconcileError, nothing sent", err)
	}
}

func TestHorizonFromTheStoredFirstSend(t *testing.T) {
	for _, tt := range horizonCases {
		s, c := pendingCharge(t, nil)
		r := backdate(t, c.Jar(), "charge:o1", time.Now().Add(-tt.age))
		checkHorizon(t, c, s, "charge:o1", tt.age, tt.sent, r.Key)
	}
}

// After a restart the horizon is still measured from the first send: the
// time comes from the jar file, not from the process.
func TestHorizonAfterRestart(t *testing.T) {
	for _, tt := range horizonCases {
		ctx := context.Background()
		path := filepath.Join(t.TempDir(), "keys.db")
		s := newShop()
		s.failNext(503)
		opts := func() *client.Options {
			return &client.Options{Base: inProcess{s}, Header: withAuth, Policy: retry.Policy{MaxAttempts: 1}}
		}
		c, err := client.New(ctx, path, opts())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("first call: %v; want pending", err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}

		// While the program is down, time passes.
		j, err := keyjar.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := backdate(t, j, "charge:o1", time.Now().Add(-tt.age))
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}

		c, err = client.New(ctx, path, opts())
		if err != nil {
			t.Fatal(err)
		}
		pending, err := c.Pending(ctx)
		if err != nil || len(pending) != 1 || !pending[0].Created.Equal(r.Created) {
			t.Fatalf("after restart: pending %+v, %v; want charge:o1 created at %v", pending, err, r.Created)
		}
		checkHorizon(t, c, s, "charge:o1", tt.age, tt.sent, r.Key)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
