package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/keyjar"
)

// The rows of the table, in order.
const (
	rowNoKey     = "no-key"
	rowKeyPerTry = "key-per-try"
	rowIdem      = "idem"
	rowRestarts  = "idem + client restarts"
	rowCrash     = "idem + server crash"
	rowStalled   = "idem + stalled worker"
	rowUnfenced  = "unfenced store"
)

var allRows = []string{rowNoKey, rowKeyPerTry, rowIdem, rowRestarts, rowCrash, rowStalled, rowUnfenced}

// config is one run of the lab.
type config struct {
	orders      int
	seed        uint64
	rates       faultproxy.Rates
	concurrency int // orders in flight at once, per client process

	attemptTimeout time.Duration // the clients' per-attempt limit
	hold           time.Duration // how long the proxy holds a Delay fault; longer than attemptTimeout
	drain          time.Duration // how long past hold a row waits, at its end, for the requests the proxy still has
	lockTimeout    time.Duration // the server's lease, for the keyed rows
	crashLease     time.Duration // the server's lease in idem + server crash: how soon a new instance takes over
	crashRate      float64       // idem + server crash: share of orders whose charge kills the server
	zombieRate     float64       // stalled worker, unfenced store: share of orders with a zombie first run
	maxKills       int           // idem + client restarts: most SIGKILLs, at most one per 10 orders

	dir string // parent of each row's temporary directory

	logger *slog.Logger // the server's decisions; nil means silent

	// progress, when not nil, is told of each order the strategy settles.
	progress func(row string, done, total int)

	// Ablations, used by the chaos tests to show that they catch each bug.
	ablate ablation
}

// ablation deliberately breaks one mechanism.
type ablation struct {
	newKeyPerAttempt bool // idem: every attempt carries a fresh key, as if the Transport minted one per attempt
	freshJar         bool // idem + client restarts: each client process starts with an empty jar
	noDownstreamKey  bool // idem + server crash: PayCo ignores charge:<order_id>
}

func defaultConfig() config {
	return config{
		orders:         100,
		seed:           1,
		rates:          faultproxy.Rates{DropResponse: 0.12, Reset: 0.08, Delay: 0.08},
		concurrency:    16,
		attemptTimeout: time.Second,
		hold:           1500 * time.Millisecond,
		drain:          time.Minute,
		lockTimeout:    5 * time.Second,
		crashLease:     time.Second,
		crashRate:      0.05,
		zombieRate:     0.10,
		maxKills:       8,
	}
}

// serverWorkers is how many charges the lab's server serves at once; the
// others wait before their claim, outside the lease.
const serverWorkers = 4

// row is one line of the table. Every count comes from the server's PayCo
// ledger, the fault proxy's counters or the client's jar, never from the
// strategy's own bookkeeping.
type row struct {
	Strategy string `json:"strategy"`
	// Requests is what reached the fault proxy.
	Requests int64 `json:"requests_sent"`
	// Charges and DoubleCharged are the charges PayCo made and the orders
	// it charged more than once.
	Charges       int `json:"charges"`
	DoubleCharged int `json:"double_charged_orders"`
	// Unresolved are the orders pending or to reconcile in the jar; nil
	// for the baselines, which have no jar.
	Unresolved *int `json:"unresolved_orders"`
	// LastError is the most common last outcome the jar records for the
	// unresolved orders: an attempt's error, or the status of a retryable
	// answer.
	LastError string `json:"unresolved_last_error,omitempty"`
	// Lost are the orders that PayCo never charged and that the jar does
	// not report unresolved: silently lost. Baselines, without a jar,
	// count every uncharged order.
	Lost int `json:"lost_orders"`
	// ChargeCalls are PayCo's charge calls before its own dedup: the
	// handler runs. They exceed Charges only with the downstream key.
	ChargeCalls int `json:"charge_calls"`
	// Restarts and Crashes are the client processes killed and the server
	// instances that died.
	Restarts int              `json:"client_kills,omitempty"`
	Crashes  int              `json:"server_crashes,omitempty"`
	Faults   faultproxy.Stats `json:"faults"`
	Server   decisions        `json:"server"`
	Seconds  float64          `json:"seconds"`
}

// order is one charge to make.
type order struct {
	ID     string
	Amount int64
}

func (o order) op() string { return "charge:" + o.ID }

func (o order) body() map[string]any {
	return map[string]any{"order_id": o.ID, "amount": o.Amount, "currency": "usd"}
}

func orders(n int) []order {
	out := make([]order, n)
	for i := range out {
		out[i] = order{ID: fmt.Sprintf("order-%04d", i+1), Amount: int64(1000 + i)}
	}
	return out
}

// pick returns a seeded choice of orders: round(rate × len(from)) of them,
// at least one, drawn by the seed and the row alone.
func pick(seed uint64, row string, rate float64, from []order) func(string) bool {
	h := fnv.New64a()
	h.Write([]byte(row))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	k := max(int(math.Round(rate*float64(len(from)))), 1)
	chosen := map[string]bool{}
	for _, i := range rng.Perm(len(from))[:min(k, len(from))] {
		chosen[from[i].ID] = true
	}
	return func(orderID string) bool { return chosen[orderID] }
}

// env is what a strategy runs against.
type env struct {
	cfg      config
	row      string
	url      string // the fault proxy's base URL
	jarPath  string
	orders   []order
	settled  atomic.Int64
	restarts int
}

func (e *env) done() {
	n := e.settled.Add(1)
	if e.cfg.progress != nil {
		e.cfg.progress(e.row, int(n), len(e.orders))
	}
}

// runRow runs one strategy against a fresh server and proxy, and counts.
func runRow(ctx context.Context, cfg config, name string) (row, error) {
	start := time.Now()
	dir, err := os.MkdirTemp(cfg.dir, "lab-"+strings.NewReplacer(" ", "", "+", "-").Replace(name)+"-")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)

	all := orders(cfg.orders)
	sc := serverConfig{path: filepath.Join(dir, "server.db"), noDedup: true, lockTimeout: cfg.lockTimeout, logger: cfg.logger, workers: serverWorkers}
	switch name {
	case rowNoKey, rowKeyPerTry:
		sc.optionalKey = true
	case rowCrash:
		sc.lockTimeout = cfg.crashLease
		sc.workers = 0
		sc.noDedup = cfg.ablate.noDownstreamKey
		sc.crash = pick(cfg.seed, name, cfg.crashRate, all)
	case rowStalled, rowUnfenced:
		// The same orders stall in both rows: they differ by the fencing
		// of the store's writes alone.
		sc.zombie = pick(cfg.seed, rowUnfenced, cfg.zombieRate, all)
		sc.unfenced = name == rowUnfenced
	case rowIdem, rowRestarts:
	default:
		return row{}, fmt.Errorf("lab: unknown row %q", name)
	}
	srv, err := startServer(ctx, sc)
	if err != nil {
		return row{}, err
	}
	defer srv.Close()
	px := &faultproxy.Proxy{Target: srv.URL(), Seed: cfg.seed, Rates: cfg.rates, Delay: cfg.hold}
	if err := px.Start(); err != nil {
		return row{}, err
	}
	defer px.Close()

	e := &env{cfg: cfg, row: name, url: px.URL(), jarPath: filepath.Join(dir, "keys.db"), orders: all}
	switch name {
	case rowNoKey:
		err = runNaive(ctx, e, false)
	case rowKeyPerTry:
		err = runNaive(ctx, e, true)
	case rowRestarts:
		err = runRestarts(ctx, e)
	default:
		err = runIdem(ctx, e)
	}
	if err != nil {
		return row{}, fmt.Errorf("%s: %w", name, err)
	}

	// Let the dead server instances' stuck requests end, then wait for
	// every request the proxy still holds: a delayed request may charge
	// after the client is done, up to a hold later (and its forward takes
	// up to the proxy's 30 s upstream timeout, within drain).
	srv.bury()
	sctx, cancel := context.WithTimeout(ctx, cfg.hold+cfg.drain)
	defer cancel()
	if err := px.Shutdown(sctx); err != nil {
		return row{}, fmt.Errorf("%s: waiting for held requests: %w", name, err)
	}
	st, err := srv.stats(ctx)
	if err != nil {
		return row{}, err
	}
	r := row{Strategy: name, Requests: px.Stats().Received, Charges: st.Settled, DoubleCharged: st.SettledDoubleCharged,
		ChargeCalls: st.Charges, Restarts: e.restarts, Crashes: srv.Crashes(), Faults: px.Stats(), Server: srv.decisions()}
	// PerOrder counts PayCo's calls: each one a charge when PayCo ignores
	// its key; with its key, charge:<order_id>, one charge per order at
	// most, and a second call (a take-over's run) charges nothing.
	for _, o := range e.orders {
		if n := st.PerOrder[o.ID]; n > 1 && sc.noDedup && cfg.logger != nil {
			cfg.logger.Warn("lab: order charged more than once", "row", name, "order", o.ID, "calls", n)
		}
	}
	unresolved := map[string]string{}
	if name != rowNoKey && name != rowKeyPerTry {
		unresolved, err = unresolvedOps(ctx, e.jarPath)
		if err != nil {
			return row{}, err
		}
		n := len(unresolved)
		r.Unresolved = &n
		r.LastError = mostCommon(unresolved)
	}
	for _, o := range e.orders {
		if _, ok := unresolved[o.op()]; !ok && st.PerOrder[o.ID] == 0 {
			r.Lost++
		}
	}
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// unresolvedOps returns the operations the jar at path holds pending or to
// reconcile, each with its last attempt's outcome: the error, or the
// status of a retryable answer.
func unresolvedOps(ctx context.Context, path string) (map[string]string, error) {
	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	defer jar.Close()
	out := map[string]string{}
	for _, s := range []idem.State{idem.StatePending, idem.StateReconcile} {
		recs, err := jar.List(ctx, idem.Filter{State: s})
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			out[r.Op] = r.LastError
			if r.LastError == "" && r.LastStatus != 0 {
				out[r.Op] = "status " + strconv.Itoa(r.LastStatus)
			}
		}
	}
	return out, nil
}

// mostCommon returns the value that most keys of m have, the least of
// them on a tie; "" for an empty m.
func mostCommon(m map[string]string) string {
	count := map[string]int{}
	best := ""
	for _, v := range m {
		count[v]++
	}
	for v, n := range count {
		if n > count[best] || (n == count[best] && v < best) {
			best = v
		}
	}
	return best
}

// forEach runs f for each item, n at a time, until ctx ends. It starts no
// more goroutines than there are items.
func forEach[T any](ctx context.Context, n int, items []T, f func(T)) {
	ch := make(chan T)
	var wg sync.WaitGroup
	for range min(max(n, 1), len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				f(it)
			}
		}()
	}
	for _, it := range items {
		select {
		case ch <- it:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
}
