package idem_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idemkit/idem"
)

// heldJar is a Deferrer over a MemoryJar that holds deferred changes until
// flush, and records which path each change took.
type heldJar struct {
	*idem.MemoryJar
	mu       sync.Mutex
	held     []func()
	deferred []idem.Change
	updated  []idem.Change
}

func (j *heldJar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	j.mu.Lock()
	j.updated = append(j.updated, c)
	j.mu.Unlock()
	return j.MemoryJar.Update(ctx, op, holder, c)
}

func (j *heldJar) Defer(op, holder string, c idem.Change) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.deferred = append(j.deferred, c)
	j.held = append(j.held, func() { j.MemoryJar.Update(context.Background(), op, holder, c) })
	return nil
}

func (j *heldJar) flush() {
	j.mu.Lock()
	held := j.held
	j.held = nil
	j.mu.Unlock()
	for _, f := range held {
		f()
	}
}

// TestTransportDefersOutcome: with a jar that can defer, the outcome of a
// call (done, the lease released) is deferred, so RoundTrip returns before
// it is written; the count of a retry's attempt, which must be in the jar
// before the attempt is sent, is not.
func TestTransportDefersOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mem := newTransport(t, status(409), status(201))
		jar := &heldJar{MemoryJar: mem}
		tr.Jar = jar
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := post(t, ctx, tr, `{"amount":1}`)
		if err != nil || resp.StatusCode != 201 || rec.attempts() != 2 {
			t.Fatalf("got %v, %v after %d attempts; want 201 after 2", resp, err, rec.attempts())
		}
		if len(jar.updated) != 1 || jar.updated[0].Attempts != 1 {
			t.Errorf("changes written at once: %+v; want the second attempt's count only", jar.updated)
		}
		last := jar.deferred[len(jar.deferred)-1]
		if last.State != idem.StateDone || !last.Release || last.LastStatus != 201 {
			t.Errorf("last deferred change %+v; want done, 201, released", last)
		}
		r, _ := mem.Get(ctx, "op")
		if r.State != idem.StatePending {
			t.Fatalf("state %s before the deferred changes are written; want pending (RoundTrip waited for them?)", r.State)
		}
		jar.flush()
		r, _ = mem.Get(ctx, "op")
		if r.State != idem.StateDone || r.Attempts != 2 || r.Holder != "" {
			t.Errorf("after the deferred changes: %s, %d attempts, holder %q; want done, 2, free", r.State, r.Attempts, r.Holder)
		}
	})
}
