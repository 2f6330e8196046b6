// Command lab charges orders through a fault-injecting proxy, once per retry
// strategy, and counts what the server's payment processor charged:
//
//	go run ./examples/lab                 # 100 orders, seed 1: the table
//	go run ./examples/lab -n 500 -seed 7  # more orders, other faults
//	go run ./examples/lab -json           # the same rows as JSON lines
//
// Each strategy gets a fresh reference server in this process (the payments
// API of testserver/payments behind testserver.Middleware, keys and ledger
// in one SQLite file in a temporary directory) and a fresh
// internal/faultproxy in front of it, which by a seeded draw per request
// drops the answer after the server committed, resets the connection
// before forwarding, or holds the request past the client's attempt
// timeout and forwards it anyway.
//
// The rows:
//
//	no-key                  retry loop on plain net/http, no key
//	key-per-try             the same loop with a new key on every attempt
//	idem                    the SDK: one key per order, kept in a SQLite jar
//	idem + client restarts  the SDK in client processes killed with SIGKILL
//	                        at random points; each restart resumes the jar
//	idem + server crash     the server dies right after charging; a new one
//	                        takes the stale claim over after the lease, and
//	                        PayCo's key charge:<order_id> stops a second charge
//	idem + stalled worker   a server worker stalls past its lease; the client's
//	                        retry takes its claim over and charges, and the
//	                        stale worker's release, fenced, leaves that claim
//	unfenced store          the same, with a store without the fence
//	                        condition on its writes: the release deletes it
//
// PayCo ignores its own key (charges on every call) in every row but the
// server crash, so that only the strategy under test stands between a
// retry and a second charge. The server runs four charges at a time; the
// others wait before their claim, so that its lease (5 s) outlasts every
// honest run. The server crash row has no such bound (a dead instance
// keeps its requests) and a lease of 1 s, so that a new instance soon
// takes over; there PayCo's key stops a second charge, whether the run
// taken over was dead or only slow. The counts come from PayCo's ledger,
// the proxy's counters and the jar, never from the strategy itself. -json
// adds the details: charge calls before PayCo's dedup, kills, crashes,
// fault and decision counters, and the most common last error the jar
// recorded for unresolved orders, which the table gives in a warning.
//
// -h prints the flags and exits 0. A mistake in the command line (a flag
// that does not parse, a value out of range, an argument) exits with
// status 2, and a run that fails with status 1, as the go tools do; a flag
// that does not parse is told once, by the flag package, above the flags.
// SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed) stops the run:
// the row under way closes its server and proxy and removes its temporary
// directory, no table is printed, and the process ends by that signal,
// which a shell reports as status 130 for SIGINT and 143 for SIGTERM
// (started with SIGINT ignored, it exits with status 130; started with
// SIGHUP ignored, as by nohup, it ignores SIGHUP). A terminal's Ctrl-C or
// closing, which signals the client processes of idem + client restarts
// too, stops it the same way: they ignore SIGINT, SIGTERM and SIGHUP, and
// the lab ends them. A second signal
// ends it at once. However the lab ends (a second signal, a SIGKILL, a
// crash), its client processes end with it: each reads EOF on its stdin, a
// pipe only the lab holds open.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/stopsig"
)

func main() {
	if os.Getenv(childEnv) == "client" {
		os.Exit(childMain(os.Args[1:]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := stopsig.Notify(cancel)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	if s := stop.Signal(); s != nil {
		// The run stopped, its server and proxy closed and its temporary
		// directory removed. The process ends by the signal, as idemserver
		// ends by a second one, so that a shell tells it (130 for SIGINT)
		// and a script that ran the lab stops too; the row's error, a
		// canceled context, says nothing more.
		stop.Exit(s)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed, as the go tools print it, and exits 0
	}
	cliflag.Exit("lab", err)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.orders, "n", cfg.orders, "orders to charge per strategy")
	fs.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of which requests get a fault (by their order of arrival), which orders crash the server or stall a worker, and when the restarts row kills its client; the SDK's jitter, keys and timing are not seeded")
	fs.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "orders in flight at once")
	fs.Float64Var(&cfg.rates.DropResponse, "drop", cfg.rates.DropResponse, "share of requests whose answer is dropped after the server committed")
	fs.Float64Var(&cfg.rates.Reset, "reset", cfg.rates.Reset, "share of requests reset before reaching the server")
	fs.Float64Var(&cfg.rates.Delay, "delay", cfg.rates.Delay, "share of requests held past the client's attempt timeout, then forwarded")
	cliflag.DurationVar(fs, &cfg.attemptTimeout, "attempt-timeout", cfg.attemptTimeout, "the clients' limit on one attempt (a `duration`, less than 30s: a call's budget); delayed requests are held 1.5 times as long")
	asJSON := fs.Bool("json", false, "print the rows as JSON lines")
	only := fs.String("rows", "", "comma-separated strategies to run, each at most once (default: all)")
	verbose := fs.Bool("v", false, "log the server's idempotency decisions to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &cliflag.UsageError{Err: err, Printed: true}
	}
	if fs.NArg() > 0 {
		return cliflag.Usagef("unexpected arguments %q", fs.Args())
	}
	if cfg.orders < 1 || cfg.orders > 99999 {
		return cliflag.Usagef("-n %d: want 1 to 99999 orders", cfg.orders)
	}
	if cfg.attemptTimeout <= 0 || cfg.attemptTimeout >= maxElapsed {
		// From a call's budget on, an attempt that times out ends its
		// call: no timed-out attempt would be retried.
		return cliflag.Usagef("-attempt-timeout %v: want a positive duration less than %v, a call's budget", cfg.attemptTimeout, maxElapsed)
	}
	cfg.hold = cfg.attemptTimeout * 3 / 2
	if err := cfg.rates.Validate(); err != nil {
		return &cliflag.UsageError{Err: err} // -drop, -reset, -delay
	}
	if cfg.concurrency < 1 {
		return cliflag.Usagef("-concurrency %d: want at least 1", cfg.concurrency)
	}
	names := allRows
	if *only != "" {
		names = nil
		for n := range strings.SplitSeq(*only, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(allRows, n) {
				return cliflag.Usagef("-rows: unknown strategy %q; want some of %q", n, allRows)
			}
			if slices.Contains(names, n) {
				// It would run again, a second row of the same name.
				return cliflag.Usagef("-rows: strategy %q given twice; want each at most once", n)
			}
			names = append(names, n)
		}
	}

	if *verbose {
		cfg.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p := newProgress(stderr, len(names))
	cfg.progress = p.update
	var rows []row
	for i, name := range names {
		p.start(i, name)
		r, err := runRow(ctx, cfg, name)
		if err != nil {
			p.clear()
			return err
		}
		p.finish(r)
		rows = append(rows, r)
	}
	p.clear()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	printTable(stdout, cfg, rows)
	return nil
}

func printTable(w io.Writer, cfg config, rows []row) {
	head := []string{"strategy", "requests sent", "charges", "double-charged orders", "unresolved orders"}
	cells := [][]string{head}
	for _, r := range rows {
		unresolved := "-"
		if r.Unresolved != nil {
			unresolved = strconv.Itoa(*r.Unresolved)
		}
		cells = append(cells, []string{r.Strategy, strconv.FormatInt(r.Requests, 10), strconv.Itoa(r.Charges),
			strconv.Itoa(r.DoubleCharged), unresolved})
	}
	width := make([]int, len(head))
	for _, c := range cells {
		for i, s := range c {
			width[i] = max(width[i], len(s))
		}
	}
	for _, c := range cells {
		line := fmt.Sprintf("%-*s", width[0], c[0])
		for i := 1; i < len(c); i++ {
			line += fmt.Sprintf("  %*s", width[i], c[i])
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "\n%d orders per strategy, %d at a time, seed %d, attempt timeout %v; faults per request: answer dropped %.0f%%, reset %.0f%%, delayed %.0f%%\n",
		cfg.orders, cfg.concurrency, cfg.seed, cfg.attemptTimeout, 100*cfg.rates.DropResponse, 100*cfg.rates.Reset, 100*cfg.rates.Delay)
	for _, r := range rows {
		if r.Lost > 0 && r.Unresolved != nil {
			fmt.Fprintf(w, "warning: %s: %d orders neither charged nor pending in the jar\n", r.Strategy, r.Lost)
		}
		if r.Unresolved != nil && *r.Unresolved > 0 {
			fmt.Fprintf(w, "warning: %s: %d orders got no final answer in any attempt; the jar's most common last error: %q\n",
				r.Strategy, *r.Unresolved, r.LastError)
		}
	}
	printLegend(w, cfg, rows, width[0])
}

// rowMeaning says in one line what each strategy of the table does.
var rowMeaning = map[string]string{
	rowNoKey:     "a retry loop without a key: a retry after a lost answer charges again",
	rowKeyPerTry: "a new key on every attempt: the server cannot tell a retry, the same damage",
	rowIdem:      "this SDK: one key per order, in its jar before the first send, on every retry",
	rowRestarts:  "the same, in client processes killed with SIGKILL; each restart resumes its jar",
	rowCrash:     "the server dies after charging; a new one takes the claim over; PayCo's key stops a 2nd charge",
	rowStalled:   "a server worker stalls past its lease and is taken over; its fenced release leaves the new claim",
	rowUnfenced:  "ablation: the same without fenced writes: the stale release deletes the new claim, a retry recharges",
}

// printLegend explains the table below it: the columns, the rows shown
// and what their counts prove.
func printLegend(w io.Writer, cfg config, rows []row, nameWidth int) {
	fmt.Fprintf(w, "\n%s\n%s\n%s\n%s\n\n",
		"requests sent: requests the clients sent to the server, through the fault proxy, retries included",
		"charges: charges PayCo, the server's payment processor, made; one per order is right",
		"double-charged orders: orders PayCo charged more than once",
		"unresolved orders: orders the client's jar still holds pending or to reconcile (-: no jar)")
	sdk := false
	for _, r := range rows {
		fmt.Fprintf(w, "%-*s  %s\n", nameWidth, r.Strategy, rowMeaning[r.Strategy])
		sdk = sdk || r.Strategy == rowIdem || r.Strategy == rowRestarts || r.Strategy == rowCrash || r.Strategy == rowStalled
	}
	fmt.Fprintln(w, "\nPayCo's own dedup is off in every row but the server crash, so only the strategy stands")
	fmt.Fprintln(w, "between a retry and a second charge.")
	if sdk {
		fmt.Fprintf(w, "In the idem rows, %d charges, 0 double-charged and 0 unresolved mean every order charged once.\n", cfg.orders)
	}
}

// progress writes one line to stderr that says where the run is: rewritten
// in place on a terminal, one line per strategy otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	total int

	mu    sync.Mutex
	i     int
	name  string
	last  time.Time
	width int
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) start(i int, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.i, p.name = i, name
	p.show(fmt.Sprintf("lab [%d/%d] %s: starting", i+1, p.total, name), true)
}

func (p *progress) update(name string, done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty || (done < total && time.Since(p.last) < 100*time.Millisecond) {
		return
	}
	p.last = time.Now()
	p.show(fmt.Sprintf("lab [%d/%d] %s: %d/%d orders", p.i+1, p.total, name, done, total), false)
}

func (p *progress) finish(r row) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.show(fmt.Sprintf("lab [%d/%d] %s: done in %.1fs", p.i+1, p.total, r.Strategy, r.Seconds), true)
}

// show writes line: over the previous one on a terminal; on its own line
// otherwise, when always.
func (p *progress) show(line string, always bool) {
	if !p.tty {
		if always {
			fmt.Fprintln(p.w, line)
		}
		return
	}
	pad := max(p.width-len(line), 0)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
	p.width = len(line)
}

func (p *progress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
}
