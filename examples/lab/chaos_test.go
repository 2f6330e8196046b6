package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/faultproxy"
)

// TestMain lets the test binary serve as the client process of idem +
// client restarts, which re-executes the running binary, and as the lab
// command itself for TestCommandExitStatus (roleCommand).
func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "client":
		if sig, err := strconv.Atoi(os.Getenv(clientSignalEnv)); err == nil {
			signalOnFirstLine(syscall.Signal(sig))
		}
		if os.Getenv(clientOrphanEnv) != "" {
			tellOnFirstLine()
		}
		os.Exit(childMain(os.Args[1:]))
	case roleCommand:
		main()
		os.Exit(0) // main returned: the exit status of a run that succeeded
	}
	os.Exit(m.Run())
}

// roleCommand, as childEnv, makes the test binary run the lab's main.
const roleCommand = "command"

// clientSignalEnv, set to a signal's number, makes the test binary, as a
// client process of idem + client restarts, send itself that signal once
// it prints its first line (see signalOnFirstLine).
const clientSignalEnv = "IDEM_LAB_TEST_CLIENT_SIGNAL"

// clientOrphanEnv, set, makes the test binary, as a client process of
// idem + client restarts, ignore SIGPIPE and write a line to file
// descriptor 3 once it prints its first line (see tellOnFirstLine).
const clientOrphanEnv = "IDEM_LAB_TEST_CLIENT_ORPHAN"

// signalOnFirstLine makes the client process send itself sig once it
// prints its first line, well past its start, as a terminal's signal to
// the process group may reach it before it reaches the lab; and, if the
// signal leaves it running, write a line to file descriptor 3, which its
// lab inherited from TestCommandStopsOnSignal.
func signalOnFirstLine(sig syscall.Signal) {
	onFirstLine(func() {
		if p, _ := os.FindProcess(os.Getpid()); p.Signal(sig) == nil && signal.Ignored(sig) {
			// Ignored, it is gone once Signal returned. Otherwise it ends
			// the process, soon (it may reach another thread): no line.
			running := os.NewFile(3, "running")
			running.WriteString("running\n")
			running.Close()
		}
	})
}

// tellOnFirstLine makes the client process write a line to file
// descriptor 3, which its lab inherited from TestClientsEndWithTheLab,
// once it prints its first line, and keep it open to its end. It ignores
// SIGPIPE: its next write to the pipe of a lab that is gone does not end
// it, as it would not end a client process that waits (a backoff, a
// Retry-After) and has nothing to write, so that only the lab's end can.
func tellOnFirstLine() {
	signal.Ignore(syscall.SIGPIPE)
	onFirstLine(func() {
		// No *os.File, which would close the descriptor once collected.
		syscall.Write(3, []byte("running\n"))
	})
}

// onFirstLine calls f once the client process printed its first line,
// before the line reaches its lab.
func onFirstLine(f func()) {
	r, w, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	go func() {
		in := bufio.NewReader(r)
		line, err := in.ReadString('\n')
		if err == nil {
			f()
		}
		stdout.WriteString(line)
		io.Copy(stdout, in)
	}()
}

// The tests that run rows run in parallel: each row has its own server,
// proxy and temporary directory, so they share nothing, and they spend
// most of their time waiting (attempt timeouts, held requests, leases).
// TestForEachWorkers, which counts the process's goroutines, does not:
// it runs before them.

// size shrinks an order count under -short.
func size(n int) int {
	if testing.Short() {
		return max(n/5, 40)
	}
	return n
}

// chaosConfig is the lab's configuration with a shorter attempt timeout,
// so that the waits a delay costs are shorter.
func chaosConfig(t *testing.T, orders int, rates faultproxy.Rates) config {
	cfg := defaultConfig()
	cfg.orders = orders
	cfg.rates = rates
	cfg.attemptTimeout = 750 * time.Millisecond
	cfg.hold = 1100 * time.Millisecond
	cfg.dir = t.TempDir()
	return cfg
}

// job is one row to run.
type job struct {
	cfg  config
	name string
}

// runRows runs the jobs at the same time and returns their rows in order.
// A row that fails to run fails the test.
func runRows(t *testing.T, jobs ...job) []row {
	t.Helper()
	rows := make([]row, len(jobs))
	errs := make([]error, len(jobs))
	logs := make([]bytes.Buffer, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		// Warnings and errors only: take-overs, fenced writes, store errors.
		j.cfg.logger = slog.New(slog.NewTextHandler(&logs[i], &slog.HandlerOptions{Level: slog.LevelWarn}))
		wg.Go(func() { rows[i], errs[i] = runRow(t.Context(), j.cfg, j.name) })
	}
	wg.Wait()
	for i, r := range rows {
		if errs[i] != nil {
			t.Fatalf("%s: %v", jobs[i].name, errs[i])
		}
		b, _ := json.Marshal(r)
		t.Logf("%s", b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range jobs {
				t.Logf("%s: server warnings:\n%s", jobs[i].name, logs[i].String())
			}
		}
	})
	return rows
}

// chargedOnce checks the promise of every idem row, as README states it:
// each order charged once at PayCo, and none left unresolved in the jar.
// With 8 attempts per call and 8 passes over the pending orders, an order
// still unresolved at 30 % faults is a bug (an answer not recorded, a
// claim never taken over), not bad luck.
func chargedOnce(t *testing.T, r row, orders int) {
	t.Helper()
	if r.DoubleCharged != 0 {
		t.Errorf("%s: %d double-charged orders; want 0", r.Strategy, r.DoubleCharged)
	}
	if r.Lost != 0 {
		t.Errorf("%s: %d orders neither charged nor unresolved in the jar; want 0", r.Strategy, r.Lost)
	}
	if r.Unresolved == nil {
		t.Fatalf("%s: no jar count", r.Strategy)
	}
	if *r.Unresolved != 0 {
		t.Errorf("%s: %d orders unresolved in the jar; want 0", r.Strategy, *r.Unresolved)
	}
	if r.Charges != orders {
		t.Errorf("%s: %d charges for %d orders; want one each", r.Strategy, r.Charges, orders)
	}
}

func doubleCharges(t *testing.T, r row) {
	t.Helper()
	if r.DoubleCharged == 0 {
		t.Errorf("%s: no double-charged order; want some (the faults or the planted bug must bite)", r.Strategy)
	}
}

// TestChaosFaultKinds sends 500 orders with one fault kind at 30 % of the
// requests: the SDK charges each order once; the baselines charge some
// twice whenever the fault can hide a committed charge (a dropped answer,
// a request delayed past the client's timeout). A reset before forwarding
// never reaches the server, so the baselines cannot double-charge there:
// the proxy's counter shows that the fault bit.
func TestChaosFaultKinds(t *testing.T) {
	t.Parallel()
	n := size(500)
	kinds := []struct {
		name      string
		rates     faultproxy.Rates
		baselines bool
		bit       func(faultproxy.Stats) int64
	}{
		{"drop", faultproxy.Rates{DropResponse: 0.3}, true, func(s faultproxy.Stats) int64 { return s.Dropped }},
		{"delay", faultproxy.Rates{Delay: 0.3}, true, func(s faultproxy.Stats) int64 { return s.Delayed }},
		{"reset", faultproxy.Rates{Reset: 0.3}, false, func(s faultproxy.Stats) int64 { return s.Reset }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			cfg := chaosConfig(t, n, k.rates)
			jobs := []job{{cfg, rowIdem}}
			if k.baselines {
				jobs = append(jobs, job{cfg, rowNoKey}, job{cfg, rowKeyPerTry})
			}
			rows := runRows(t, jobs...)
			chargedOnce(t, rows[0], n)
			if got := k.bit(rows[0].Faults); got < int64(n)/5 {
				t.Errorf("idem: %s faults: got %d for %d orders; want about 30 %% of the requests", k.name, got, n)
			}
			for _, r := range rows[1:] {
				doubleCharges(t, r)
			}
		})
	}
}

// TestChaosIdemRows runs the rows where a process dies: the client (SIGKILL
// and restart from the jar) and the server (a new instance takes the stale
// claim over), with every fault kind at once, 30 % of the requests in all.
func TestChaosIdemRows(t *testing.T) {
	t.Parallel()
	n := size(500)
	mixed := faultproxy.Rates{DropResponse: 0.1, Reset: 0.1, Delay: 0.1}
	cfg := chaosConfig(t, n, mixed)
	rows := runRows(t, job{cfg, rowRestarts}, job{cfg, rowCrash})
	restarts, crash := rows[0], rows[1]
	chargedOnce(t, restarts, n)
	if restarts.Restarts == 0 {
		t.Error("no client process was killed")
	}
	chargedOnce(t, crash, n)
	if crash.Crashes == 0 || crash.ChargeCalls <= crash.Charges {
		t.Errorf("crashes %d, charge calls %d, charges %d: want crashes, and take-overs that called PayCo again", crash.Crashes, crash.ChargeCalls, crash.Charges)
	}
	// PayCo dedups in this row, so its charges cannot show a client that
	// sends an order under a second key; its calls can: every call beyond
	// one per order must be a run after a take-over of the order's claim,
	// or after its release (a handler that failed, its PayCo call's answer
	// lost, say, which a loaded machine makes more of).
	if extra := int64(crash.ChargeCalls - n); extra > crash.Server.Takeovers+crash.Server.Released {
		t.Errorf("idem + server crash: %d charge calls beyond one per order, %d take-overs, %d claims released: want each extra call to be a run after a take-over or a release",
			extra, crash.Server.Takeovers, crash.Server.Released)
	}
}

// TestChaosCatchesBrokenVariants plants each bug the SDK and the store
// exist to prevent, and checks that the chaos run catches it: the broken
// variant double-charges where the real one, in the same run
// configuration, does not.
func TestChaosCatchesBrokenVariants(t *testing.T) {
	t.Parallel()
	n := size(100)
	cases := []struct {
		name, row string
		// broken is the row of the broken variant, when it is a row of the
		// lab's own; "" means row with break_.
		broken string
		rates  faultproxy.Rates
		break_ func(*ablation)
	}{
		// The Transport mints a new key per attempt: each retry is a new
		// operation for the server.
		{"new key per attempt", rowIdem, "", faultproxy.Rates{DropResponse: 0.3}, func(a *ablation) { a.newKeyPerAttempt = true }},
		// The jar is not consulted after a restart: the new process sends
		// the orders left pending with new keys.
		{"fresh jar after restart", rowRestarts, "", faultproxy.Rates{DropResponse: 0.3}, func(a *ablation) { a.freshJar = true }},
		// The store's writes are unfenced: a zombie's release deletes the
		// claim of the worker that took over. The lab shows both rows.
		{"unfenced store", rowStalled, rowUnfenced, faultproxy.Rates{DropResponse: 0.1}, nil},
		// No downstream key: the worker that takes over from a dead server
		// charges again.
		{"no downstream key", rowCrash, "", faultproxy.Rates{DropResponse: 0.1}, func(a *ablation) { a.noDownstreamKey = true }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			real := chaosConfig(t, n, c.rates)
			broken := chaosConfig(t, n, c.rates)
			brokenRow := c.row
			if c.broken != "" {
				brokenRow = c.broken
			} else {
				c.break_(&broken.ablate)
			}
			rows := runRows(t, job{real, c.row}, job{broken, brokenRow})
			chargedOnce(t, rows[0], n)
			doubleCharges(t, rows[1])
			if c.row == rowStalled && rows[0].Server.Takeovers == 0 {
				t.Errorf("%s: no claim taken over: the stalled workers were not staged", rows[0].Strategy)
			}
		})
	}
}

// TestLabCommand runs the command as README shows it, on a few orders, in
// both output formats.
func TestLabCommand(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if err := run(t.Context(), []string{"-n", "10", "-attempt-timeout", "500ms", "-json"}, &out, &errb); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	var names []string
	dec := json.NewDecoder(&out)
	for range len(allRows) + 1 {
		var r row
		if err := dec.Decode(&r); err != nil {
			break
		}
		names = append(names, r.Strategy)
		if r.Requests < 10 {
			t.Errorf("%s: %d requests for 10 orders", r.Strategy, r.Requests)
		}
		if (r.Strategy == rowNoKey || r.Strategy == rowKeyPerTry) != (r.Unresolved == nil) {
			t.Errorf("%s: unresolved %v: want a count exactly for the rows with a jar", r.Strategy, r.Unresolved)
		}
	}
	if got, want := strings.Join(names, ","), strings.Join(allRows, ","); got != want {
		t.Fatalf("rows: got %s; want %s", got, want)
	}
	if !strings.Contains(errb.String(), "lab [7/7] unfenced store") {
		t.Errorf("progress on stderr: got %q", errb.String())
	}

	out.Reset()
	if err := run(t.Context(), []string{"-n", "5", "-rows", "no-key,idem", "-drop", "0", "-reset", "0", "-delay", "0"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "strategy") || !strings.HasPrefix(lines[1], "no-key") || !strings.HasPrefix(lines[2], "idem") {
		t.Fatalf("table:\n%s", out.String())
	}
	if f := strings.Fields(lines[2]); len(f) != 5 || f[2] != "5" || f[3] != "0" || f[4] != "0" {
		t.Errorf("idem without faults: got %q; want 5 charges, 0 double-charged, 0 unresolved", lines[2])
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-n", "0"}, {"-concurrency", "0"}, {"-rows", "nope"}, {"-drop", "0.8", "-reset", "0.5"}, {"extra"}} {
		var out, errb bytes.Buffer
		if err := run(t.Context(), args, &out, &errb); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// TestRunRefusesDuplicateRows: a strategy named twice in -rows is a usage
// error, before any row runs: it ran twice, and printed two rows of one
// name.
func TestRunRefusesDuplicateRows(t *testing.T) {
	for _, rows := range []string{"idem,idem", "no-key, idem,no-key"} {
		var out, errb bytes.Buffer
		err := run(t.Context(), []string{"-rows", rows, "-n", "1", "-drop", "0", "-reset", "0", "-delay", "0"}, &out, &errb)
		var ue *cliflag.UsageError
		if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), "-rows: ") || !strings.Contains(err.Error(), "twice") || out.Len() > 0 {
			t.Errorf("-rows %q: %v, output %q; want a usage error naming -rows and the strategy given twice, no row run", rows, err, out.String())
		}
	}
}

// TestRunRefusesAttemptTimeoutPastItsBudget: an attempt timeout as long as
// a call's budget (the lab's MaxElapsed, 30 s) or longer is refused, by its
// flag, before anything runs: an attempt that times out then ends its call
// with no retry, and a delay holds a request 1.5 times as long. Near the
// largest duration that hold overflowed: delayed requests were then held
// the proxy's default 1 s and answered in time.
func TestRunRefusesAttemptTimeoutPastItsBudget(t *testing.T) {
	for _, d := range []string{"30s", "24h", "1000000h"} {
		var out, errb bytes.Buffer
		err := run(t.Context(), []string{"-attempt-timeout", d, "-rows", "idem", "-n", "1", "-drop", "0", "-reset", "0", "-delay", "0"}, &out, &errb)
		if err == nil || !strings.HasPrefix(err.Error(), "-attempt-timeout ") || !strings.Contains(err.Error(), "less than 30s") {
			t.Errorf("-attempt-timeout %s: got %v; want it refused, naming the bound", d, err)
		}
	}
}

// TestTableSaysWhyOrdersAreUnresolved: under an attempt timeout that no
// request can meet, the idem row leaves every order pending in the jar.
// The table says which timeout it ran with and, below the rows, what the
// jar recorded as those orders' last error, so that it does not read as a
// run at the defaults with orders the SDK left unresolved.
func TestTableSaysWhyOrdersAreUnresolved(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if err := run(t.Context(), []string{"-n", "2", "-rows", "idem", "-attempt-timeout", "1ns"}, &out, &errb); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	for _, want := range []string{"attempt timeout 1ns", "warning: idem: 2 orders got no final answer", "attempt timed out after 1ns"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table without %q:\n%s", want, out.String())
		}
	}
}

// The table explains itself: its columns, each row it shows and what the
// counts of the idem rows prove, without the README at hand.
func TestTableLegend(t *testing.T) {
	cfg := defaultConfig()
	zero := 0
	var rows []row
	for _, name := range allRows {
		r := row{Strategy: name, Requests: 120, Charges: cfg.orders}
		if name != rowNoKey && name != rowKeyPerTry {
			r.Unresolved = &zero
		}
		rows = append(rows, r)
	}
	var out bytes.Buffer
	printTable(&out, cfg, rows)
	text := out.String()
	for _, want := range []string{"requests sent:", "charges:", "double-charged orders:", "unresolved orders:",
		"PayCo's own dedup is off", "charged once"} {
		if !strings.Contains(text, want) {
			t.Errorf("table without %q:\n%s", want, text)
		}
	}
	for _, name := range allRows {
		if strings.Count(text, "\n"+name+" ") < 2 {
			t.Errorf("row %q is not explained below the table:\n%s", name, text)
		}
	}

	// Only the rows shown are explained.
	out.Reset()
	printTable(&out, cfg, rows[:1])
	if strings.Contains(out.String(), rowUnfenced) {
		t.Errorf("a table of one row explains the others:\n%s", out.String())
	}
}

// TestRowWaitsForHeldRequests: at its end a row waits for the requests the
// proxy still holds, however long a delay holds them (-attempt-timeout
// 130s holds them 195 s, longer than a fixed wait of a minute), and
// counts what they do at the server. Here the first attempt is held past
// the client's timeout, the retry charges, and the held request reaches
// the server after the client is done: a replay.
func TestRowWaitsForHeldRequests(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.orders = 1
	cfg.rates = faultproxy.Rates{Delay: 0.5}
	cfg.attemptTimeout = 200 * time.Millisecond
	cfg.hold = 1500 * time.Millisecond
	cfg.drain = time.Second // shorter than what remains of the hold when the client is done
	cfg.dir = t.TempDir()
	px := faultproxy.Proxy{Rates: cfg.rates}
	for px.Seed = 1; px.Seed < 1000 && (px.Fault(0) != faultproxy.Delay || px.Fault(1) != faultproxy.Forward); px.Seed++ {
	}
	cfg.seed = px.Seed
	r, err := runRow(t.Context(), cfg, rowIdem)
	if err != nil {
		t.Fatalf("seed %d: %v", cfg.seed, err)
	}
	// On a slow machine a forwarded attempt may outlast the timeout too,
	// and the call send more: what must hold is that every request the
	// proxy received was decided at the server before the row counted.
	decided := r.Server.Claims + r.Server.Replays + r.Server.Conflicts
	if r.Faults.Delayed < 1 || r.Charges != 1 || r.Server.Replays < 1 || decided != r.Requests {
		t.Errorf("seed %d: delayed %d, charges %d, replays %d, %d requests decided of %d received; want the held request replayed after the charge, and counted",
			cfg.seed, r.Faults.Delayed, r.Charges, r.Server.Replays, decided, r.Requests)
	}
}

// TestForEachWorkers: forEach starts no more goroutines than it has items,
// so that a -concurrency far above -n costs nothing (-concurrency 100000
// on one order took 280 MB, and a larger one all the memory there is).
func TestForEachWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	var mu sync.Mutex
	most := 0
	forEach(t.Context(), 100000, []int{1, 2, 3}, func(int) {
		mu.Lock()
		defer mu.Unlock()
		most = max(most, runtime.NumGoroutine()-before)
	})
	if most > 100 {
		t.Errorf("%d goroutines more while running 3 items; want at most 3 workers", most)
	}
}
