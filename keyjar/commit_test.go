package keyjar_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

func newRecord(op string) idem.Record {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	return idem.Record{Op: op, Key: "key-" + op, Fingerprint: "fp", State: idem.StatePending,
		Method: "POST", URL: "http://127.0.0.1/charge", Created: now, Updated: now}
}

// commitGate is a beforeCommit seam that records each commit and, until
// open is called, holds it until the test releases it.
type commitGate struct {
	mu      sync.Mutex
	commits []keyjar.Commit
	entered chan struct{}
	release chan struct{}
	free    chan struct{}
	once    sync.Once
}

func newCommitGate() *commitGate {
	return &commitGate{entered: make(chan struct{}, 1000), release: make(chan struct{}, 1000), free: make(chan struct{})}
}

func (g *commitGate) hook(c keyjar.Commit) {
	g.mu.Lock()
	g.commits = append(g.commits, c)
	g.mu.Unlock()
	select {
	case <-g.free:
		return
	default:
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-g.free:
	}
}

// open lets every commit through from now on.
func (g *commitGate) open() { g.once.Do(func() { close(g.free) }) }

// openGated opens a new jar whose commits go through a gate. At the end of
// the test the gate opens, then the jar closes.
func openGated(t *testing.T, h keyjar.Hooks) (*keyjar.Jar, *commitGate) {
	t.Helper()
	gate := newCommitGate()
	h.BeforeCommit = gate.hook
	j, err := keyjar.OpenHooked(t.Context(), filepath.Join(t.TempDir(), "keys.db"), nil, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	t.Cleanup(gate.open) // runs first, also when the test fails
	return j, gate
}

func (g *commitGate) log() []keyjar.Commit {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]keyjar.Commit(nil), g.commits...)
}

// TestBeginWaitsForDurableCommit holds the COMMIT of a key creation and
// checks that Begin has not returned: a jar that answered before its commit
// was durable would fail here.
func TestBeginWaitsForDurableCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, gate := openGated(t, keyjar.Hooks{})
		returned := make(chan error, 1)
		go func() {
			_, _, err := j.Begin(t.Context(), newRecord("op"))
			returned <- err
		}()
		<-gate.entered
		synctest.Wait() // every goroutine is blocked: Begin, if it was going to return early, has
		select {
		case err := <-returned:
			t.Fatalf("Begin returned (err %v) before its transaction committed", err)
		default:
		}
		// fullfsync: on macOS an fsync leaves the write in the disk's
		// cache, F_FULLFSYNC does not.
		if c := gate.log()[0]; !c.Durable || c.Synchronous != 2 || c.FullFsync != 2 {
			t.Errorf("key creation committed with %+v; want durable with synchronous=FULL (2), fullfsync and checkpoint_fullfsync on (2)", c)
		}
		gate.release <- struct{}{}
		if err := answer(t, returned, "Begin"); err != nil {
			t.Fatalf("Begin: %v", err)
		}
	})
}

// answer returns the answer ch holds once every goroutine of the bubble is
// blocked, after a commit the test released. When ch holds none, the
// committer did not answer its waiter: the test fails at once, rather than
// wait on ch until the bubble deadlocks, which panics and ends the
// package's other tests with it.
func answer(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	synctest.Wait()
	select {
	case err := <-ch:
		return err
	default:
		t.Fatalf("%s was not answered after its transaction committed", what)
		return nil
	}
}

// TestGroupCommit holds one commit while more Begins arrive: they must all
// share the next transaction, and none may return before it commits.
func TestGroupCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, gate := openGated(t, keyjar.Hooks{})
		const n = 32
		var returned sync.WaitGroup
		var done [n]chan error
		begin := func(i int) {
			done[i] = make(chan error, 1)
			returned.Go(func() {
				_, created, err := j.Begin(t.Context(), newRecord(fmt.Sprint("op-", i)))
				if err == nil && !created {
					err = fmt.Errorf("op-%d: created = false", i)
				}
				done[i] <- err
			})
		}
		begin(0)
		<-gate.entered // the first commit is held
		for i := 1; i < n; i++ {
			begin(i)
		}
		synctest.Wait() // the other Begins are all queued
		gate.release <- struct{}{}
		<-gate.entered // the second commit holds the other 31
		synctest.Wait()
		for i := 1; i < n; i++ {
			select {
			case err := <-done[i]:
				t.Fatalf("Begin %d returned (err %v) before its transaction committed", i, err)
			default:
			}
		}
		gate.release <- struct{}{}
		for i := range n {
			if err := answer(t, done[i], fmt.Sprint("Begin ", i)); err != nil {
				t.Error(err)
			}
		}
		returned.Wait()
		commits := gate.log()
		if len(commits) != 2 || commits[0].Jobs != 1 || commits[1].Jobs != n-1 {
			t.Errorf("%d Begins committed as %+v; want 2 commits of 1 and %d", n, commits, n-1)
		}
	})
}

// TestOnlyKeyCreationsSync checks that only transactions holding a key
// creation and an abandon commit with synchronous=FULL: Acquire, the other
// Updates, Forget and Prune are written without an fsync of their own.
func TestOnlyKeyCreationsSync(t *testing.T) {
	j, gate := openGated(t, keyjar.Hooks{})
	gate.open()
	ctx := t.Context()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		name    string
		durable bool
		run     func() error
	}{
		{"Begin", true, func() error { _, _, err := j.Begin(ctx, newRecord("op")); return err }},
		{"Acquire", false, func() error { _, err := j.Acquire(ctx, "op", "a", now, time.Minute); return err }},
		{"Update", false, func() error {
			_, err := j.Update(ctx, "op", "a", idem.Change{Now: now, State: idem.StateDone, Release: true})
			return err
		}},
		{"Begin again", true, func() error { _, _, err := j.Begin(ctx, newRecord("op2")); return err }},
		{"Prune", false, func() error { _, err := j.Prune(ctx, now.Add(time.Hour), 0); return err }},
		{"Forget", false, func() error { return j.Forget(ctx, "op2") }},
		{"Begin a third", true, func() error { _, _, err := j.Begin(ctx, newRecord("op3")); return err }},
		// Lost, an abandon would leave pending an operation that its
		// caller established did not happen, which a resume would send.
		{"Update to abandoned", true, func() error {
			_, err := j.Update(ctx, "op3", "", idem.Change{Now: now, State: idem.StateAbandoned, Note: "refunded by hand"})
			return err
		}},
	}
	for i, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		commits := gate.log()
		if len(commits) != i+1 {
			t.Fatalf("after %s: %d commits; want %d", s.name, len(commits), i+1)
		}
		want := keyjar.Commit{Jobs: 1, Durable: s.durable, Synchronous: 1, FullFsync: 2, Changes: 1} // one row each
		if s.durable {
			want.Synchronous = 2
		}
		if c := commits[i]; c != want {
			t.Errorf("%s committed as %+v; want %+v", s.name, c, want)
		}
	}
}

// TestFailedJobSparesItsBatch fails the statements of one of three Begins
// that share a transaction: it alone gets the error, the other two are
// committed, and nothing of the failed one is left.
func TestFailedJobSparesItsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		injected := errors.New("injected failure")
		j, gate := openGated(t, keyjar.Hooks{JobError: func() error {
			// Call 1 is op-0, alone; the next batch runs op-1 (2), op-2
			// (3: fails), then again op-1 (4) and op-3 (5).
			if calls.Add(1) == 3 {
				return injected
			}
			return nil
		}})
		results := make([]chan error, 4)
		begin := func(i int) {
			results[i] = make(chan error, 1)
			go func() {
				_, created, err := j.Begin(t.Context(), newRecord(fmt.Sprint("op-", i)))
				if err == nil && !created {
					err = fmt.Errorf("op-%d: created = false", i)
				}
				results[i] <- err
			}()
			synctest.Wait() // queued in this order
		}
		begin(0)
		<-gate.entered
		for i := 1; i < 4; i++ {
			begin(i)
		}
		gate.open()
		for i, want := range []error{nil, nil, injected, nil} {
			if err := <-results[i]; !errors.Is(err, want) {
				t.Errorf("Begin op-%d: err = %v; want %v", i, err, want)
			}
		}
		if _, err := j.Get(t.Context(), "op-2"); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get op-2: err = %v; want ErrNotFound", err)
		}
		if commits := gate.log(); len(commits) != 2 || commits[1].Jobs != 2 {
			t.Errorf("commits %+v; want the second of 2 jobs", commits)
		}
	})
}

// beginThroughGate begins r, letting its commit through the gate.
func beginThroughGate(t *testing.T, j *keyjar.Jar, gate *commitGate, r idem.Record) {
	t.Helper()
	gate.release <- struct{}{}
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	<-gate.entered
}

// TestContextEndingMidJob: a caller whose context ends once the committer
// has taken its job waits for the job's commit and gets its result, so that
// what it is told is what the jar holds. A call that returned the context's
// error while its lease was committed would leave the caller without the
// lease the jar says it holds (run with -race too: the record is read only
// after the job set it).
func TestContextEndingMidJob(t *testing.T) {
	for _, name := range []string{"Begin", "Update", "Acquire"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j, gate := openGated(t, keyjar.Hooks{})
				r := newRecord("op")
				if name != "Begin" {
					beginThroughGate(t, j, gate, r)
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				var got idem.Record
				returned := make(chan error, 1)
				go func() {
					var err error
					switch name {
					case "Begin":
						got, _, err = j.Begin(ctx, r)
					case "Update":
						got, err = j.Update(ctx, "op", "", idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone})
					default:
						got, err = j.Acquire(ctx, "op", "h", r.Created, time.Minute)
					}
					returned <- err
				}()
				<-gate.entered // the job ran; its commit waits at the gate
				cancel()
				synctest.Wait()
				select {
				case err := <-returned:
					t.Fatalf("%s returned (err %v) while its write, already run, was committing", name, err)
				default:
				}
				gate.release <- struct{}{}
				if err := answer(t, returned, name); err != nil {
					t.Fatalf("%s after its context ended mid-job: %v; want the committed result", name, err)
				}
				stored, err := j.Get(t.Context(), "op")
				if err != nil {
					t.Fatal(err)
				}
				if stored.Holder != got.Holder || stored.State != got.State || got.Op != "op" {
					t.Errorf("%s returned %+v; the jar holds %+v", name, got, stored)
				}
				gate.open()
			})
		})
	}
}

// TestContextEndingBeforeJob: a caller whose context ends while its job
// waits behind another batch withdraws it: it gets the context's error at
// once and the job is never run.
func TestContextEndingBeforeJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, gate := openGated(t, keyjar.Hooks{})
		r := newRecord("op")
		beginThroughGate(t, j, gate, r)
		held := make(chan error, 1)
		go func() {
			_, _, err := j.Begin(t.Context(), newRecord("other"))
			held <- err
		}()
		<-gate.entered // the committer is held in another batch
		ctx, cancel := context.WithCancel(t.Context())
		returned := make(chan error, 1)
		go func() {
			_, err := j.Acquire(ctx, "op", "h", r.Created, time.Minute)
			returned <- err
		}()
		synctest.Wait() // Acquire is queued
		cancel()
		if err := answer(t, returned, "Acquire"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire withdrawn before it ran: %v; want context.Canceled", err)
		}
		gate.open()
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		stored, err := j.Get(t.Context(), "op")
		if err != nil || stored.Holder != "" {
			t.Errorf("after a withdrawn Acquire the jar holds %+v, %v; want no holder", stored, err)
		}
	})
}
