package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
)

// childEnv, set to "client", makes the lab binary (or the test binary) run
// as a client process of idem + client restarts instead of the lab.
const childEnv = "IDEM_LAB_ROLE"

// errChild is returned by runRestarts when a client process fails on its
// own, not killed.
var errChild = errors.New("lab: client process failed")

// Kill chances per line the client process prints: right after a retry on
// a network error (the outcome of the last attempt is unknown: the server
// may have charged) and, rarely, right before any attempt.
const (
	killOnNetworkRetry = 0.3
	killOnAttempt      = 0.01
)

// runRestarts runs the orders in client processes and kills them with
// SIGKILL at seeded random points, at most cfg.maxKills times (and once
// per 10 orders), starting a new one each time. Each new process resumes
// what its jar holds pending. The last process runs to its end. A client
// process ends once its lab is gone, however the lab ended (see
// childMain).
func runRestarts(ctx context.Context, e *env) error {
	rng := rand.New(rand.NewPCG(e.cfg.seed, 0x6b696c6c)) // "kill"
	paid := e.jarPath + ".paid"
	settled := map[string]bool{}
	maxKills := min(e.cfg.maxKills, max(e.cfg.orders/10, 1))
	for run := 0; run <= maxKills; run++ {
		args := []string{
			"-jar", e.jarPath, "-paid", paid, "-url", e.url, "-orders", strconv.Itoa(e.cfg.orders),
			"-concurrency", strconv.Itoa(e.cfg.concurrency), "-attempt-timeout", e.cfg.attemptTimeout.String(),
			"-lock-timeout", e.cfg.lockTimeout.String(),
			"-run", strconv.Itoa(run),
		}
		if e.cfg.ablate.freshJar {
			args = append(args, "-fresh-jar")
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env = append(os.Environ(), childEnv+"=client")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		// The client process's stdin: a pipe whose write end only this
		// process holds, until Wait (exec makes it close-on-exec, so that
		// no other child inherits it). The client process reads EOF there
		// once the lab is gone, however it ended, and ends too (see
		// childMain).
		if _, err := cmd.StdinPipe(); err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		killed := false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			var chance float64
			switch f[0] {
			case "settled":
				if !settled[f[1]] {
					settled[f[1]] = true
					e.done()
				}
			case "retry":
				if len(f) > 2 && f[2] == "network" {
					chance = killOnNetworkRetry
				}
			case "attempt":
				chance = killOnAttempt
			}
			if !killed && run < maxKills && rng.Float64() < chance {
				// SIGKILL: no deferred function runs, nothing is flushed.
				killed = cmd.Process.Kill() == nil
			}
		}
		err = cmd.Wait()
		if killed {
			e.restarts++
			continue
		}
		if err != nil && ctx.Err() != nil {
			return ctx.Err() // killed by exec.CommandContext: the run was interrupted
		}
		if err != nil {
			return fmt.Errorf("%w: %v: %s", errChild, err, bytes.TrimSpace(stderr.Bytes()))
		}
		return nil
	}
	return nil
}

// childMain is a client process of idem + client restarts. It resumes the
// operations its jar holds pending, sends the orders it has no answer for
// yet, resumes again, and prints what it does on stdout, one line per
// event, for the parent to kill it at.
//
// The file -paid is the program's own record of the orders it got an answer
// for; it decides only what to send. With -fresh-jar each run opens an
// empty jar: keys do not survive the restart (the bug the jar prevents).
func childMain(args []string) int {
	// A terminal's Ctrl-C, or its closing (SIGHUP), signals the whole
	// process group, this process with its lab, and may reach it first:
	// dead of it, it would look to the lab like a client that failed on
	// its own, before the lab knew of the signal. The lab ends this
	// process (SIGKILL, at its kill points and when it stops, by
	// exec.CommandContext), so it ignores SIGINT, SIGTERM and SIGHUP: one
	// process answers them, the one that knows what they mean, as the go
	// command leaves them to the program that go run runs.
	signal.Ignore(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// A lab that ends at once (a second signal, a SIGKILL, a crash) cannot
	// end this process. Its next write to the lab's pipe would, by SIGPIPE,
	// but not while a call waits (a backoff, a Retry-After). Its stdin is
	// a pipe the lab writes nothing to and holds the only write end of:
	// EOF there means the lab is gone, and it ends at once, with nothing
	// to say and no one to say it to. Not Pdeathsig, which fires when the
	// thread that started it ends, not the lab.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(1)
	}()
	fs := flag.NewFlagSet("lab client", flag.ContinueOnError)
	cfg := defaultConfig()
	var (
		jarPath  = fs.String("jar", "", "jar file")
		paidPath = fs.String("paid", "", "file of the orders answered")
		url      = fs.String("url", "", "server base URL")
		run      = fs.Int("run", 0, "how many processes ran before this one")
		freshJar = fs.Bool("fresh-jar", false, "open an empty jar on every run")
	)
	fs.IntVar(&cfg.orders, "orders", cfg.orders, "orders")
	fs.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "orders in flight")
	fs.DurationVar(&cfg.attemptTimeout, "attempt-timeout", cfg.attemptTimeout, "attempt timeout")
	fs.DurationVar(&cfg.lockTimeout, "lock-timeout", cfg.lockTimeout, "the server's lease")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runClient(context.Background(), cfg, *jarPath, *paidPath, *url, *run, *freshJar); err != nil {
		fmt.Fprintln(os.Stderr, "lab client:", err)
		return 1
	}
	return 0
}

// runClient is one client process's work; see childMain.
func runClient(ctx context.Context, cfg config, jarPath, paidPath, url string, run int, freshJar bool) error {
	var mu sync.Mutex
	emit := func(f ...string) {
		mu.Lock()
		defer mu.Unlock()
		io.WriteString(os.Stdout, strings.Join(f, " ")+"\n")
	}
	hooks := idem.Hooks{
		OnAttempt: func(e idem.Event) { emit("attempt", e.Op) },
		OnRetry: func(e idem.Event) {
			why := "status"
			if e.Err != nil {
				why = "network"
			}
			emit("retry", e.Op, why)
		},
	}
	if freshJar {
		jarPath = fmt.Sprintf("%s.run%d", jarPath, run)
	}
	c, err := client.New(ctx, jarPath, cfg.clientOptions(hooks))
	if err != nil {
		return err
	}
	defer c.Close()
	pf, err := os.OpenFile(paidPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer pf.Close()
	answered := func(orderID string) {
		mu.Lock()
		fmt.Fprintln(pf, orderID)
		pf.Sync()
		mu.Unlock()
		emit("settled", orderID)
	}
	resumed := func(op string, err error) {
		if err == nil {
			answered(strings.TrimPrefix(op, "charge:"))
		}
	}

	// What the previous process left pending, with the keys it persisted.
	if err := resumePending(ctx, c, cfg.concurrency, 1, resumed); err != nil {
		return err
	}

	paid, err := readPaid(paidPath)
	if err != nil {
		return err
	}
	var todo []order
	for _, o := range orders(cfg.orders) {
		if !paid[o.ID] {
			todo = append(todo, o)
		}
	}
	forEach(ctx, cfg.concurrency, todo, func(o order) {
		if _, err := c.PostJSON(ctx, o.op(), url+"/v1/charges", o.body(), nil); err == nil {
			answered(o.ID)
		}
	})
	return resumePending(ctx, c, cfg.concurrency, resumePasses, resumed)
}

// readPaid reads the orders answered so far: one id per complete line (a
// kill may have cut the last one short).
func readPaid(path string) (map[string]bool, error) {
	paid := map[string]bool{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return paid, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	for _, l := range lines[:len(lines)-1] { // the last piece has no newline
		paid[l] = true
	}
	return paid, nil
}
