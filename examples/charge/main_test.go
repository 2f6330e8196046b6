package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// bound is the longest the test waits for any one step: a step that takes
// longer is a failure, not a slow pass.
const bound = 60 * time.Second

// sent is one charge request as the server received it.
type sent struct {
	run      int // 1 for the killed process, 2 for the restarted one
	order    string
	key      string
	replayed bool
}

// The program is killed (SIGKILL) while a charge is in flight, after the
// server charged and before it answered. Restarted with the same jar, it
// sends that charge again with the same key, the server replays its
// answer, and PayCo charged the order once.
func TestKilledMidChargeResumesWithTheSameKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "charge")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	payco, mw := newServer(t, dir)

	const victim = "order-2"
	charged := make(chan struct{})  // the victim's charge is made at PayCo
	release := make(chan struct{})  // the test killed the client: answer
	answered := make(chan struct{}) // the victim's first request is over
	var once sync.Once
	app := &payments.App{PayCo: payco, Idempotency: mw, Faults: payments.Faults{
		Charged: func(c payments.Charge) {
			if c.OrderID != victim {
				return
			}
			first := false
			once.Do(func() { first = true })
			if first {
				close(charged)
				<-release
			}
		},
	}}

	var (
		mu   sync.Mutex
		run  = 1
		log  []sent
		held bool
	)
	api := app.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			api.ServeHTTP(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		var in struct {
			OrderID string `json:"order_id"`
		}
		json.Unmarshal(b, &in)
		rw := httptest.NewRecorder()
		api.ServeHTTP(rw, r)
		mu.Lock()
		log = append(log, sent{run: run, order: in.OrderID, key: r.Header.Get(idem.KeyHeader),
			replayed: rw.Header().Get("Idempotent-Replayed") == "true"})
		first := in.OrderID == victim && !held
		held = held || in.OrderID == victim
		mu.Unlock()
		for k, v := range rw.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rw.Code)
		w.Write(rw.Body.Bytes())
		if first {
			close(answered)
		}
	}))
	defer srv.Close()

	jar := filepath.Join(dir, "charge.db")
	// A one-hour lease: the restart must not wait it out, since the killed
	// holder is gone; run 2 is killed after `bound` if it waits.
	args := []string{"-server", srv.URL, "-jar", jar, "-orders", "3", "-lease", "1h"}

	// Run 1: killed while order-2's charge is in flight.
	var out1 bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out1, &out1
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-charged:
	case <-time.After(bound):
		cmd.Process.Kill()
		t.Fatalf("order-2 was never charged; output:\n%s", out1.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	close(release)
	select {
	case <-answered:
	case <-time.After(bound):
		t.Fatal("the server never finished order-2's first request")
	}
	if strings.Contains(out1.String(), "order-2: charged") {
		t.Fatalf("run 1 saw order-2's answer before it was killed:\n%s", out1.String())
	}

	// Run 2: the same program, the same jar.
	mu.Lock()
	run = 2
	mu.Unlock()
	ctx2, cancel2 := context.WithTimeout(context.Background(), bound)
	defer cancel2()
	out2, err := exec.CommandContext(ctx2, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("run 2: %v\n%s", err, out2)
	}
	if !strings.Contains(string(out2), "order-2: resuming") {
		t.Fatalf("run 2 did not resume order-2:\n%s", out2)
	}

	t.Logf("run 1 (killed):\n%s\nrun 2:\n%s", out1.String(), out2)
	mu.Lock()
	defer mu.Unlock()
	var firstKey string
	var resent []sent
	for _, s := range log {
		switch {
		case s.order == victim && s.run == 1:
			firstKey = s.key
		case s.order == victim && s.run == 2:
			resent = append(resent, s)
		}
	}
	if firstKey == "" || len(resent) == 0 {
		t.Fatalf("requests %+v; want order-2 sent by both runs", log)
	}
	for _, s := range resent {
		if s.key != firstKey {
			t.Fatalf("the restarted process sent order-2 with key %q; want the first key %q", s.key, firstKey)
		}
	}
	if !resent[len(resent)-1].replayed {
		t.Fatalf("order-2's resend was not a replay: %+v", resent)
	}

	stats, err := payco.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"order-1", "order-2", "order-3"} {
		cs, err := payco.Order(ctx, o)
		if err != nil || len(cs) != 1 || stats.PerOrder[o] != 1 {
			t.Fatalf("%s: %d charges made, %d charge calls at PayCo (%v); want exactly 1 and 1\nrun 1:\n%s\nrun 2:\n%s", o, len(cs), stats.PerOrder[o], err, out1.String(), out2)
		}
	}
	if stats.SettledDoubleCharged != 0 || stats.Settled != 3 {
		t.Fatalf("PayCo stats %+v; want 3 charges, none double", stats)
	}
	if st := mw.Stats(); st.Claims != 3 || st.Replays != 1 {
		t.Fatalf("middleware stats %+v; want 3 claims and 1 replay", st)
	}
}

func TestOrderIDsAndBadFlags(t *testing.T) {
	if ids, err := orderIDs("3"); err != nil || strings.Join(ids, ",") != "order-1,order-2,order-3" {
		t.Fatalf("orderIDs(3) = %q, %v", ids, err)
	}
	if ids, err := orderIDs(" a, b ,,c"); err != nil || strings.Join(ids, ",") != "a,b,c" {
		t.Fatalf("orderIDs(list) = %q, %v", ids, err)
	}
	// Each usage error names what is wrong, in one line. A server URL no
	// request can be sent to, and a lease no jar can store, are usage
	// errors too, found before any order: not a failure of each order.
	jar := filepath.Join(t.TempDir(), "charge.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-orders", "0"}, `-orders "0"`},
		{[]string{"-orders", ","}, `-orders ","`},
		{[]string{"-amount", "-5"}, "-amount -5"},
		{[]string{"-lease", "0s"}, "-lease 0s"},
		{[]string{"extra"}, `"extra"`},
		{[]string{"-nope"}, "-nope"},
		{[]string{"-server", "localhost:8080", "-jar", jar}, `-server "localhost:8080"`},
		{[]string{"-server", "127.0.0.1:8080", "-jar", jar}, `-server "127.0.0.1:8080"`},
		{[]string{"-server", "ftp://127.0.0.1", "-jar", jar}, `-server "ftp://127.0.0.1"`},
		{[]string{"-server", "http://127.0.0.1:0", "-lease", "1000000h", "-jar", jar}, "-lease 1000000h0m0s"},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), tc.args, "", &out, &out); code != 2 {
			t.Errorf("run(%q) = %d; want 2 (bad flags)", tc.args, code)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q) printed %q; want it to name %s", tc.args, out.String(), tc.want)
		}
	}
}

// A -server URL refused is printed with its password masked (user:xxxxx@),
// as url.URL.Redacted masks it, and not at all when it does not parse and
// may hold one; so is one given without -server, as an argument.
func TestBadServerPasswordNotPrinted(t *testing.T) {
	const pw = "s3cretPW"
	jar := filepath.Join(t.TempDir(), "charge.db")
	for server, want := range map[string]string{
		"ftp://ops:" + pw + "@127.0.0.1":           `-server "ftp://ops:xxxxx@127.0.0.1"`,
		"http://ops:" + pw + "@":                   `-server "http://ops:xxxxx@"`,
		"http://ops:" + pw + "@127.0.0.1:8080/%zz": "-server (a URL that does not parse, not shown: it may hold a password)",
	} {
		var out bytes.Buffer
		code := run(context.Background(), []string{"-server", server, "-jar", jar}, "", &out, &out)
		if code != 2 || strings.Contains(out.String(), pw) || !strings.Contains(out.String(), want) {
			t.Errorf("run(-server %q) = %d, printed %q; want 2, naming %s", server, code, out.String(), want)
		}
	}
	var out bytes.Buffer
	code := run(context.Background(), []string{"-jar", jar, "http://ops:" + pw + "@127.0.0.1:8080"}, "", &out, &out)
	if want := `unexpected argument "http://ops:xxxxx@127.0.0.1:8080"`; code != 2 || strings.Contains(out.String(), pw) || !strings.Contains(out.String(), want) {
		t.Errorf("run with the server's URL as an argument = %d, printed %q; want 2, naming %s", code, out.String(), want)
	}
	// Given by mistake to a flag that refuses it, the flag package quotes
	// it in its error (invalid value "…" for flag -lease): masked too.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-lease", "http://ops:" + pw + "@127.0.0.1:8080"}, `invalid value "http://ops:xxxxx@127.0.0.1:8080" for flag -lease`},
		{[]string{"-amount=http://ops:" + pw + "@127.0.0.1:8080"}, `invalid value "http://ops:xxxxx@127.0.0.1:8080" for flag -amount`},
		{[]string{"-lease", "http://ops:" + pw + "@127.0.0.1:8080/%zz"}, "invalid value (a URL that does not parse, not shown: it may hold a password) for flag -lease"},
		{[]string{"-http://ops:" + pw + "@127.0.0.1:8080"}, "flag provided but not defined: (a URL that does not parse, not shown: it may hold a password)"},
	} {
		var out bytes.Buffer
		code := run(context.Background(), append(tc.args, "-jar", jar), "", &out, &out)
		if code != 2 || strings.Contains(out.String(), pw) || !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q) = %d, printed %q; want 2, naming %s", tc.args, code, out.String(), tc.want)
		}
	}
}

// -h and -help ask for the usage: it goes to stderr and the exit status is
// 0, as for idemctl and idemserver; 2 is for bad flags.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{arg}, "", &stdout, &stderr); code != 0 {
			t.Errorf("run(%s) = %d; want 0", arg, code)
		}
		if !strings.Contains(stderr.String(), "-orders") || !strings.Contains(stderr.String(), "usage: charge") {
			t.Errorf("run(%s) printed %q; want the usage, with its synopsis, on stderr", arg, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("run(%s) printed %q on stdout; want nothing", arg, stdout.String())
		}
	}
}

// An order the server refused (a final 400: the charge was not made) is
// not charged: a second run must not say it was, nor exit 0. It asks again
// with the same key and reports the server's answer, the same refusal.
func TestRefusedOrderIsNotReportedCharged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	payco, mw := newServer(t, dir)
	srv := httptest.NewServer((&payments.App{PayCo: payco, Idempotency: mw}).Handler())
	defer srv.Close()

	// "us" is no currency: the server answers 400 and charges nothing.
	args := []string{"-server", srv.URL, "-jar", filepath.Join(dir, "charge.db"), "-orders", "x1", "-currency", "us"}
	for n := 1; n <= 2; n++ {
		var out bytes.Buffer
		code := run(ctx, args, "", &out, &out)
		if code != 1 {
			t.Errorf("run %d = %d; want 1, the order is not charged\n%s", n, code, out.String())
		}
		if strings.Contains(out.String(), "x1: charged") {
			t.Errorf("run %d says x1 was charged; the server refused it\n%s", n, out.String())
		}
		if !strings.Contains(out.String(), "400 Bad Request") {
			t.Errorf("run %d does not report the server's 400\n%s", n, out.String())
		}
		if strings.Contains(out.String(), "run again") {
			t.Errorf("run %d says to run again, where nothing is left pending\n%s", n, out.String())
		}
	}
	if cs, err := payco.Order(ctx, "x1"); err != nil || len(cs) != 0 {
		t.Fatalf("PayCo charged x1 %d times (%v); want 0", len(cs), err)
	}
}

// An order refused in an earlier run (a final 400: the operation is done)
// is asked again with its key; when the server then gives no answer (a 503,
// or a 409 of a request still running, whose Retry-After is past the
// call's budget), the run does not say the charge is pending or its
// outcome unknown: the jar holds its outcome, only this run's answer is
// missing.
func TestNoAnswerForADoneOrderIsNotPending(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					http.Error(w, "no such currency", http.StatusBadRequest)
					return
				}
				w.Header().Set("Retry-After", "3600")
				w.WriteHeader(status)
			}))
			defer srv.Close()
			args := []string{"-server", srv.URL, "-jar", filepath.Join(t.TempDir(), "charge.db"), "-orders", "x1", "-lease", "1s"}
			var out bytes.Buffer
			if code := run(context.Background(), args, "", &out, &out); code != 1 || !strings.Contains(out.String(), "400 Bad Request") {
				t.Fatalf("first run = %d; want 1, the server's 400 reported\n%s", code, out.String())
			}
			out.Reset()
			code := run(context.Background(), args, "", &out, &out)
			t.Logf("second run:\n%s", out.String())
			if code != 1 || calls.Load() != 2 {
				t.Fatalf("second run = %d after %d requests; want 1, after one more request", code, calls.Load())
			}
			line := strings.TrimPrefix(out.String()[strings.LastIndex(out.String(), "x1: "):], "x1: ")
			if !strings.HasPrefix(line, "done in an earlier run, no answer this run") || strings.Contains(line, "still pending") {
				t.Errorf("second run reports %q; want it to say x1 is done, not pending", line)
			}
		})
	}
}

// What a hostile server answers reaches the terminal escaped: neither the
// body of a refusal nor the fields of a charge run their control
// characters (clear the screen, write the clipboard) there, nor reorder
// what it shows with bidi format characters (U+202E).
func TestServersControlCharactersAreEscaped(t *testing.T) {
	const esc = "\x1b]52;c;ZXZpbA==\a\x1b[2J\u202e\u2066"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req chargeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.OrderID == "refused" {
			http.Error(w, "refused"+esc, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(charge{ID: "ch_1" + esc, Amount: req.Amount, Currency: req.Currency + esc, OrderID: req.OrderID})
	}))
	defer srv.Close()
	var out bytes.Buffer
	code := run(context.Background(), []string{"-server", srv.URL, "-jar", filepath.Join(t.TempDir(), "charge.db"), "-orders", "refused,taken"}, "", &out, &out)
	if code != 1 {
		t.Errorf("run = %d; want 1, one order refused\n%s", code, out.String())
	}
	if i := strings.IndexFunc(out.String(), func(r rune) bool {
		return unicode.IsControl(r) && r != '\n' || unicode.Is(unicode.Bidi_Control, r)
	}); i >= 0 {
		t.Errorf("the output holds a control character at byte %d: %q", i, out.String())
	}
	for _, want := range []string{`refused\x1b]52;c;`, `ch_1\x1b]52;c;`, `usd\x1b]52;c;`, `\x1b[2J\u202e\u2066`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %s: %q", want, out.String())
		}
	}
}

// newServer opens the reference server's store and PayCo in dir, closed
// when the test ends.
func newServer(t *testing.T, dir string) (*payments.PayCo, *testserver.Middleware) {
	t.Helper()
	store, err := sqlitestore.Open(t.Context(), filepath.Join(dir, "server.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	payco, err := payments.NewPayCo(t.Context(), store.DB())
	if err != nil {
		t.Fatal(err)
	}
	return payco, &testserver.Middleware{Store: store}
}

// buildCharge builds the program into dir and returns its path.
func buildCharge(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "charge")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// orderOf returns the order_id of a charge request, leaving its body
// readable again.
func orderOf(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	var in struct {
		OrderID string `json:"order_id"`
	}
	json.Unmarshal(b, &in)
	return in.OrderID
}

// Ctrl-C (SIGINT) while a charge is in flight stops the run: the charge
// in flight stays pending, and no other order is sent, nor said to be
// charging. The exit status is 1, some orders not charged. So does SIGHUP,
// which a terminal closed sends, and SIGTERM.
func TestInterruptStopsTheRun(t *testing.T) {
	bin := buildCharge(t, t.TempDir())
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGHUP, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) { testStoppedBy(t, bin, sig) })
	}
}

func testStoppedBy(t *testing.T, bin string, sig os.Signal) {
	dir := t.TempDir()
	payco, mw := newServer(t, dir)
	api := (&payments.App{PayCo: payco, Idempotency: mw}).Handler()

	started := make(chan *os.Process, 1)
	var (
		mu   sync.Mutex
		seen []string
		once sync.Once
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := orderOf(r)
		mu.Lock()
		seen = append(seen, order)
		mu.Unlock()
		if order != "order-1" {
			api.ServeHTTP(w, r)
			return
		}
		// A long request, interrupted: held until the client gives up on it.
		once.Do(func() { (<-started).Signal(sig) })
		<-r.Context().Done()
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-server", srv.URL, "-jar", filepath.Join(dir, "charge.db"), "-orders", "3")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started <- cmd.Process
	err := cmd.Wait()
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v; want status 1", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Errorf("the server got charges for %q; want order-1's alone, the run interrupted during it", seen)
	}
	for _, o := range []string{"order-2", "order-3"} {
		if strings.Contains(stdout.String(), o) {
			t.Errorf("after the interrupt the run went on to %s:\n%s", o, stdout.String())
		}
	}
	if !strings.Contains(stdout.String(), "order-1: outcome unknown, still pending") {
		t.Errorf("order-1 is not reported pending:\n%s", stdout.String())
	}
	if want := "charge: stopped: " + sig.String(); !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q; want it to say the run was stopped, and by what: %q", stderr.String(), want)
	}
}

// Two copies started at once with the same jar. The second finds pending
// the charges the first is sending: b1, which it resumes, and x, begun
// after its listing, which it charges too. It waits for the first copy
// rather than report either failed: both copies exit 0, each order
// reported charged, and PayCo charged each once.
func TestTwoCopiesAtOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := buildCharge(t, dir)
	payco, mw := newServer(t, dir)
	api := (&payments.App{PayCo: payco, Idempotency: mw}).Handler()

	// The first request of each order is held until the second copy
	// says what it does with that order.
	held := map[string]chan struct{}{"b1": make(chan struct{}), "x": make(chan struct{})}
	release := map[string]chan struct{}{"b1": make(chan struct{}), "x": make(chan struct{})}
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := orderOf(r)
		mu.Lock()
		first := !seen[order] && held[order] != nil
		seen[order] = true
		mu.Unlock()
		if first {
			close(held[order])
			select {
			case <-release[order]:
			case <-time.After(bound):
			}
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	jar := filepath.Join(dir, "charge.db")
	ctx1, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var out1 bytes.Buffer
	first := exec.CommandContext(ctx1, bin, "-server", srv.URL, "-jar", jar, "-orders", "b1,x")
	first.Stdout, first.Stderr = &out1, &out1
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held["b1"]:
	case <-time.After(bound):
		t.Fatal("the first copy never sent b1")
	}

	second := exec.CommandContext(ctx1, bin, "-server", srv.URL, "-jar", jar, "-orders", "x")
	pipe, err := second.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out2, err2 bytes.Buffer
	second.Stderr = &err2
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		out2.WriteString(sc.Text() + "\n")
		for order, ch := range release {
			if strings.HasPrefix(sc.Text(), order+":") {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
		}
	}
	exit2 := second.Wait()
	exit1 := first.Wait()
	t.Logf("first copy:\n%s\nsecond copy:\n%s%s", out1.String(), out2.String(), err2.String())
	if exit1 != nil || exit2 != nil {
		t.Fatalf("exit: first %v, second %v; want both 0, every order charged", exit1, exit2)
	}
	for _, want := range []string{"b1: charged", "x: charged"} {
		if !strings.Contains(out1.String(), want) || !strings.Contains(out2.String(), want) {
			t.Errorf("a copy does not report %q", want)
		}
	}
	for _, o := range []string{"b1", "x"} {
		if cs, err := payco.Order(ctx, o); err != nil || len(cs) != 1 {
			t.Errorf("PayCo charged %s %d times (%v); want 1", o, len(cs), err)
		}
	}
}

// Ctrl-C (SIGINT) while the run resumes the charges an earlier run left
// pending stops it there: the charges it did not resume are not sent, and
// stderr counts them among the orders not sent, with the new orders.
func TestInterruptWhileResuming(t *testing.T) {
	dir := t.TempDir()
	jar := filepath.Join(dir, "charge.db")
	payco, mw := newServer(t, dir)
	api := (&payments.App{PayCo: payco, Idempotency: mw}).Handler()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if orderOf(r) == "p1" { // the first charge resumed: interrupted during it
			cancel()
			<-r.Context().Done()
			return
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// An earlier run left p1 and p2 pending: their first sends were refused.
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(context.Background(), jar, &client.Options{Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"p1", "p2"} {
		body := chargeRequest{Amount: 1000, Currency: "eur", OrderID: id}
		if _, err := c.PostJSON(context.Background(), opPrefix+id, srv.URL+"/v1/charges", body, nil); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("seeding %s: %v; want it pending", id, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-server", srv.URL, "-jar", jar, "-orders", "p1,p2,n1"}, "", &stdout, &stderr)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if code != 1 {
		t.Errorf("exit %d; want 1", code)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the server got %d charge requests; want p1's alone, the run interrupted during it", n)
	}
	if !strings.Contains(stdout.String(), "3 order(s) not charged; run again to send the 3 left pending or never sent") {
		t.Errorf("stdout does not count the 3 orders not charged, p1 and p2 left pending and n1 never sent:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "2 order(s) not sent") {
		t.Errorf("stderr %q; want it to count p2, not resumed, and n1 as the 2 orders not sent", stderr.String())
	}
}

// An interrupt stops a run whose orders an earlier run partly charged:
// those it charged are not counted among the orders not sent nor among
// those not charged, which the run could not tell the user otherwise.
func TestInterruptDoesNotCountEarlierChargesAsNotCharged(t *testing.T) {
	code, stdout, stderr := runInterruptedAfterEarlierCharge(t, "o1,p1,n1")
	if code != 1 {
		t.Errorf("exit %d; want 1", code)
	}
	if !strings.Contains(stdout, "2 order(s) not charged; run again to send the 2 left pending or never sent") {
		t.Errorf("stdout does not count the 2 orders not charged, p1 left pending and n1 never sent (o1 was charged before):\n%s", stdout)
	}
	if !strings.Contains(stderr, "charge: stopped: context canceled; 1 order(s) not sent") {
		t.Errorf("stderr %q; want it to count n1 alone as not sent", stderr)
	}
}

// An interrupt while resuming, all the other orders charged before: the
// run still says on stderr that it was stopped, and by what.
func TestInterruptWithNothingLeftToSendSaysStopped(t *testing.T) {
	code, stdout, stderr := runInterruptedAfterEarlierCharge(t, "o1,p1")
	if code != 1 {
		t.Errorf("exit %d; want 1", code)
	}
	if !strings.Contains(stdout, "1 order(s) not charged; run again to send the 1 left pending or never sent") {
		t.Errorf("stdout does not count p1, left pending, as the 1 order not charged:\n%s", stdout)
	}
	if !strings.Contains(stderr, "charge: stopped: context canceled") {
		t.Errorf("stderr %q; want it to say the run was stopped, and by what", stderr)
	}
}

// runInterruptedAfterEarlierCharge charges o1 in a first run and leaves p1
// pending, then runs charge with orders, interrupted while it resumes p1.
func runInterruptedAfterEarlierCharge(t *testing.T, orders string) (code int, stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	jar := filepath.Join(dir, "charge.db")
	payco, mw := newServer(t, dir)
	api := (&payments.App{PayCo: payco, Idempotency: mw}).Handler()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if orderOf(r) == "p1" { // resumed by the second run: interrupted during it
			cancel()
			<-r.Context().Done()
			return
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// An earlier run charged o1.
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-server", srv.URL, "-jar", jar, "-orders", "o1"}, "", &out, &out); code != 0 {
		t.Fatalf("first run: exit %d; want 0\n%s", code, out.String())
	}
	// And left p1 pending: its first send was refused.
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(context.Background(), jar, &client.Options{Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	body := chargeRequest{Amount: 1000, Currency: "usd", OrderID: "p1"}
	if _, err := c.PostJSON(context.Background(), opPrefix+"p1", srv.URL+"/v1/charges", body, nil); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("seeding p1: %v; want it pending", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	var o, e bytes.Buffer
	code = run(ctx, []string{"-server", srv.URL, "-jar", jar, "-orders", orders}, "", &o, &e)
	t.Logf("stdout:\n%s\nstderr:\n%s", o.String(), e.String())
	return code, o.String(), e.String()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestImportsOnlyPublicPackages: the command is a template to copy, which
// a module of its own can build only if it imports no internal package.
func TestImportsOnlyPublicPackages(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range f.Imports {
		if path, _ := strconv.Unquote(im.Path.Value); strings.Contains(path+"/", "/internal/") {
			t.Errorf("main.go imports %s, which a copy outside this module cannot", path)
		}
	}
}

// The jar file moved while a run had it open (a cleanup job, a deploy that
// replaced the directory): the next run, which opens the path, would not
// find this run's keys. The jar's Close says so, and the run reports it
// and fails; before, it exited 0 and said nothing.
func TestJarMovedDuringTheRunIsReported(t *testing.T) {
	dir := t.TempDir()
	jarPath := filepath.Join(dir, "charge.db")
	payco, mw := newServer(t, dir)
	app := (&payments.App{PayCo: payco, Idempotency: mw}).Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := os.Rename(jarPath, filepath.Join(dir, "moved.db")); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
		app.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var out bytes.Buffer
	code := run(context.Background(), []string{"-server", srv.URL, "-jar", jarPath, "-orders", "m1"}, "", &out, &out)
	t.Logf("run = %d:\n%s", code, out.String())
	if code != 1 || !strings.Contains(out.String(), "charge: closing the key jar:") || !strings.Contains(out.String(), "moved") {
		t.Fatalf("run = %d; want 1 and the jar's Close error, which says it moved\n%s", code, out.String())
	}
}

// A relative -jar (the default, charge.db) is relative to the working
// directory: a run from another directory opens a new, empty jar and
// charges again what the jar of the first holds pending. The run says on
// stderr which file it uses, as an absolute path, and that it is new.
func TestSaysTheJarsAbsolutePath(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","amount":1000,"currency":"usd","order_id":"x1"}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	t.Chdir(dir)
	want := "charge: key jar " + filepath.Join(dir, "charge.db")
	for n, isNew := range []bool{true, false} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{"-server", srv.URL, "-orders", "x1"}, "", &stdout, &stderr); code != 0 {
			t.Fatalf("run %d = %d; want 0\n%s%s", n+1, code, stdout.String(), stderr.String())
		}
		line, _, _ := strings.Cut(stderr.String(), "\n")
		if !strings.HasPrefix(line, want) || strings.Contains(line, "(new") != isNew {
			t.Errorf("run %d: stderr's first line %q; want %q, saying (new) only on the first run", n+1, line, want)
		}
	}
}

// A -jar that is a PostgreSQL URL (as idemctl --jar takes one) is a usage
// error: charge keeps its keys in a SQLite file, and would otherwise take
// the URL for a file name under the working directory and print it, its
// password included.
func TestPostgresJarIsAUsageError(t *testing.T) {
	const pw = "s3cretPW"
	for _, u := range []string{"postgres://ops:" + pw + "@127.0.0.1:1/idem", "postgresql://ops:" + pw + "@127.0.0.1:1/idem"} {
		var out bytes.Buffer
		code := run(context.Background(), []string{"-server", "http://127.0.0.1:1", "-jar", u}, "", &out, &out)
		if code != 2 || strings.Contains(out.String(), pw) || !strings.Contains(out.String(), "-jar") || !strings.Contains(out.String(), "SQLite") {
			t.Errorf("run(-jar %q) = %d, printed %q; want 2, saying -jar takes a SQLite file, without the password", u, code, out.String())
		}
	}
}
