package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/closetest"
	"github.com/idemkit/idem/testserver"
)

// Closer is a Store that can be closed, as the stores of this module are.
type Closer interface {
	testserver.Store
	Close() error
}

// RunClosed checks a store's Close, each case on a new, open store from
// newStore: after Close, every method, Close and a Prune of limit 0
// included, returns an error matching errClosed (the store's ErrClosed),
// with a context done too;
// methods called while Close runs return either their usual result or
// errClosed, never another error; and of two Close calls at once, one
// returns nil and the other errClosed.
func RunClosed(t *testing.T, newStore func(t *testing.T) Closer, errClosed error) {
	t.Run("AfterClose", func(t *testing.T) { afterClose(t, newStore(t), errClosed) })
	t.Run("RacingClose", func(t *testing.T) {
		s := newStore(t)
		closetest.RacingClose(t, "store", s.Close, func(g, i int) error { return round(context.Background(), s, fmt.Sprint(g, "-", i), fence(2*i)) }, errClosed)
	})
}

func afterClose(t *testing.T, s Closer, errClosed error) {
	claim(t, s, "scope", "key", "fp", fence(1), base)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := context.Background()
	e, claimed, errClaim := s.Claim(ctx, "scope", "new", "fp", fence(2), base)
	if claimed || e != (testserver.Entry{}) {
		t.Errorf("Claim after Close = %+v, claimed %v; want the zero entry, unclaimed", e, claimed)
	}
	won, errTakeOver := s.TakeOver(ctx, "scope", "key", fence(1), fence(3))
	released, errRelease := s.Release(ctx, "scope", "key", fence(1))
	if won || released {
		t.Errorf("after Close: TakeOver won %v, Release released %v; want neither", won, released)
	}
	errSave := s.Save(ctx, "scope", "key", fence(1), testserver.Response{Status: 201})
	_, errPrune := s.Prune(ctx, base.Add(time.Hour), 10)
	_, errPruneNone := s.Prune(ctx, base, 0) // would delete nothing
	errs := map[string]error{"Claim": errClaim, "TakeOver": errTakeOver, "Save": errSave,
		"Release": errRelease, "Prune": errPrune, "Prune with limit 0": errPruneNone, "second Close": s.Close()}
	// With a context done too, the store is closed first.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, _, errs["Claim with a cancelled context"] = s.Claim(cancelled, "scope", "new", "fp", fence(2), base)
	_, errs["TakeOver with a cancelled context"] = s.TakeOver(cancelled, "scope", "key", fence(1), fence(3))
	errs["Save with a cancelled context"] = s.Save(cancelled, "scope", "key", fence(1), testserver.Response{Status: 201})
	_, errs["Release with a cancelled context"] = s.Release(cancelled, "scope", "key", fence(1))
	_, errs["Prune with a cancelled context"] = s.Prune(cancelled, base.Add(time.Hour), 10)
	for name, err := range errs {
		if !errors.Is(err, errClosed) {
			t.Errorf("%s after Close: %v; want %v", name, err, errClosed)
		}
	}
}

// round claims key, takes it over, saves it, claims and releases another
// key and prunes. It returns the first error, or one that says which result
// was not the usual one.
func round(ctx context.Context, s testserver.Store, key string, f testserver.Fence) error {
	_, claimed, err := s.Claim(ctx, "scope", key, "fp", f, base)
	if err != nil || !claimed {
		return unusual("a claim of a new key", err)
	}
	next := testserver.Fence{Token: f.Token + 1, ClaimID: f.ClaimID + "+1"}
	won, err := s.TakeOver(ctx, "scope", key, f, next)
	if err != nil || !won {
		return unusual("a takeover", err)
	}
	if err := s.Save(ctx, "scope", key, next, testserver.Response{Status: 201, Body: []byte(key)}); err != nil {
		return fmt.Errorf("a save: %w", err)
	}
	_, claimed, err = s.Claim(ctx, "scope", key+"-released", "fp", f, base)
	if err != nil || !claimed {
		return unusual("a claim of a new key", err)
	}
	released, err := s.Release(ctx, "scope", key+"-released", f)
	if err != nil || !released {
		return unusual("a release", err)
	}
	if _, err := s.Prune(ctx, base, 1); err != nil { // nothing is older than base
		return fmt.Errorf("a prune: %w", err)
	}
	return nil
}

// unusual returns err, or when it is nil an error saying that call
// reported false.
func unusual(call string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", call, err)
	}
	return fmt.Errorf("%s reported false", call)
}
