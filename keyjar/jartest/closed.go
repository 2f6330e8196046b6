package jartest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/closetest"
)

// Closer is a Jar that can be closed, as the jars of this module but
// idem.MemoryJar are.
type Closer interface {
	Jar
	Close() error
}

// RunClosed checks a jar's Close, each case on a new, empty jar from open:
// after Close, every method, Close, a Prune of limit 0 and, when the jar
// has them, Defer, ForgetKey, ByKey and AbandonKey included, returns an error matching
// errClosed (the jar's ErrClosed), whatever its arguments (an invalid
// record, state, time or cursor, a context done), whose message says the package's
// prefix ("keyjar:", the one errClosed begins with) once; methods called
// while Close runs return either their usual result or errClosed, never
// another error; and of two Close calls at once, one returns nil and the
// other errClosed.
func RunClosed(t *testing.T, open func(t *testing.T) Closer, errClosed error) {
	t.Run("AfterClose", func(t *testing.T) { afterClose(t, open(t), errClosed) })
	t.Run("RacingClose", func(t *testing.T) {
		j := open(t)
		closetest.RacingClose(t, "jar", j.Close, func(g, i int) error { return round(context.Background(), j, fmt.Sprint(g, "-", i)) }, errClosed)
	})
}

func afterClose(t *testing.T, j Closer, errClosed error) {
	begin(t, j, record("op"))
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := context.Background()
	_, _, errBegin := j.Begin(ctx, record("new"))
	_, errGet := j.Get(ctx, "op")
	_, errAcquire := j.Acquire(ctx, "op", "a", t0, time.Minute)
	_, errUpdate := j.Update(ctx, "op", "", idem.Change{Now: t0})
	_, errList := j.List(ctx, idem.Filter{})
	_, errPrune := j.Prune(ctx, t0.Add(time.Hour), 10)
	_, errPruneAll := j.Prune(ctx, t0, 0)
	errs := map[string]error{"Begin": errBegin, "Get": errGet, "Acquire": errAcquire, "Update": errUpdate,
		"List": errList, "Forget": j.Forget(ctx, "op"), "Prune": errPrune, "Prune with limit 0": errPruneAll,
		"second Close": j.Close()}
	// Arguments the jar would refuse: closed comes first.
	_, _, errs["Begin of an invalid record"] = j.Begin(ctx, idem.Record{})
	_, errs["Acquire at a time no jar stores"] = j.Acquire(ctx, "op", "a", time.Time{}, time.Minute)
	_, errs["Update to an invalid state"] = j.Update(ctx, "op", "", idem.Change{Now: t0, State: "sent"})
	_, errs["List after a cursor text cannot hold"] = j.List(ctx, idem.Filter{After: idem.Cursor{Created: t0, Op: "\x00\xff"}})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, errs["Get with a cancelled context"] = j.Get(cancelled, "op")
	_, errs["List with a cancelled context"] = j.List(cancelled, idem.Filter{})
	_, errs["Update with a cancelled context"] = j.Update(cancelled, "op", "", idem.Change{Now: t0})
	errs["Forget with a cancelled context"] = j.Forget(cancelled, "op")
	_, errs["Prune with a cancelled context"] = j.Prune(cancelled, t0, 10)
	if d, ok := j.(idem.Deferrer); ok {
		errs["Defer"] = d.Defer("op", "", idem.Change{Now: t0})
		errs["Defer to an invalid state"] = d.Defer("op", "", idem.Change{Now: t0, State: "sent"})
	}
	if kf, ok := j.(KeyForgetter); ok {
		errs["ForgetKey"] = kf.ForgetKey(ctx, "op", "key-op")
	}
	if bk, ok := j.(ByKeyer); ok {
		_, errs["ByKey"] = bk.ByKey(ctx, "key-op")
	}
	if ak, ok := j.(AbandonKeyer); ok {
		errs["AbandonKey"] = ak.AbandonKey(ctx, "op", "key-op", "", "gone", t0)
		errs["AbandonKey with an empty note"] = ak.AbandonKey(ctx, "op", "key-op", "", "", t0)
	}
	// The package's prefix, as errClosed begins with it, is said once:
	// a method wrapping errClosed does not repeat it.
	prefix, _, _ := strings.Cut(errClosed.Error(), ": ")
	for name, err := range errs {
		if !errors.Is(err, errClosed) {
			t.Errorf("%s after Close: %v; want %v", name, err, errClosed)
		} else if n := strings.Count(err.Error(), prefix+":"); n != 1 {
			t.Errorf("%s after Close: %q says %s: %d times; want once", name, err, prefix, n)
		}
	}
}

// round begins op, reads it, takes its lease, counts an attempt, settles
// it (deferred when the jar is a Deferrer), lists, looks it up by key,
// forgets it by its key, begins and forgets another, and prunes. It
// returns the first error, or one that says which result was not the
// usual one.
func round(ctx context.Context, j Jar, op string) error {
	if _, created, err := j.Begin(ctx, record(op)); err != nil || !created {
		return unusual("a begin of a new op", created, err)
	}
	if _, err := j.Get(ctx, op); err != nil {
		return fmt.Errorf("a get: %w", err)
	}
	if _, err := j.Acquire(ctx, op, "h", t0, time.Minute); err != nil {
		return fmt.Errorf("an acquire: %w", err)
	}
	if _, err := j.Update(ctx, op, "h", idem.Change{Now: t0, Attempts: 1}); err != nil {
		return fmt.Errorf("an update: %w", err)
	}
	settled := idem.Change{Now: t0, State: idem.StateDone, LastStatus: 201, Release: true}
	if d, ok := j.(idem.Deferrer); ok {
		if err := d.Defer(op, "h", settled); err != nil {
			return fmt.Errorf("a defer: %w", err)
		}
	} else if _, err := j.Update(ctx, op, "h", settled); err != nil {
		return fmt.Errorf("an update: %w", err)
	}
	if _, err := j.List(ctx, idem.Filter{Limit: 1}); err != nil {
		return fmt.Errorf("a list: %w", err)
	}
	if bk, ok := j.(ByKeyer); ok {
		if got, err := bk.ByKey(ctx, "key-"+op); err != nil || len(got) != 1 {
			return unusual("a look-up by key of one op", len(got) == 1, err)
		}
	}
	if kf, ok := j.(KeyForgetter); ok {
		if err := kf.ForgetKey(ctx, op, "key-"+op); err != nil {
			return fmt.Errorf("a forget by key of a done op: %w", err)
		}
	}
	other := op + "-forgotten"
	if _, created, err := j.Begin(ctx, record(other)); err != nil || !created {
		return unusual("a begin of a new op", created, err)
	}
	if err := j.Forget(ctx, other); err != nil {
		return fmt.Errorf("a forget: %w", err)
	}
	if _, err := j.Prune(ctx, t0, 1); err != nil { // nothing was updated before t0
		return fmt.Errorf("a prune: %w", err)
	}
	return nil
}

// unusual returns err, or when it is nil an error saying that call
// reported false.
func unusual(call string, ok bool, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", call, err)
	}
	return fmt.Errorf("%s reported %v", call, ok)
}
