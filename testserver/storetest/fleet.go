package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
)

// The fleet of RunFleet.
const (
	fleetSize     = 3                // server instances; the last one crashes
	fleetOps      = 16               // operations that no crash disturbs
	fleetCallers  = 3                // callers of one operation at once
	fleetLease    = time.Minute      // every instance's LockTimeout, which the shared clock passes by a jump
	fleetAttempts = 1000             // requests of one caller at most, 5 ms apart
	fleetWait     = 10 * time.Second // for each step
)

// crashOps are the operations whose handler stops on the crashing
// instance, and whether it stops after the operation's effect (true) or
// before it.
var crashOps = map[string]bool{"crash-before-effect": false, "crash-after-effect": true}

// RunFleet checks what a store that several servers share promises: each
// operation runs once across them, and every caller gets its one answer,
// also when an instance crashes in the middle of a request. open returns a
// new Store on the same storage at each call, as a server instance opens
// it (a pool of its own, a handle of its own on the file); RunFleet closes
// none.
//
// Three instances, each a Middleware on a store of its own behind an
// http.Server of its own on 127.0.0.1, read one clock (their Now), which
// the test moves. The third claims two operations and stops in their
// handlers, one before the operation's effect and one after it. Then 16
// other operations are each sent by 3 callers at once, to three
// instances, each caller asking again after a 409 in-flight, while the
// two stopped ones, sent to the other instances, must be answered 409
// in-flight. The third instance's server then goes away, its callers'
// connections cut, and its claims stay in flight until the clock passes
// LockTimeout. Then 3 callers at once, spread over the two other
// instances, ask for each of them: one run takes each over
// (Claim.TakenOver) and stops before the effect, while the crashed
// instance's handlers go on, late, as those of a paused process do, and
// end: their saves, fenced by their claims, change nothing. Then the runs
// that took over go on.
//
// The handler applies its operation's effect to a ledger that keeps one
// effect per operation. A run that took a claim over and finds the effect
// of the run it took over answers with it; any other run that finds an
// effect applies it again. RunFleet checks that every operation's effect
// was applied once, that every operation ran once (the crashed instance's
// twice: there, then taken over by another), that every caller but the
// crashed instance's got the answer, 201 naming the effect, and that one
// of them got it fresh and the others its replay.
func RunFleet(t *testing.T, open func(t *testing.T) testserver.Store) {
	runFleet(t, func() testserver.Store { return open(t) }, fleetWait)
}

// runFleet is RunFleet, waiting at most wait for each step.
func runFleet(t testing.TB, open func() testserver.Store, wait time.Duration) {
	f := newFleet(t, open, wait)
	victim, survivors := f.servers[fleetSize-1], f.servers[:fleetSize-1]
	var wg sync.WaitGroup // the callers
	var crashed sync.WaitGroup
	// However the test ends, a step failed included, its callers end
	// first: their requests cancelled, the stopped handlers let go. A
	// caller left running would fail the test after it ended, a panic
	// that hides the first failure.
	defer func() {
		f.cancel()
		f.resumeOnce()
		f.finishOnce()
		wg.Wait()
		crashed.Wait()
	}()

	// The crashing instance claims the crash operations and stops in
	// their handlers.
	lost := make(chan error, len(crashOps))
	for op := range crashOps {
		crashed.Go(func() {
			_, err := f.post(victim, op)
			lost <- err
		})
	}
	for range crashOps {
		await(f, f.stopped, "a handler of the crashing instance to stop")
	}

	// Every other operation, from several callers at once, on every
	// instance; the stopped ones are in flight on the others.
	gate := make(chan struct{})
	for k := range fleetOps {
		for j := range fleetCallers {
			wg.Go(func() {
				<-gate
				f.call(f.servers[(k+j)%fleetSize], fmt.Sprint("op-", k))
			})
		}
	}
	for op := range crashOps {
		for i, s := range survivors {
			wg.Go(func() {
				<-gate
				f.inFlight(s, op, fmt.Sprintf("instance %d, while instance %d runs it", i, fleetSize-1))
			})
		}
	}
	close(gate)
	await(f, done(&wg), "the callers")

	// The crash: the server goes away, its handlers stay stopped.
	victim.srv.Close()
	for range crashOps {
		if err := await(f, lost, "the crashed instance's callers"); err == nil {
			t.Errorf("a caller of the crashed instance got an answer; want its connection cut")
		}
	}
	for op := range crashOps {
		f.inFlight(survivors[0], op, "instance 0, after the crash and before LockTimeout")
	}

	// LockTimeout passes: the crash operations are taken over by callers
	// of both other instances at once; the others are asked for again.
	f.skew.Add(int64(fleetLease + time.Second))
	gate = make(chan struct{})
	for op := range crashOps {
		for j := range fleetCallers {
			wg.Go(func() {
				<-gate
				f.call(survivors[j%len(survivors)], op)
			})
		}
	}
	for k := range fleetOps {
		wg.Go(func() {
			<-gate
			f.call(survivors[k%len(survivors)], fmt.Sprint("op-", k))
		})
	}
	close(gate)
	for range crashOps {
		await(f, f.tookOver, "a survivor to take a claim of the crashed instance over")
	}

	// The crashed instance's handlers go on, late, while the runs that
	// took their claims over are under way; then those go on.
	f.resumeOnce()
	await(f, done(&victim.serving), "the crashed instance's requests to end")
	f.finishOnce()
	await(f, done(&wg), "the callers")

	// Every operation is asked for once more.
	for k := range fleetOps {
		f.call(survivors[0], fmt.Sprint("op-", k))
	}
	for op := range crashOps {
		f.call(survivors[0], op)
	}

	f.check(victim, survivors)
}

// check fails t unless every operation's effect was applied once, it ran
// once (the crash operations once more, taken over by a survivor), and
// its callers got the one answer naming the effect, fresh once.
func (f *fleet) check(victim *fleetServer, survivors []*fleetServer) {
	t := f.t
	l := &f.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(f.answers) != fleetOps+len(crashOps) {
		t.Errorf("answers for %d operations; want %d", len(f.answers), fleetOps+len(crashOps))
	}
	for op, answers := range f.answers {
		if n := l.applied[op]; n != 1 {
			t.Errorf("operation %s: its effect applied %d times; want once", op, n)
		}
		runs, want := l.runs[op], "once"
		ok := len(runs) == 1 && !runs[0].takenOver
		if _, crash := crashOps[op]; crash {
			want = fmt.Sprintf("on instance %d, then taken over on another", fleetSize-1)
			ok = len(runs) == 2 && runs[0] == fleetRun{fleetSize - 1, false} &&
				runs[1].instance != fleetSize-1 && runs[1].takenOver
		}
		if !ok {
			t.Errorf("operation %s ran %+v (instance, taken over); want it run %s", op, runs, want)
		}
		body := fmt.Sprintf(`{"operation":%q,"effect":%d}`, op, l.effect[op])
		fresh := 0
		for _, a := range answers {
			if a.status != http.StatusCreated || a.body != body {
				t.Errorf("operation %s: a caller got %d %q; want 201 %q", op, a.status, a.body, body)
			}
			if !a.replayed {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("operation %s: %d of its %d answers fresh; want 1, and the others replayed", op, fresh, len(answers))
		}
	}
	takeovers := 0
	for _, s := range survivors {
		takeovers += int(s.mw.Stats().Takeovers)
	}
	if takeovers != len(crashOps) {
		t.Errorf("%d take-overs by the survivors; want %d", takeovers, len(crashOps))
	}
	// The late saves are fenced.
	if st := victim.mw.Stats(); st.Fenced != int64(len(crashOps)) {
		t.Errorf("the crashed instance's stats %+v; want %d late writes fenced", st, len(crashOps))
	}
}

type fleet struct {
	t        testing.TB
	wait     time.Duration      // for each step
	ctx      context.Context    // the requests'
	cancel   context.CancelFunc // ends them: the test ended
	skew     atomic.Int64       // added to time.Now: the instances' clock
	client   *http.Client
	servers  []*fleetServer
	ledger   fleetLedger
	stopped  chan string   // the key of a handler stopped on the crashing instance
	resume   chan struct{} // closed: those handlers go on
	tookOver chan string   // the key of a run that took a claim of the crashing instance over
	finish   chan struct{} // closed: those runs go on
	resumed  sync.Once
	finished sync.Once

	mu      sync.Mutex
	answers map[string][]fleetAnswer // an operation's answers, but 409 in-flight
}

type fleetServer struct {
	mw      *testserver.Middleware
	srv     *http.Server
	url     string
	serving sync.WaitGroup // requests in the Middleware, its write after the handler included
}

type fleetAnswer struct {
	status   int
	replayed bool
	body     string
}

func newFleet(t testing.TB, open func() testserver.Store, wait time.Duration) *fleet {
	tr := &http.Transport{}
	ctx, cancel := context.WithCancel(t.Context())
	f := &fleet{
		t:        t,
		wait:     wait,
		ctx:      ctx,
		cancel:   cancel,
		client:   &http.Client{Transport: tr},
		ledger:   fleetLedger{effect: map[string]int64{}, applied: map[string]int{}, runs: map[string][]fleetRun{}},
		stopped:  make(chan string, len(crashOps)),
		resume:   make(chan struct{}),
		tookOver: make(chan string, len(crashOps)),
		finish:   make(chan struct{}),
		answers:  map[string][]fleetAnswer{},
	}
	t.Cleanup(tr.CloseIdleConnections)
	now := func() time.Time { return time.Now().Add(time.Duration(f.skew.Load())) }
	for i := range fleetSize {
		s := &fleetServer{mw: &testserver.Middleware{Store: open(), LockTimeout: fleetLease, Now: now}}
		h := s.mw.Wrap(f.handler(i))
		s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.serving.Add(1)
			defer s.serving.Done()
			h.ServeHTTP(w, r)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go s.srv.Serve(ln)
		t.Cleanup(func() { s.srv.Close() })
		s.url = "http://" + ln.Addr().String() + "/operations"
		f.servers = append(f.servers, s)
	}
	return f
}

func (f *fleet) resumeOnce() { f.resumed.Do(func() { close(f.resume) }) }
func (f *fleet) finishOnce() { f.finished.Do(func() { close(f.finish) }) }

// handler is instance i's: it applies the effect of the operation its
// claim names and answers 201 with it.
func (f *fleet) handler(i int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := testserver.ClaimFrom(r.Context())
		f.ledger.ran(c.Key, i, c.TakenOver)
		after, crashOp := crashOps[c.Key]
		crashing := crashOp && i == fleetSize-1
		switch {
		case crashing && !after:
			hold(f.stopped, c.Key, f.resume)
		case crashOp && !crashing:
			hold(f.tookOver, c.Key, f.finish)
		}
		effect := f.ledger.apply(c.Key, c.Token, c.TakenOver)
		if crashing && after {
			hold(f.stopped, c.Key, f.resume)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"operation":%q,"effect":%d}`, c.Key, effect)
	})
}

// hold sends key on c and waits until until is closed. Once it is, it
// returns at once: a run that should not have come (c full) is not held
// for ever.
func hold(c chan<- string, key string, until <-chan struct{}) {
	select {
	case c <- key:
		<-until
	case <-until:
	}
}

// post sends operation op to s once.
func (f *fleet) post(s *fleetServer, op string) (fleetAnswer, error) {
	req, err := http.NewRequestWithContext(f.ctx, http.MethodPost, s.url, strings.NewReader(`{"operation":"`+op+`"}`))
	if err != nil {
		return fleetAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", op)
	req.Header.Set("Authorization", "Bearer fleet") // one scope for all
	resp, err := f.client.Do(req)
	if err != nil {
		return fleetAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fleetAnswer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", string(b)}, err
}

// call sends op to s until the answer is not 409 in-flight, 5 ms after
// each, at most fleetAttempts times, and records the answer.
func (f *fleet) call(s *fleetServer, op string) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range fleetAttempts {
		a, err := f.post(s, op)
		if f.ctx.Err() != nil {
			return // the test ended, its failure reported
		}
		if err != nil {
			f.t.Errorf("operation %s: %v", op, err)
			return
		}
		if !inFlight(a) {
			f.mu.Lock()
			f.answers[op] = append(f.answers[op], a)
			f.mu.Unlock()
			return
		}
		<-tick.C
	}
	f.t.Errorf("operation %s: still in flight after %d requests", op, fleetAttempts)
}

// inFlight sends op to s once, and fails the test unless it is answered
// 409 in-flight.
func (f *fleet) inFlight(s *fleetServer, op, where string) {
	a, err := f.post(s, op)
	if f.ctx.Err() != nil {
		return // the test ended, its failure reported
	}
	if err != nil || !inFlight(a) {
		f.t.Errorf("operation %s sent to %s: %d %q, %v; want 409 in-flight", op, where, a.status, a.body, err)
	}
}

func inFlight(a fleetAnswer) bool {
	var p testserver.Problem
	return a.status == http.StatusConflict && json.Unmarshal([]byte(a.body), &p) == nil && p.Type == testserver.ProblemInFlight
}

// done returns a channel closed once wg is done.
func done(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		wg.Wait()
		close(c)
	}()
	return c
}

// await returns what c gives, or fails f's test after f.wait.
func await[T any](f *fleet, c <-chan T, what string) T {
	f.t.Helper()
	timer := time.NewTimer(f.wait)
	defer timer.Stop()
	select {
	case v := <-c:
		return v
	case <-timer.C:
		f.t.Fatalf("waited %v for %s", f.wait, what)
		panic("unreachable")
	}
}

// fleetLedger is the service downstream of the handler: it keeps one
// effect per operation, and counts every run that applied it.
type fleetLedger struct {
	mu      sync.Mutex
	effect  map[string]int64 // operation → the token of the run whose effect it is
	applied map[string]int   // operation → effects applied
	runs    map[string][]fleetRun
}

type fleetRun struct {
	instance  int
	takenOver bool
}

func (l *fleetLedger) ran(op string, instance int, takenOver bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[op] = append(l.runs[op], fleetRun{instance, takenOver})
}

// apply applies op's effect for the run with token, and returns the
// effect's id: the token of the run that applied it.
func (l *fleetLedger) apply(op string, token int64, takenOver bool) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev, ok := l.effect[op]
	switch {
	case ok && takenOver:
		return prev // the run taken over applied it: reconciled
	case ok:
		l.applied[op]++ // a second run, unaware of the first
		return prev
	}
	l.effect[op] = token
	l.applied[op]++
	return token
}
