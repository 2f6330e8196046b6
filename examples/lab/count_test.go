package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/faultproxy"
)

// TestDoubleChargeWarningsMatchTheLedger: with a logger (-v), a row warns of
// each order charged more than once, and of no other. In the server crash
// row PayCo dedups on charge:<order_id>, so the second call of an order
// taken over from a dead instance charges nothing: that order was once
// reported charged twice while the ledger, and the table, held one charge.
// The unfenced store row, where PayCo charges on every call, must still
// warn of each order it double-charged.
func TestDoubleChargeWarningsMatchTheLedger(t *testing.T) {
	t.Parallel()
	for _, name := range []string{rowCrash, rowUnfenced} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := chaosConfig(t, 40, faultproxy.Rates{DropResponse: 0.1})
			var logs bytes.Buffer
			cfg.logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			r, err := runRow(t.Context(), cfg, name)
			if err != nil {
				t.Fatal(err)
			}
			warned := strings.Count(logs.String(), "order charged more than once")
			if warned != r.DoubleCharged {
				t.Errorf("%s: %d orders warned of as charged more than once; the ledger has %d (charge calls %d, charges %d)",
					name, warned, r.DoubleCharged, r.ChargeCalls, r.Charges)
			}
			if name == rowCrash && r.ChargeCalls <= r.Charges {
				t.Errorf("%s: charge calls %d, charges %d: want an order called twice, which the check above is for", name, r.ChargeCalls, r.Charges)
			}
			if name == rowUnfenced && r.DoubleCharged == 0 {
				t.Errorf("%s: no double-charged order: the check above saw no warning to keep", name)
			}
		})
	}
}

// TestRestartsInterrupted: a run interrupted (Ctrl-C) while a client
// process of idem + client restarts is running ends with the context's
// error, as the other rows do, not as a client process that failed on its
// own: the process was killed by the interrupt.
func TestRestartsInterrupted(t *testing.T) {
	t.Parallel()
	cfg := chaosConfig(t, 200, faultproxy.Rates{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg.progress = func(string, int, int) { cancel() }
	_, err := runRow(ctx, cfg, rowRestarts)
	if !errors.Is(err, context.Canceled) || errors.Is(err, errChild) {
		t.Errorf("interrupted: %v; want context.Canceled, not %v", err, errChild)
	}
}

// TestCommandExitStatus runs the command as a process: -h prints the
// usage and exits 0, as the go tools do; a flag that does not parse is
// told once, by the flag package with the usage, and exits 2, as does a
// flag whose value is out of range or an argument; a run that fails
// (here: a row cannot make its temporary directory) is told once and
// exits 1.
func TestCommandExitStatus(t *testing.T) {
	t.Parallel()
	// The test binary runs the lab's main (see TestMain): the same
	// program as the one go build makes, without building it again, which
	// took seconds (more in CI, beside the other packages' builds).
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	missingTemp := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		args []string
		code int
		want string // in stderr, once
	}{
		{[]string{"-h"}, 0, "Usage of lab"},
		{[]string{"-help"}, 0, "Usage of lab"},
		{[]string{"-nope"}, 2, "flag provided but not defined: -nope"},
		{[]string{"-n", "many"}, 2, `invalid value "many" for flag -n`},
		{[]string{"extra"}, 2, `lab: unexpected arguments ["extra"]`},
		{[]string{"-n", "0"}, 2, "lab: -n 0: want 1 to 99999 orders"},
		{[]string{"-attempt-timeout", "30s"}, 2, "lab: -attempt-timeout 30s: want a positive duration less than 30s"},
		{[]string{"-drop", "2"}, 2, "lab: faultproxy: "},
		{[]string{"-concurrency", "0"}, 2, "lab: -concurrency 0: want at least 1"},
		{[]string{"-rows", "bogus"}, 2, `lab: -rows: unknown strategy "bogus"`},
		{[]string{"-rows", "idem,idem"}, 2, `lab: -rows: strategy "idem" given twice`},
		{[]string{"-n", "1", "-rows", "idem"}, 1, missingTemp + ": no such file or directory"},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = append(os.Environ(), childEnv+"="+roleCommand, "TMPDIR="+missingTemp)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); cmd.ProcessState == nil { // it did not start
			t.Fatal(err)
		}
		if code := cmd.ProcessState.ExitCode(); code != c.code || strings.Count(stderr.String(), c.want) != 1 || stdout.Len() > 0 {
			t.Errorf("lab %q: exit status %d, stdout %q, stderr %q; want %d, saying %q once", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
		}
	}
}
