package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// serverConfig is what a row asks of the server.
type serverConfig struct {
	path        string        // the SQLite file: keys and PayCo's ledger
	noDedup     bool          // PayCo charges on every call, ignoring its key
	optionalKey bool          // requests without a key run unprotected (the baselines)
	lockTimeout time.Duration // the Middleware's lease

	// crash, when not nil, picks the orders after whose first charge the
	// serving instance dies: it never saves nor releases, and a new
	// instance on the same file takes over the traffic.
	crash func(orderID string) bool

	// zombie, when not nil, picks the orders whose first run stalls past
	// the lease, is taken over, and then fails (see zombieHandler).
	zombie func(orderID string) bool
	// unfenced wraps the store so that Save and Release ignore the fence.
	unfenced bool

	logger *slog.Logger // the Middleware's decisions; nil means silent

	// workers bounds the charges served at once; 0 means no bound. The
	// crash row has none: its dead instances keep their requests.
	workers int
}

// server is the reference payments server in process: one listener on
// 127.0.0.1 in front of a succession of instances that share one SQLite
// file. Only one instance is current; a crashed one is dead but its stuck
// handlers stay stuck until bury.
type server struct {
	cfg     serverConfig
	ln      net.Listener
	srv     *http.Server
	cur     atomic.Pointer[instance]
	workers chan struct{} // nil: no limit

	mu        sync.Mutex
	instances []*instance
	crashed   map[string]bool
	zombies   map[string]*zombieState
	// slowest is the longest honest charge the server answered, from the
	// moment it had a worker: a lease (LockTimeout) shorter than an honest
	// run is taken over by design.
	slowest  time.Duration
	buried   chan struct{} // closed by bury: stuck handlers of dead instances return
	buryOnce sync.Once
}

// instance is one server process's worth of state: its own connection to
// the file, its Middleware and its handlers.
type instance struct {
	store   *sqlitestore.Store
	payco   *payments.PayCo
	mw      *testserver.Middleware
	handler http.Handler
	dead    atomic.Bool
}

func startServer(ctx context.Context, cfg serverConfig) (*server, error) {
	s := &server{cfg: cfg, crashed: map[string]bool{}, zombies: map[string]*zombieState{}, buried: make(chan struct{})}
	inst, err := s.newInstance(ctx)
	if err != nil {
		return nil, err
	}
	s.cur.Store(inst)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		inst.store.Close()
		return nil, fmt.Errorf("lab: server: %w", err)
	}
	s.ln = ln
	if cfg.workers > 0 {
		s.workers = make(chan struct{}, cfg.workers)
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// serve hands a request to the current instance. A charge first waits for
// one of the workers, so that the work under a claim, from the claim to
// the save, never queues behind more than a few other charges.
func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.cur.Load().handler.ServeHTTP(w, r)
		return
	}
	wk := &worker{}
	if s.workers != nil {
		select {
		case s.workers <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		wk.free = func() { <-s.workers }
		defer wk.done()
		r = r.WithContext(context.WithValue(r.Context(), workerKey{}, wk))
	}
	start := time.Now()
	inst := s.cur.Load()
	inst.handler.ServeHTTP(w, r)
	if wk.stalled || inst.dead.Load() {
		return // a zombie's or a dead instance's time says nothing of an honest run
	}
	d := time.Since(start)
	s.mu.Lock()
	s.slowest = max(s.slowest, d)
	s.mu.Unlock()
}

// worker is the worker slot a charge holds.
type worker struct {
	once    sync.Once
	free    func()
	stalled bool // a zombie: it gave its slot back before stalling
}

type workerKey struct{}

func (wk *worker) done() {
	if wk.free != nil {
		wk.once.Do(wk.free)
	}
}

// URL is the server's own address, without the fault proxy.
func (s *server) URL() string { return "http://" + s.ln.Addr().String() }

func (s *server) newInstance(ctx context.Context) (*instance, error) {
	st, err := sqlitestore.Open(ctx, s.cfg.path, nil)
	if err != nil {
		return nil, err
	}
	payco, err := payments.NewPayCo(ctx, st.DB())
	if err != nil {
		st.Close()
		return nil, err
	}
	payco.NoDedup = s.cfg.noDedup
	inst := &instance{store: st, payco: payco}
	var store testserver.Store = st
	if s.cfg.unfenced {
		store = &unfencedStore{Store: st}
	}
	inst.mw = &testserver.Middleware{Store: store, LockTimeout: s.cfg.lockTimeout, Optional: s.cfg.optionalKey, Logger: s.cfg.logger}
	app := &payments.App{PayCo: payco}
	if s.cfg.crash != nil {
		app.Faults.Charged = func(c payments.Charge) { s.charged(inst, c) }
	}
	if s.cfg.zombie == nil {
		app.Idempotency = inst.mw
		inst.handler = app.Handler()
	} else {
		// The zombie sits between the Middleware and the charge.
		mux := http.NewServeMux()
		mux.Handle("POST /v1/charges", s.withZombieDone(inst.mw.Wrap(s.zombieHandler(app.Handler()))))
		mux.Handle("/", app.Handler())
		inst.handler = mux
	}
	s.mu.Lock()
	s.instances = append(s.instances, inst)
	s.mu.Unlock()
	return inst, nil
}

// charged runs after each PayCo charge. The first charge of a crash order
// kills the instance: the handler never returns to save or release (the
// process is gone), and a new instance takes over the listener. A dead
// instance's other handlers die at the same point.
func (s *server) charged(inst *instance, c payments.Charge) {
	if !inst.dead.Load() {
		s.mu.Lock()
		crash := !s.crashed[c.OrderID] && s.cfg.crash(c.OrderID)
		if crash {
			s.crashed[c.OrderID] = true
		}
		s.mu.Unlock()
		if !crash {
			return
		}
		inst.dead.Store(true)
		next, err := s.newInstance(context.Background())
		if err == nil {
			s.cur.Store(next)
		}
	}
	<-s.buried
	panic(http.ErrAbortHandler)
}

// Crashes returns how many instances died.
func (s *server) Crashes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.crashed)
}

// decisions sums the Middleware counters of every instance.
func (s *server) decisions() decisions {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d decisions
	for _, inst := range s.instances {
		st := inst.mw.Stats()
		d.Claims += st.Claims
		d.Takeovers += st.Takeovers
		d.Replays += st.Replays
		d.Conflicts += st.Conflicts
		d.Fenced += st.Fenced
		d.Released += st.Released
		d.StoreErrors += st.StoreErrors
	}
	d.SlowestMillis = s.slowest.Milliseconds()
	return d
}

// decisions are the server's idempotency decisions, for the JSON rows.
type decisions struct {
	Claims    int64 `json:"claims"`
	Takeovers int64 `json:"takeovers"`
	Replays   int64 `json:"replays"`
	Conflicts int64 `json:"conflicts"`
	Fenced    int64 `json:"fenced"`
	Released  int64 `json:"released"`
	// StoreErrors are failed store calls: 503 before the handler, or a
	// save or release that did not happen.
	StoreErrors int64 `json:"store_errors"`
	// SlowestMillis is the longest honest charge the server answered,
	// from the moment it had a worker: what the lease must outlast.
	// Zombies and dead instances are not counted.
	SlowestMillis int64 `json:"slowest_ms"`
}

// bury closes the dead instances' stores and then lets their stuck
// handlers return: their late writes fail, as a dead process's would.
func (s *server) bury() {
	s.buryOnce.Do(func() {
		s.mu.Lock()
		for _, inst := range s.instances {
			if inst.dead.Load() {
				inst.store.Close()
			}
		}
		s.mu.Unlock()
		close(s.buried)
	})
}

// Close stops the server and closes every instance.
func (s *server) Close() error {
	s.bury()
	err := s.srv.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inst := range s.instances {
		if !inst.dead.Load() {
			inst.store.Close()
		}
	}
	return err
}

// stats reads PayCo's counts through the server's own GET /v1/stats,
// bypassing the fault proxy.
func (s *server) stats(ctx context.Context) (payments.Stats, error) {
	var st payments.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/v1/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("lab: stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("lab: stats: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("lab: stats: %w", err)
	}
	return st, nil
}

// zombieState follows one zombie order: its first run (the zombie) stalls
// until the second run (the worker that took the claim over) wakes it, and
// that worker waits until the zombie's own write is done before charging.
type zombieState struct {
	runs  int
	wake  chan struct{} // closed by the second run
	wrote chan struct{} // closed once the zombie's release returned
}

type zombieKey struct{}

// zombieRun is set in a request's context by withZombieDone and filled in
// by zombieHandler when the request was a zombie.
type zombieRun struct{ st *zombieState }

// withZombieDone marks the end of a zombie's request, after the Middleware
// released (or failed to release) its claim.
func (s *server) withZombieDone(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := &zombieRun{}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), zombieKey{}, run)))
		if run.st != nil {
			close(run.st.wrote)
		}
	})
}

// zombieBound is the longest a zombie or its successor waits for the
// other, so that a run always ends.
const zombieBound = 20 * time.Second

// zombieHandler stages, for the orders s.cfg.zombie picks, the interleaving
// fencing exists for:
//
//  1. The first run claims the key and stalls (a pause, a slow disk) past
//     the lease, without charging.
//  2. The client's retry finds the claim stale, takes it over and runs.
//     It wakes the zombie and waits until the zombie's write is done.
//  3. The zombie gives up with 502 (its downstream call "timed out"): the
//     Middleware releases its claim. Fenced, the release changes nothing:
//     the claim is the new owner's. Unfenced, it deletes the new owner's
//     claim.
//  4. The new owner charges and saves. Fenced, that is the answer. Unfenced,
//     the save finds no claim and is refused; the client's next retry finds
//     no key at all, claims it afresh and charges the order again.
func (s *server) zombieHandler(app http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := orderOf(r)
		if !s.cfg.zombie(order) {
			app.ServeHTTP(w, r)
			return
		}
		s.mu.Lock()
		st := s.zombies[order]
		if st == nil {
			st = &zombieState{wake: make(chan struct{}), wrote: make(chan struct{})}
			s.zombies[order] = st
		}
		st.runs++
		n := st.runs
		s.mu.Unlock()
		t := time.NewTimer(zombieBound)
		defer t.Stop()
		switch n {
		case 1:
			if run, ok := r.Context().Value(zombieKey{}).(*zombieRun); ok {
				run.st = st
			}
			if wk, ok := r.Context().Value(workerKey{}).(*worker); ok {
				wk.stalled = true
				wk.done() // a stalled process does not hold up the others
			}
			select { // a zombie ignores its context: it does not know it is late
			case <-st.wake:
			case <-s.buried:
			case <-t.C:
			}
			testserver.WriteProblem(w, testserver.Problem{Type: "about:blank", Title: "Downstream timed out",
				Status: http.StatusBadGateway, Detail: "PayCo did not answer in time."}, 0)
			return
		case 2:
			close(st.wake)
			select {
			case <-st.wrote:
			case <-s.buried:
			case <-t.C:
			}
		}
		app.ServeHTTP(w, r)
	})
}

// orderOf reads the order id from a charge request's JSON body and puts the
// body back.
func orderOf(r *http.Request) string {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return ""
	}
	var v struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(b, &v)
	return v.OrderID
}

// unfencedStore is the ablation of fencing: Save and Release act on the
// key's current claim whoever holds it, as SQL without the locked_at
// and claim_id conditions would (UPDATE … WHERE status = 'in_flight',
// DELETE … WHERE status = 'in_flight'). Claim and TakeOver are unchanged.
// It learns the current fence from the claims and take-overs that pass
// through it, so it stands for a store used by one server process.
type unfencedStore struct {
	testserver.Store

	mu      sync.Mutex
	current map[[2]string]testserver.Fence // (scope, key) → fence of the in-flight claim
}

func (u *unfencedStore) set(scope, key string, f testserver.Fence, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.current == nil {
		u.current = map[[2]string]testserver.Fence{}
	}
	if ok {
		u.current[[2]string{scope, key}] = f
	} else {
		delete(u.current, [2]string{scope, key})
	}
}

func (u *unfencedStore) fence(scope, key string) (testserver.Fence, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.current[[2]string{scope, key}]
	return t, ok
}

func (u *unfencedStore) Claim(ctx context.Context, scope, key, fp string, f testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	e, claimed, err := u.Store.Claim(ctx, scope, key, fp, f, now)
	if err == nil && claimed {
		u.set(scope, key, f, true)
	}
	return e, claimed, err
}

func (u *unfencedStore) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	won, err := u.Store.TakeOver(ctx, scope, key, old, new)
	if err == nil && won {
		u.set(scope, key, new, true)
	}
	return won, err
}

// Save ignores the fence: it saves over whichever claim is in flight.
func (u *unfencedStore) Save(ctx context.Context, scope, key string, _ testserver.Fence, resp testserver.Response) error {
	cur, ok := u.fence(scope, key)
	if !ok {
		return testserver.ErrFenced // no claim in flight: 0 rows changed
	}
	err := u.Store.Save(ctx, scope, key, cur, resp)
	if err == nil {
		u.set(scope, key, testserver.Fence{}, false)
	}
	return err
}

// Release ignores the fence: it deletes whichever claim is in flight.
func (u *unfencedStore) Release(ctx context.Context, scope, key string, _ testserver.Fence) (bool, error) {
	cur, ok := u.fence(scope, key)
	if !ok {
		return false, nil
	}
	released, err := u.Store.Release(ctx, scope, key, cur)
	if err == nil && released {
		u.set(scope, key, testserver.Fence{}, false)
	}
	return released, err
}
