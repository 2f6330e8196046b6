package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestProcesses runs the built program. Its subtests share one binary,
// built into the test's temporary directory with the go command on PATH
// (go test puts its own first).
func TestProcesses(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemserver")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building idemserver: %v\n%s", err, out)
	}
	t.Run("replay and restart", func(t *testing.T) { testServeReplayRestart(t, bin) })
	t.Run("crash after charge", func(t *testing.T) { testCrashAfterCharge(t, bin) })
	t.Run("a client's key jar is refused", func(t *testing.T) { testKeyJarRefused(t, bin) })
	t.Run("exit status", func(t *testing.T) { testExitStatus(t, bin) })
	t.Run("a database that cannot be reached", func(t *testing.T) { testUnreachable(t, bin) })
	t.Run("a stop while connecting to the database", func(t *testing.T) { testStopWhileConnecting(t, bin) })
	t.Run("a stop waits for a charge in flight", func(t *testing.T) { testStopWaits(t, bin) })
	t.Run("a second signal stops at once", func(t *testing.T) { testSecondSignal(t, bin) })
	t.Run("SIGHUP ignored at start is ignored", func(t *testing.T) { testHangupIgnored(t, bin) })
	t.Run("fleet: one execution across two servers", func(t *testing.T) { testFleetOneExecution(t, bin) })
	t.Run("fleet: a killed server's claim is taken over", func(t *testing.T) { testFleetKilledServer(t, bin) })
}

// server is a running idemserver process.
type server struct {
	cmd    *exec.Cmd
	stdout io.Reader
	url    string
	out    chan string // the rest of stdout, once the process ended
	errb   *bytes.Buffer
}

// start runs the binary and waits for the address it prints.
func start(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	s := launch(t, bin, args...)
	s.ready(t)
	return s
}

// launch runs the binary on 127.0.0.1 at a port the OS chooses, and
// kills it when t ends if it is still running.
func launch(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, stdout: stdout, out: make(chan string, 1), errb: new(bytes.Buffer)}
	cmd.Stderr = s.errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return s
}

// ready waits for the address the server prints once it listens.
func (s *server) ready(t *testing.T) {
	t.Helper()
	r := bufio.NewReader(s.stdout)
	line, err := r.ReadString('\n')
	const prefix = "idemserver: listening on "
	if err != nil || !strings.HasPrefix(line, prefix) {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		t.Fatalf("first line %q, %v; stderr %s", line, err, s.errb)
	}
	s.url, _, _ = strings.Cut(strings.TrimPrefix(line, prefix), " ")
	go func() {
		rest, _ := io.ReadAll(r)
		s.out <- string(rest)
	}()
}

// stop sends SIGTERM and returns the exit status and the rest of stdout.
func (s *server) stop(t *testing.T) (int, string) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return s.wait(t)
}

func (s *server) wait(t *testing.T) (int, string) {
	t.Helper()
	err := s.cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return s.cmd.ProcessState.ExitCode(), <-s.out
}

func (s *server) charge(key, order string) (*http.Response, []byte, error) {
	req, err := http.NewRequest("POST", s.url+"/v1/charges", strings.NewReader("amount=1000&currency=eur&order_id="+order))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer sk_test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func (s *server) stats(t *testing.T) payments.Stats {
	t.Helper()
	resp, err := http.Get(s.url + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st payments.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func testServeReplayRestart(t *testing.T, bin string) {
	db := filepath.Join(t.TempDir(), "idem.db")
	s := start(t, bin, "-db", db)
	resp, first, err := s.charge("key-1", "o-1")
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("charge: %v %v %s; stderr %s", resp, err, first, s.errb)
	}
	resp, again, err := s.charge("key-1", "o-1")
	if err != nil || resp.StatusCode != 201 || !bytes.Equal(again, first) || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %v %v %s; want %s replayed", resp, err, again, first)
	}
	if st := s.stats(t); st.Charges != 1 || st.Settled != 1 || st.PerOrder["o-1"] != 1 {
		t.Fatalf("stats %+v; want one charge for o-1", st)
	}
	code, out := s.stop(t)
	if code != 0 || !strings.Contains(out, "idemserver: stopped") {
		t.Fatalf("after SIGTERM: exit %d, stdout %q, stderr %s; want a graceful stop", code, out, s.errb)
	}

	// A restart on the same file keeps the keys and the ledger.
	s = start(t, bin, "-db", db)
	resp, again, err = s.charge("key-1", "o-1")
	if err != nil || resp.StatusCode != 201 || !bytes.Equal(again, first) {
		t.Fatalf("replay after restart: %v %v %s; want %s", resp, err, again, first)
	}
	if st := s.stats(t); st.Charges != 1 {
		t.Fatalf("stats after restart %+v; want 1 charge", st)
	}
	s.stop(t)
}

// The server dies right after PayCo charged, before saving the answer. A
// new server takes the stale claim over; PayCo's key keeps one charge.
func testCrashAfterCharge(t *testing.T, bin string) {
	db := filepath.Join(t.TempDir(), "idem.db")
	s := start(t, bin, "-db", db, "-crash-after-charge", "1")
	if resp, _, err := s.charge("key-1", "o-1"); err == nil {
		t.Fatalf("charge on a crashing server answered %d; want the connection dropped", resp.StatusCode)
	}
	if code, _ := s.wait(t); code != crashStatus {
		t.Fatalf("exit status %d (stderr %s); want %d", code, s.errb, crashStatus)
	}

	s = start(t, bin, "-db", db)
	if resp, body, err := s.charge("key-1", "o-1"); err != nil || resp.StatusCode != 409 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("retry within the lease: %v %v %s; want 409 with Retry-After", resp, err, body)
	}
	age(t, db) // an hour passes: the dead server's claim is stale
	resp, body, err := s.charge("key-1", "o-1")
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("retry after the lease: %v %v %s; want 201", resp, err, body)
	}
	st := s.stats(t)
	if st.Charges != 2 || st.Settled != 1 || st.SettledDoubleCharged != 0 {
		t.Fatalf("stats %+v; want the charge run twice and made once", st)
	}
	s.stop(t)
}

// testKeyJarRefused: -db naming a client's key jar exits with status 1 and
// one line on stderr, without listening, and leaves the jar as it was.
func testKeyJarRefused(t *testing.T, bin string) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, idem.Record{Op: "op", Key: "key", Fingerprint: "fp", State: idem.StatePending, Method: "POST", URL: "http://x/"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := launch(t, bin, "-db", path)
	line, _ := bufio.NewReader(s.stdout).ReadString('\n')
	if line != "" {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		t.Fatalf("idemserver -db on a key jar printed %q; want it to exit before listening", line)
	}
	s.cmd.Wait() // an *exec.ExitError: the status is below
	code := s.cmd.ProcessState.ExitCode()
	stderr := s.errb.String()
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "idemserver: ") || !strings.Contains(stderr, path) {
		t.Fatalf("exit status %d, stderr %q; want 1 and one line naming %s", code, stderr, path)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the key jar changed: %v", err)
	}
	if j, err := keyjar.Open(ctx, path, nil); err != nil {
		t.Fatalf("reopening the key jar: %v", err)
	} else {
		j.Close()
	}
}

// testExitStatus: 0 for -h and -help, 2 for a usage error (as the flag
// package's ExitOnError, and idemctl), 1 when the server cannot start.
// Each run ends before it listens.
func testExitStatus(t *testing.T, bin string) {
	dir := t.TempDir()
	db := filepath.Join(dir, "x.db")
	for _, c := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"-h"}, 0, "Usage of idemserver"},
		{[]string{"-help"}, 0, "Usage of idemserver"},
		{[]string{"-nope"}, 2, "flag provided but not defined: -nope"},
		{[]string{"-lock-timeout", "soon"}, 2, "-lock-timeout"},
		{[]string{"-lock-timeout", "0"}, 2, "-lock-timeout"},
		// Refused before the address, which it could not listen on.
		{[]string{"-lock-timeout", "1ms", "-addr", "256.0.0.1:0"}, 2, "-lock-timeout 1ms: want at least 100ms"},
		{[]string{"-on-error", "ignore"}, 2, "-on-error"},
		{[]string{"-retention", "1h"}, 2, "-retention"},
		{[]string{"-fail-after-charge", "2"}, 2, "-fail-after-charge"},
		{[]string{"-prune-every", "-1h"}, 2, "-prune-every"},
		// An unset variable in -db "$DB": refused before anything is
		// opened, as an empty -addr is.
		{[]string{"-db", ""}, 2, "idemserver: -db is empty"},
		{[]string{"extra"}, 2, "unexpected arguments"},
		{[]string{"-addr", "256.0.0.1:0"}, 1, "256.0.0.1"},
		{[]string{"-db", dir}, 1, dir}, // a directory, not a database file
	} {
		code, stdout, stderr := runToEnd(t, dir, bin, append([]string{"-db", db}, c.args...)...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Contains(stdout, "listening") {
			t.Errorf("idemserver %q: exit status %d, stdout %q, stderr %q; want %d, stderr saying %q, no listening",
				c.args, code, stdout, stderr, c.code, c.want)
		}
	}
	// The whole of stderr. A usage error is one line, after the command's
	// name. A flag that does not parse is told once, by the flag package,
	// above the usage, as the lab and idemctl tell it.
	code, _, stderr := runToEnd(t, dir, bin, "-db", db, "-on-error", "ignore")
	if want := `idemserver: -on-error "ignore": want release or save` + "\n"; code != 2 || stderr != want {
		t.Errorf("idemserver -on-error ignore: exit status %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	code, _, stderr = runToEnd(t, dir, bin, "-db", db, "-nope")
	if code != 2 || strings.Count(stderr, "flag provided") != 1 ||
		!strings.HasPrefix(stderr, "flag provided but not defined: -nope\nUsage of idemserver:\n") ||
		strings.Contains(stderr, "idemserver: flag provided") {
		t.Errorf("idemserver -nope: exit status %d, stderr %q; want 2, and the flag package's line and the usage only", code, stderr)
	}
}

// runToEnd runs the binary with args in dir (the test's own when empty)
// and returns its exit status and output, once it ended.
func runToEnd(t *testing.T, dir, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// testUnreachable: a PostgreSQL server that refuses connections exits with
// status 1 and one line on stderr that says what failed, connecting to the
// database at its URL without the password, and why. pgx's own error
// takes a line per attempt (sslmode=prefer makes two), under a prefix
// that names neither the host nor the port.
func testUnreachable(t *testing.T, bin string) {
	addr := refusetest.Addr(t)
	for _, c := range []struct{ dsn, want string }{
		{"postgres://ops:hunter2@" + addr + "/idem?connect_timeout=5", "postgres://ops:xxxxx@" + addr + "/idem?connect_timeout=5"},
		{"postgresql://ops@" + addr + "/idem?password=hunter2", "postgresql://ops@" + addr + "/idem?password=xxxxx"},
	} {
		code, stdout, out := runToEnd(t, "", bin, "-addr", "127.0.0.1:0", "-db", c.dsn)
		want := "idemserver: connecting to the database at " + c.want + ": "
		if code != 1 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, want) ||
			!strings.Contains(out, "connection refused") || strings.Contains(out, "hunter2") || stdout != "" {
			t.Errorf("idemserver -db %s: exit status %d, stdout %q, stderr %q; want 1 and one line starting %q, saying the connection was refused, without the password",
				c.want, code, stdout, out, want)
		}
	}
}

// testStopWhileConnecting: SIGTERM while the server connects to its
// database, one that accepts the connection and never answers, stops it as
// a stop does once it serves: exit status 0, saying it stopped, no error.
func testStopWhileConnecting(t *testing.T, bin string) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", "postgres://ops@"+ln.Addr().String()+"/idem?sslmode=disable")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// The server connects at once; the deadline only bounds the wait.
	ln.SetDeadline(time.Now().Add(time.Minute))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("the server never connected: %v", err)
	}
	defer c.Close() // silent until the end: the server waits for PostgreSQL's answer
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // an *exec.ExitError when it fails: the status is below
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(stdout.String(), "idemserver: stopped") || stderr.Len() > 0 {
		t.Fatalf("SIGTERM while connecting: exit status %d, stdout %q, stderr %q; want 0, saying it stopped, and no error", code, stdout.String(), stderr.String())
	}
}

// chargeInFlight runs the binary with -v and -delay 1h, and sends it a
// charge, whose handler then holds the answer until its lease ends
// (-lock-timeout). It returns once the server logged the charge's claim,
// with stdout read past the address line; the charge's outcome comes on
// the channel.
func chargeInFlight(t *testing.T, bin string, args ...string) (*exec.Cmd, *bufio.Reader, <-chan answer) {
	t.Helper()
	return startChargeInFlight(t, exec.Command(bin, inFlightArgs(args...)...))
}

// inFlightArgs are the arguments of chargeInFlight's server: args after
// its own.
func inFlightArgs(args ...string) []string {
	return append([]string{"-addr", "127.0.0.1:0", "-v", "-delay", "1h"}, args...)
}

// startChargeInFlight is chargeInFlight with the command to start, which
// runs the server with inFlightArgs.
func startChargeInFlight(t *testing.T, cmd *exec.Cmd) (*exec.Cmd, *bufio.Reader, <-chan answer) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	out, got := claimCharge(t, stdout, stderr)
	return cmd, out, got
}

// claimCharge reads the address line from a server's stdout, sends it a
// charge, and returns once its stderr (-v) logged the charge's claim, with
// stdout read past the address line; the charge's outcome comes on the
// channel.
func claimCharge(t *testing.T, stdout, stderr io.Reader) (*bufio.Reader, <-chan answer) {
	t.Helper()
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	const prefix = "idemserver: listening on "
	if err != nil || !strings.HasPrefix(line, prefix) {
		t.Fatalf("first line %q, %v", line, err)
	}
	s := &server{}
	s.url, _, _ = strings.Cut(strings.TrimPrefix(line, prefix), " ")
	got := make(chan answer, 1)
	go func() {
		resp, body, err := s.charge("key-1", "o-1")
		if err != nil {
			got <- answer{err: err}
			return
		}
		got <- answer{status: resp.StatusCode, body: body}
	}()
	claimed := false
	for sc := bufio.NewScanner(stderr); !claimed && sc.Scan(); { // until the server ends at most
		claimed = strings.Contains(sc.Text(), "idempotency: claimed")
	}
	go io.Copy(io.Discard, stderr)
	if !claimed {
		t.Fatal("the server never logged the charge's claim")
	}
	return out, got
}

// testStopWaits: SIGTERM while a charge is in flight waits for its answer,
// which is saved and sent, and then exits 0.
func testStopWaits(t *testing.T, bin string) {
	db := filepath.Join(t.TempDir(), "idem.db")
	const lockTimeout = 500 * time.Millisecond
	cmd, stdout, got := chargeInFlight(t, bin, "-db", db, "-lock-timeout", lockTimeout.String())
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	cmd.Wait()
	want := fmt.Sprintf("waiting up to %v for requests in flight", lockTimeout+stopWait)
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(rest), want) || !strings.Contains(string(rest), "idemserver: stopped") {
		t.Fatalf("after SIGTERM: exit %d, stdout %q; want 0, saying %q, and stopped", code, rest, want)
	}
	if a := <-got; a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("the charge in flight: %d %q, %v; want its 201", a.status, a.body, a.err)
	}
	if n := inFlight(t, db); n != 0 {
		t.Fatalf("%d keys in flight after the stop; want the answer saved", n)
	}
}

// testSecondSignal: a second SIGINT, SIGTERM or SIGHUP, while the first waits for
// a charge in flight, ends the process at once, by the signal. A process
// started with SIGINT ignored, as a non-interactive shell starts a
// background job, cannot die by SIGINT: a second SIGINT ends it with exit
// status 130, as a shell tells a process ended by SIGINT.
func testSecondSignal(t *testing.T, bin string) {
	for _, tc := range []struct {
		name          string
		ignoreINT     bool // started with SIGINT ignored
		first, second syscall.Signal
		wantSignal    syscall.Signal // the signal that ends the process, or 0
		wantCode      int            // its exit status, when no signal ends it
	}{
		{"SIGTERM twice", false, syscall.SIGTERM, syscall.SIGTERM, syscall.SIGTERM, 0},
		{"SIGINT twice", false, syscall.SIGINT, syscall.SIGINT, syscall.SIGINT, 0},
		{"SIGINT twice, SIGINT ignored at start", true, syscall.SIGINT, syscall.SIGINT, 0, 130},
		{"SIGTERM then SIGINT, SIGINT ignored at start", true, syscall.SIGTERM, syscall.SIGINT, 0, 130},
		{"SIGINT then SIGTERM, SIGINT ignored at start", true, syscall.SIGINT, syscall.SIGTERM, syscall.SIGTERM, 0},
		// A terminal closed, or a supervisor's stop.
		{"SIGHUP twice", false, syscall.SIGHUP, syscall.SIGHUP, syscall.SIGHUP, 0},
		{"SIGHUP then SIGTERM", false, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGTERM, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := inFlightArgs("-db", filepath.Join(t.TempDir(), "idem.db")) // the default lock timeout, a minute
			cmd := exec.Command(bin, args...)
			if tc.ignoreINT {
				// The shell ignores SIGINT, and the server it becomes
				// (exec) inherits the ignore.
				cmd = exec.Command("sh", append([]string{"-c", `trap '' INT; exec "$0" "$@"`, bin}, args...)...)
			}
			cmd, stdout, got := startChargeInFlight(t, cmd)
			if err := cmd.Process.Signal(tc.first); err != nil {
				t.Fatal(err)
			}
			// The line comes once a second signal stops the process.
			line, err := stdout.ReadString('\n')
			want := fmt.Sprintf("waiting up to %v for requests in flight (SIGINT, SIGTERM or SIGHUP again stops at once, "+
				"and the keys of the requests it cuts off stay claimed for up to -lock-timeout, %v, before a retry may run them again)",
				testserver.DefaultLockTimeout+stopWait, testserver.DefaultLockTimeout)
			if err != nil || !strings.Contains(line, want) {
				t.Fatalf("after %v: %q, %v; want a line saying %q", tc.first, line, err, want)
			}
			if err := cmd.Process.Signal(tc.second); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case !ok:
				t.Fatalf("after %v and %v: %v; want a wait status", tc.first, tc.second, cmd.ProcessState)
			case tc.wantSignal != 0 && (!ws.Signaled() || ws.Signal() != tc.wantSignal):
				t.Fatalf("after %v and %v: %v; want killed by %v", tc.first, tc.second, cmd.ProcessState, tc.wantSignal)
			case tc.wantSignal == 0 && (!ws.Exited() || ws.ExitStatus() != tc.wantCode):
				t.Fatalf("after %v and %v: %v; want exit status %d", tc.first, tc.second, cmd.ProcessState, tc.wantCode)
			}
			if a := <-got; a.err == nil {
				t.Fatalf("the charge in flight: %d %q; want the connection dropped", a.status, a.body)
			}
		})
	}
}

// testHangupIgnored: a server started with SIGHUP ignored (nohup, to
// outlive its terminal) keeps ignoring it. SIGHUP then SIGTERM stops it
// gracefully; a SIGHUP that stopped it would make the SIGTERM a second
// signal, which ends the process at once, by SIGTERM.
func testHangupIgnored(t *testing.T, bin string) {
	cmd := exec.Command("sh", "-c", `trap '' HUP; exec "$0" "$@"`, bin, "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "idem.db"))
	var stdout bytes.Buffer
	r, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() // when the test fails before it ends
	br := bufio.NewReader(r)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "listening on") {
		t.Fatalf("first line %q, %v; want the address", line, err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	io.Copy(&stdout, br)
	cmd.Wait()
	if !cmd.ProcessState.Success() || !strings.Contains(stdout.String(), "idemserver: stopped") {
		t.Fatalf("SIGHUP then SIGTERM, SIGHUP ignored at start: %v, stdout %q; want a graceful stop", cmd.ProcessState, stdout.String())
	}
}

// openFile opens the SQLite file at path as a store, which the caller
// closes.
func openFile(t *testing.T, path string) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// inFlight counts the keys in flight in the SQLite file at path.
func inFlight(t *testing.T, path string) int {
	t.Helper()
	s := openFile(t, path)
	defer s.Close()
	var n int
	if err := s.DB().QueryRow(`SELECT count(*) FROM idempotency_keys WHERE status = 'in_flight'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// age moves every claim in the file an hour into the past.
func age(t *testing.T, path string) {
	t.Helper()
	s := openFile(t, path)
	defer s.Close()
	if _, err := s.DB().Exec(`UPDATE idempotency_keys SET locked_at = locked_at - 3600000000000 WHERE status = 'in_flight'`); err != nil {
		t.Fatal(err)
	}
}

func TestFlags(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	for _, args := range [][]string{
		{"-on-error", "ignore"},
		{"-retention", "1h"},
		{"-fail-after-charge", "2"},
		{"-db", "postgres://" + refusetest.Addr(t) + "/idem?connect_timeout=5"},
		{"-db", "postgresql://%zz"},
		{"-addr", "256.0.0.1:0", "-db", db},
		{"-db", db, "extra"},
		{"-nope"},
	} {
		var stderr bytes.Buffer
		if err := run(context.Background(), args, io.Discard, &stderr); err == nil {
			t.Errorf("run(%q) succeeded; want an error", args)
		}
	}
}

// TestFlagValues: a value out of its range is refused, naming the flag,
// before anything is opened (the unreachable address would fail later).
func TestFlagValues(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	for _, flag := range [][2]string{
		{"-fail-after-charge", "NaN"},
		{"-crash-after-charge", "NaN"},
		{"-crash-after-charge", "-0.5"},
		{"-lock-timeout", "0"},
		{"-lock-timeout", "-5s"},
		{"-prune-every", "-1h"},
		// A prune after a prune, in a tight loop: the store busy deleting
		// nothing.
		{"-prune-every", "1ns"},
		{"-prune-every", "999ms"},
		{"-delay", "-1s"},
		{"-lock-timeout", "5"}, // the reason, a missing unit, is checked below
		// Shorter than a claim and a charge take: every request would
		// answer 503 (the claim outlasted the lease) or 502 (the charge
		// cut off).
		{"-lock-timeout", "1ms"},
		{"-lock-timeout", "99ms"},
		// The wait of a stop, -lock-timeout and stopWait, would overflow.
		{"-lock-timeout", (math.MaxInt64 - stopWait + 1).String()},
		{"-lock-timeout", time.Duration(math.MaxInt64).String()},
		// Not below -retention (25h by default): a prune would delete the
		// claim of a request still running.
		{"-lock-timeout", testserver.DefaultRetention.String()},
		{"-query-timeout", "0"},
		{"-query-timeout", "-1s"},
		// PostgreSQL refuses a longer statement_timeout when pgstore connects.
		{"-query-timeout", (pgstore.MaxQueryTimeout + time.Millisecond).String()},
		{"-query-timeout", time.Duration(math.MaxInt64).String()},
		{"-migration-timeout", "-1s"},
		{"-migration-timeout", (pgstore.MaxQueryTimeout + time.Millisecond).String()},
	} {
		err := run(context.Background(), []string{flag[0], flag[1], "-db", db, "-addr", "256.0.0.1:0"}, io.Discard, io.Discard)
		var ue *cliflag.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), flag[0]) {
			t.Errorf("run(%s %s): %v; want a usage error naming %s", flag[0], flag[1], err, flag[0])
		}
		if d, perr := time.ParseDuration(flag[1]); flag[0] == "-lock-timeout" && perr == nil && d > 0 && d < 100*time.Millisecond &&
			(err == nil || !strings.Contains(err.Error(), "at least 100ms")) {
			t.Errorf("run(%s %s): %v; want it to name the minimum, 100ms", flag[0], flag[1], err)
		}
		if d, perr := time.ParseDuration(flag[1]); flag[0] == "-prune-every" && perr == nil && d > 0 &&
			(err == nil || !strings.Contains(err.Error(), "at least 1s")) {
			t.Errorf("run(%s %s): %v; want it to name the minimum, 1s", flag[0], flag[1], err)
		}
	}
	// The longest lock timeout whose wait can be told, and the longest
	// query timeout, are taken: run goes on to the address, which it cannot
	// listen on.
	for _, flag := range [][2]string{
		{"-lock-timeout", (math.MaxInt64 - stopWait).String()},
		{"-lock-timeout", (testserver.DefaultRetention - time.Nanosecond).String()},
		{"-lock-timeout", "100ms"},
		{"-query-timeout", pgstore.MaxQueryTimeout.String()},
		{"-migration-timeout", pgstore.MaxQueryTimeout.String()},
		{"-migration-timeout", "0"},
		{"-prune-every", "1s"},
		{"-prune-every", "0"},
	} {
		args := []string{flag[0], flag[1], "-db", db, "-addr", "256.0.0.1:0"}
		if flag[1] == (math.MaxInt64 - stopWait).String() { // below -retention, as long as it may be
			args = append(args, "-retention", time.Duration(math.MaxInt64).String())
		}
		err := run(context.Background(), args, io.Discard, io.Discard)
		var ue *cliflag.UsageError
		if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "256.0.0.1") {
			t.Errorf("run(%s %s): %v; want the address refused, not the flag", flag[0], flag[1], err)
		}
	}
	err := run(context.Background(), []string{"-lock-timeout", "5", "-db", db}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `invalid value "5" for flag -lock-timeout: missing unit in duration`) {
		t.Errorf("run(-lock-timeout 5): %v; want it to say the unit is missing", err)
	}
}

// TestHelpSaysTheBounds: -h says the range of each flag TestFlagValues
// refuses out of it, where it said only "a duration" or "probability".
func TestHelpSaysTheBounds(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, io.Discard, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run(-h): %v; want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"-lock-timeout duration\n    \thow long (a duration, at least 100ms and below -retention)",
		"-fail-after-charge float\n    \tfault: probability (0 to 1)",
		"-crash-after-charge float\n    \tfault: probability (0 to 1)",
		"-prune-every duration\n    \thow often (a duration, at least 1s; 0: never)",
		"-query-timeout duration\n    \twith a postgres:// -db, how long (a duration, at most " + pgstore.MaxQueryTimeout.String() + ")",
		"-migration-timeout duration\n    \twith a postgres:// -db, how long (a duration, at most " + pgstore.MaxQueryTimeout.String() +
			"; 0: " + pgstore.DefaultMigrationTimeout.String() + ", or -query-timeout when longer)",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, stderr.String())
		}
	}
}

// run stops gracefully when its context ends.
func TestRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	db := filepath.Join(t.TempDir(), "x.db")
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-db", db}, pw, io.Discard); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || !strings.Contains(line, "listening on http://127.0.0.1:") {
		t.Fatalf("first line %q, %v", line, err)
	}
	go io.Copy(io.Discard, pr)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v; want nil", err)
	}
	if fi, err := os.Stat(db); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("database file: %v, %v; want mode 0600", fi, err)
	}
}

// run waits for a request in flight when its context ends: the handler
// runs to the end of its lease, its answer is saved and sent, and run
// returns nil.
func TestRunWaitsForRequestInFlight(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	db := filepath.Join(t.TempDir(), "x.db")
	const lockTimeout = 500 * time.Millisecond
	args := []string{"-addr", "127.0.0.1:0", "-db", db, "-v", "-delay", "1h", "-lock-timeout", lockTimeout.String()}
	go func() {
		done <- run(ctx, args, outW, errW)
		outW.Close()
		errW.Close()
	}()
	stdout, got := claimCharge(t, outR, errR)
	rest := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(stdout)
		rest <- string(b)
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel, with a charge in flight: %v; want nil", err)
	}
	if a := <-got; a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("the charge in flight: %d %q, %v; want its 201", a.status, a.body, a.err)
	}
	want := fmt.Sprintf("waiting up to %v for requests in flight", lockTimeout+stopWait)
	if out := <-rest; !strings.Contains(out, want) || !strings.Contains(out, "idemserver: stopped") {
		t.Fatalf("stdout after the listening line: %q; want it saying %q, then stopped", out, want)
	}
	if n := inFlight(t, db); n != 0 {
		t.Fatalf("%d keys in flight after run returned; want the answer saved", n)
	}
}

// shutdown gives up on a request still in flight after its grace: it
// closes the request's connection, which ends the handler's context, and
// says so.
func TestShutdownGivesUp(t *testing.T) {
	entered := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	got := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	<-entered
	if err := shutdown(srv, 0); err == nil || !strings.Contains(err.Error(), "still in flight") {
		t.Fatalf("shutdown with a request in flight and no grace: %v; want it saying the request is still in flight", err)
	}
	if err := <-got; err == nil {
		t.Fatal("the request in flight was answered; want its connection closed")
	}
}

// A key=value connection string, which pgx reads but -db does not take,
// is refused as a usage error without being printed (it may hold a
// password), and no SQLite file named after it is created.
func TestKeywordValueDSN(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // without the check, run opens a file and stops at once
	for _, spec := range []string{
		"host=127.0.0.1 port=1 dbname=idem user=ops password=hunter2",
		"postgresql:ops:hunter2@127.0.0.1/idem", // a misspelt URL, not a file name
	} {
		err := run(ctx, []string{"-db", spec, "-addr", "127.0.0.1:0"}, io.Discard, io.Discard)
		var ue *cliflag.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "postgres://") || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("run -db %q: %v; want a usage error that asks for a postgres:// URL and hides the password", spec, err)
		}
		if files, _ := os.ReadDir(dir); len(files) > 0 {
			t.Fatalf("run -db %q left %v in its directory", spec, files)
		}
	}
}

// A database's URL given as an argument (-db forgotten) is refused as a
// usage error that quotes it without its password, and a key=value
// connection string not at all.
func TestStrayPasswordNeverPrinted(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, arg := range []string{"postgres://ops:hunter2@db.internal/idem", "host=db.internal user=ops password=hunter2"} {
		err := run(ctx, []string{"-addr", "127.0.0.1:0", arg}, io.Discard, io.Discard)
		var ue *cliflag.UsageError
		if !errors.As(err, &ue) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("run %q: %v; want a usage error without the password", arg, err)
		}
	}
}

// A database's URL or connection string given to a flag that refuses it
// (the value of -db given to the flag before it, its own flag forgotten) is
// neither printed with its password by the flag package, with the usage,
// nor returned with it.
func TestRejectedFlagValuePasswordNeverPrinted(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, v := range []string{"postgres://ops:hunter2@db.internal/idem", "postgresql://ops@db.internal/idem?password=hunter2",
		"host=db.internal user=ops password=hunter2"} {
		for _, args := range [][]string{{"-lock-timeout", v}, {"-lock-timeout=" + v}, {"-query-timeout", v}, {"-fail-after-charge", v},
			{"-seed", v}, {"-v=" + v}, {"-on-error", v}, {"--=" + v}} {
			var stderr bytes.Buffer
			err := run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, &stderr)
			var ue *cliflag.UsageError
			if !errors.As(err, &ue) || strings.Contains(err.Error(), "hunter2") || strings.Contains(stderr.String(), "hunter2") {
				t.Errorf("run %q: %v, stderr:\n%s\nwant a usage error without the password", args, err, stderr.String())
			}
		}
	}
}

// A key store that fails once the server runs is logged to stderr without
// -v: the 503 store-unavailable answer does not say why (the error may name
// the database), so stderr must, and an operator who did not ask for every
// decision still learns why every charge is refused. The log names neither
// the credential nor the body.
func TestStoreErrorLogged(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	s, stop := runInProcess(t, stderr, "-db", db)

	// The key table goes away under the running server, once the
	// server's own writes (its prune at start) let it: without a busy
	// timeout the ALTER failed with SQLITE_BUSY when it met that prune.
	sdb, err := sql.Open("sqlite", db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sdb.Exec(`ALTER TABLE idempotency_keys RENAME TO gone`)
	sdb.Close()
	if err != nil {
		t.Fatal(err)
	}
	resp, body, err := s.charge("key-1", "o-1")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "store-unavailable") {
		t.Fatalf("charge with the key table gone: %v %v %s; want 503 store-unavailable", resp, err, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if !strings.Contains(out, "store failed") || !strings.Contains(out, "no such table: idempotency_keys") {
		t.Fatalf("stderr %q; want the store's error logged", out)
	}
	if strings.Contains(out, "sk_test") || strings.Contains(out, "amount=1000") {
		t.Fatalf("stderr %q names the credential or the body", out)
	}
}

// runInProcess calls run with args, on 127.0.0.1 at a port the OS
// chooses, and returns once it listens. stop ends its context and returns
// what run returned.
func runInProcess(t *testing.T, stderr io.Writer, args ...string) (s *server, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pr, pw := io.Pipe()
	result := make(chan error, 1)
	go func() {
		result <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), pw, stderr)
		pw.Close()
	}()
	r := bufio.NewReader(pr)
	line, err := r.ReadString('\n')
	const prefix = "idemserver: listening on "
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("first line %q, %v; run returned %v", line, err, <-result)
	}
	go io.Copy(io.Discard, r)
	s = &server{}
	s.url, _, _ = strings.Cut(strings.TrimPrefix(line, prefix), " ")
	return s, func() error {
		cancel()
		return <-result
	}
}

// An empty -addr (an unset variable in "-addr $ADDR") is a usage error,
// before the database is opened: net.Listen would take it for every
// interface at a port of its choosing, not the loopback of the default.
func TestEmptyAddr(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // if it listened, run would stop at once
	var stdout bytes.Buffer
	err := run(ctx, []string{"-addr", "", "-db", db}, &stdout, io.Discard)
	var ue *cliflag.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-addr") {
		t.Fatalf("run -addr '': %v, stdout %q; want a usage error naming -addr", err, stdout.String())
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("run -addr '' created its database: %v", err)
	}
}

// A server prunes the keys older than -retention once it serves, and then
// every -prune-every, and says how many it deleted: a fleet restarted more
// often than -prune-every (a deploy, a crash loop) pruned nothing, as its
// first prune came one interval after the start, and its key table grew
// without a line to tell.
func TestPruneAtStart(t *testing.T) {
	ctx := t.Context()
	db := filepath.Join(t.TempDir(), "x.db")
	st := openFile(t, db)
	for key, at := range map[string]time.Time{"old": time.Now().Add(-30 * time.Hour), "new": time.Now().Add(-time.Hour)} {
		f := testserver.Fence{Token: at.UnixNano()}
		if _, claimed, err := st.Claim(ctx, "", key, "fp", f, at); err != nil || !claimed {
			t.Fatalf("claim %s: %v, %v", key, claimed, err)
		}
		if err := st.Save(ctx, "", key, f, testserver.Response{Status: http.StatusCreated}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	result := make(chan error, 1)
	go func() {
		result <- run(rctx, []string{"-addr", "127.0.0.1:0", "-db", db, "-prune-every", "1h"}, io.Discard, pw)
		pw.Close()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	var seen []string
	for pruned := false; !pruned; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("run ended (%v) before it pruned; stderr %q", <-result, seen)
			}
			seen = append(seen, line)
			pruned = strings.Contains(line, `msg="idemserver: pruned expired keys"`)
			if pruned && !strings.Contains(line, "level=INFO") || pruned && !strings.Contains(line, "deleted=1 retention=25h0m0s took=") {
				t.Fatalf("prune record %q; want it at INFO, with deleted=1 retention=25h0m0s and how long it took", line)
			}
		case <-timeout.C:
			t.Fatalf("no prune within 20 s of the start with -prune-every 1h; stderr %q", seen)
		}
	}
	cancel()
	go func() {
		for range lines {
		}
	}()
	if err := <-result; err != nil {
		t.Fatalf("run: %v", err)
	}
	sdb, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	var keys string
	if err := sdb.QueryRow(`SELECT group_concat(key) FROM idempotency_keys`).Scan(&keys); err != nil || keys != "new" {
		t.Fatalf("keys after the prune: %q, %v; want only the one within -retention, new", keys, err)
	}
}

// pruneFails is a Store whose Prune fails, as with its database down; the
// Middleware calls nothing else of it when it prunes.
type pruneFails struct{ testserver.Store }

func (pruneFails) Prune(context.Context, time.Time, int) (int, error) {
	return 0, errors.New("database is down")
}

// A prune that failed is logged as the server's other errors are: one
// record at ERROR, with its error, which an operator who watches for
// level=ERROR (a failing database, the key table growing) sees; not a line
// of its own format among the records.
func TestPruneErrorLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&out, nil))
		mw := &testserver.Middleware{Store: pruneFails{}}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			prune(ctx, mw, time.Hour, logger)
		}()
		synctest.Wait() // the prune at start ran; the next is an hour away
		got := out.String()
		cancel()
		<-done
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], `msg="idemserver: prune failed"`) ||
			!strings.Contains(lines[0], `err="database is down"`) {
			t.Fatalf("log %q; want one record at ERROR, msg=\"idemserver: prune failed\", with the error", got)
		}
	})
}
