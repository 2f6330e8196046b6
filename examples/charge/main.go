// Command charge charges a list of orders against the reference server
// (testserver/cmd/idemserver) and survives being killed at any moment: each
// charge is the operation charge:<order>, whose Idempotency-Key is in the
// jar file before the request leaves, and on start the program first
// resumes, with the same keys, whatever a previous run left pending.
//
//	go run ./testserver/cmd/idemserver -addr 127.0.0.1:8080 &
//	go run ./examples/charge -server http://127.0.0.1:8080 -jar charge.db -orders 5
//	go run ./examples/charge -server http://127.0.0.1:8080 -jar charge.db -orders order-7,order-9
//
// Kill it with kill -9 while a charge is in flight and run it again: the
// interrupted charge is sent again with its first key, the server replays
// its answer, and the order is charged once. Kill the charge process
// itself, not go run: a SIGKILL ends the go command alone, and the program
// it started runs on, still charging. Build it to have its process id:
//
//	go build -o charge ./examples/charge && ./charge -jar "$PWD/charge.db" -orders 5 &
//	kill -9 $!
//
// A run that restarts while the server still runs the first attempt gets
// 409 with a Retry-After (the reference server's: as long as the first
// attempt has run, at most its lease left), waits for it, asks again, and
// then gets the answer.
//
// Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal closed; not under
// nohup) stops the run: the charge in flight stays pending, for the next
// run to resume, and no other order is sent; stderr says how many were
// not, and the exit status is 1.
//
// Every run resumes only what its jar file holds: it says on stderr which
// file that is, as an absolute path, with "(new)" when it creates it. The
// default -jar, charge.db, is in the working directory: a run from another
// directory opens another jar and charges again what the first left
// pending. Give every run the same -jar, an absolute path.
//
// A run killed mid-charge leaves that charge leased in the jar: a restart
// on the same host sees that the holder process is gone and resumes at
// once; another host waits for the lease (-lease, one minute) to end.
//
// Two runs may share the jar at once: a charge that one finds pending
// while the other sends it, whether listed to resume or met in its own
// orders, is waited for, then reported charged by the other run or
// replayed by the server; it is charged once, and neither run reports it
// failed.
//
// The credential for the server, if it needs one, is read from the
// environment variable CHARGE_TOKEN (sent as "Authorization: Bearer …") and
// is never written to the jar. Run again after a kill with the same token:
// the reference server scopes keys by credential, and takes a resume under
// another token for a new charge, which it runs again.
//
// Exit status: 0 when every order is charged, 1 when some are not (those
// left pending stay in the jar for the next run; one the server refused,
// with a 400 say, is asked again with its key and gets the same answer;
// when that gets no answer, the order is reported done in an earlier run,
// no answer this run, not pending), or when the jar's Close fails (its file
// moved or removed while the run had it open: the next run would not find
// this run's keys; stderr says so), 2 for bad flags; -h prints the usage
// and exits 0.
// What the server answers is printed quoted as a Go string when it holds
// control characters or bidi format characters (\x1b, \u202e): a terminal
// does not run them, nor reorder what it shows.
//
// It imports only this module's public packages and the standard library:
// copy it to start a tool of your own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

func main() {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) { // started under nohup: it stays ignored
		sigs = append(sigs, syscall.SIGHUP) // a terminal closed
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	code := run(ctx, os.Args[1:], os.Getenv("CHARGE_TOKEN"), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// charge is the answer of POST /v1/charges.
type charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	OrderID  string `json:"order_id"`
}

type chargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	OrderID  string `json:"order_id"`
}

const opPrefix = "charge:"

// maxLease is the longest -lease: the time a lease ends at must stay
// within the years a jar stores (1678 to 2262).
const maxLease = 100 * 365 * 24 * time.Hour

func run(ctx context.Context, args []string, token string, stdout, stderr io.Writer) (code int) {
	fs := flag.NewFlagSet("charge", flag.ContinueOnError)
	fs.SetOutput(argsMasked{stderr, args})
	server := fs.String("server", "http://127.0.0.1:8080", "base URL of the payments server")
	jarPath := fs.String("jar", "charge.db", "the key jar `file`; a relative path is relative to the working directory: give every run the same one")
	orders := fs.String("orders", "3", "how many orders to charge (order-1 … order-N), or a comma-separated list of order ids")
	amount := fs.Int64("amount", 1000, "amount of each charge, in the currency's minor unit")
	currency := fs.String("currency", "usd", "currency of each charge")
	lease := fs.Duration("lease", time.Minute, "how long (a `duration`) a charge in flight is held against other processes; a charge interrupted by a crash can be resumed once its lease ends")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charge [-server URL] [-jar FILE] [-orders N|ID,ID…] [-amount A] [-currency C] [-lease D]")
		fmt.Fprintln(stderr, "Charges orders against the reference server (idemserver); first resumes, with their")
		fmt.Fprintln(stderr, "keys, the charges a killed run left pending. The server's credential, if any, is read")
		fmt.Fprintln(stderr, "from $CHARGE_TOKEN. Exit status: 0 all charged, 1 some not, 2 bad flags.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ids, err := orderIDs(*orders)
	var bad string
	switch {
	case err != nil:
		bad = fmt.Sprintf("-orders %q: %v; want a count from 1 to 1000000 or a comma-separated list of order ids", *orders, err)
	case *amount <= 0:
		bad = fmt.Sprintf("-amount %d: want a positive amount, in the currency's minor unit", *amount)
	case *lease <= 0 || *lease > maxLease:
		bad = fmt.Sprintf("-lease %v: want a positive duration of at most %v (a century)", *lease, maxLease)
	case !sendable(*server):
		bad = fmt.Sprintf("-server %s: want an http:// or https:// URL with a host, such as http://127.0.0.1:8080", quoteMasked(*server))
	case fs.NArg() > 0:
		bad = fmt.Sprintf("unexpected argument %s: give the orders with -orders", quoteMasked(fs.Arg(0)))
	case strings.HasPrefix(strings.ToLower(*jarPath), "postgres://") || strings.HasPrefix(strings.ToLower(*jarPath), "postgresql://"):
		// Not a file name: unquoted, as it may hold a password.
		bad = "-jar: a PostgreSQL URL; charge keeps its keys in a SQLite file (keyjar): give a file path (a program of your own opens a PostgreSQL jar with pgjar.Open and gives it as client.Options.Jar)"
	}
	if bad != "" {
		fmt.Fprintf(stderr, "charge: %s (charge -h for usage)\n", bad)
		return 2
	}
	url := strings.TrimSuffix(*server, "/") + "/v1/charges"

	// A relative -jar is relative to the working directory: a run from
	// another one opens another jar, without the keys of the charges left
	// pending here, and charges them again. Say which file this run uses.
	if abs, err := filepath.Abs(*jarPath); err == nil {
		*jarPath = abs
	}
	if _, err := os.Stat(*jarPath); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "charge: key jar %s (new)\n", *jarPath)
	} else {
		fmt.Fprintf(stderr, "charge: key jar %s\n", *jarPath)
	}

	// A charge left in flight by a killed run on another host is leased
	// until its lease ends: each call's budget outlasts it, so that a
	// restart waits for it rather than give up. So does a server's 409,
	// whose Retry-After is at most what is left of its own lease on the key.
	c, err := client.New(ctx, *jarPath, &client.Options{
		Header: bearer(token),
		Lease:  *lease,
		Policy: retry.Policy{MaxElapsed: *lease + 30*time.Second, MaxRetryAfter: *lease + 30*time.Second},
	})
	if err != nil {
		fmt.Fprintln(stderr, "charge:", err)
		return 1
	}
	defer func() {
		// Close writes the outcomes the jar still holds in memory; its
		// error says what a run did not keep (keyjar.ErrMoved: the jar
		// file was moved or removed while the run had it open, and the
		// next run, which opens the path, will not find these keys;
		// idem.ErrDropped: outcomes the jar could not write, whose
		// operations the next run resumes, getting the server's replay).
		if err := c.Close(); err != nil {
			fmt.Fprintln(stderr, "charge: closing the key jar:", err)
			code = 1
		}
	}()

	resumed, failed, notSent := resumePending(ctx, c, stdout)
	for _, id := range ids {
		op := opPrefix + id
		if resumed[op] {
			continue
		}
		if ctx.Err() != nil {
			// Interrupted (SIGINT, SIGTERM, SIGHUP): nothing more is
			// sent. An order an earlier run charged is neither an order
			// not sent nor one not charged.
			if rec, err := c.Jar().Get(context.WithoutCancel(ctx), op); err == nil && charged(rec) {
				continue
			}
			notSent++
			continue
		}
		if rec, err := c.Jar().Get(ctx, op); err == nil && rec.State != idem.StateAbandoned {
			switch {
			case charged(rec):
				fmt.Fprintf(stdout, "%s: charged in an earlier run (key %s)\n", id, rec.Key)
				continue
			case rec.State == idem.StateDone:
				// A final answer that is no charge (a 400, a 500): ask
				// again with the same key, and report what the server
				// says now, its saved answer or, if it released the
				// claim of a failed request, a new one.
			case rec.State == idem.StatePending:
				// Being sent by another run, or begun since the
				// listing: the call waits for its lease and sends it
				// with its key, for the server's answer.
			default:
				failed++
				fmt.Fprintf(stdout, "%s: %s in an earlier run (key %s): %s\n", id, rec.State, rec.Key, rec.Note)
				continue
			}
		}
		fmt.Fprintf(stdout, "%s: charging %d %s\n", id, *amount, *currency)
		var ch charge
		resp, err := c.PostJSON(ctx, op, url, chargeRequest{Amount: *amount, Currency: *currency, OrderID: id}, &ch)
		if !report(stdout, id, resp, ch, err) {
			failed++
		}
	}
	if ctx.Err() != nil && (notSent > 0 || failed > 0) {
		// Stopped with orders left: say by what, also when the charge
		// cut off was the last one left to send.
		fmt.Fprintf(stderr, "charge: stopped: %v", context.Cause(ctx))
		if notSent > 0 {
			fmt.Fprintf(stderr, "; %d order(s) not sent", notSent)
		}
		fmt.Fprintln(stderr)
		failed += notSent
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "%d order(s) not charged", failed)
		if n := leftToSend(ctx, c, ids, resumed); n > 0 {
			fmt.Fprintf(stdout, "; run again to send the %d left pending or never sent", n)
		}
		fmt.Fprintln(stdout)
		return 1
	}
	return 0
}

// charged reports whether rec is of an order the server charged: done,
// with a success (2xx).
func charged(rec idem.Record) bool {
	return rec.State == idem.StateDone && rec.LastStatus >= 200 && rec.LastStatus < 300
}

// leftToSend returns how many of the orders ids, and of the operations a
// run resumed, the jar holds pending or abandoned, or does not hold (never
// sent: the run was interrupted first): those a run again sends. One the server
// refused (a 400) is done, and a run again only gets its answer again.
// The jar is read even once ctx is done (an interrupted run).
func leftToSend(ctx context.Context, c *client.Client, ids []string, resumed map[string]bool) int {
	ctx = context.WithoutCancel(ctx)
	ops := make(map[string]bool, len(ids)+len(resumed))
	for _, id := range ids {
		ops[opPrefix+id] = true
	}
	for op := range resumed {
		ops[op] = true
	}
	n := 0
	for op := range ops {
		rec, err := c.Jar().Get(ctx, op)
		if err == nil && (rec.State == idem.StatePending || rec.State == idem.StateAbandoned) || errors.Is(err, idem.ErrNotFound) {
			n++
		}
	}
	return n
}

// resumePending resends, with their keys, the charges a previous run left
// pending, oldest first. It returns the operations it resumed or, once
// ctx is done, left pending, how many of those it resumed are still not
// charged, and how many it left pending without sending them.
func resumePending(ctx context.Context, c *client.Client, stdout io.Writer) (resumed map[string]bool, failed, notSent int) {
	resumed = make(map[string]bool)
	pending, err := c.Pending(ctx)
	if err != nil {
		fmt.Fprintln(stdout, "listing pending charges:", err)
		return resumed, 1, 0
	}
	for _, rec := range pending {
		id, ok := strings.CutPrefix(rec.Op, opPrefix)
		if !ok {
			continue
		}
		resumed[rec.Op] = true
		if ctx.Err() != nil {
			notSent++ // interrupted: left pending for the next run
			continue
		}
		fmt.Fprintf(stdout, "%s: resuming (key %s, stored %s, %d attempt(s))\n",
			id, rec.Key, rec.Created.UTC().Format(time.RFC3339), rec.Attempts)
		resp, err := c.Resume(ctx, rec.Op)
		if errors.Is(err, client.ErrState) && chargedElsewhere(ctx, c, rec, stdout) {
			continue
		}
		var ch charge
		if err == nil {
			err = decode(resp, &ch)
		}
		if !report(stdout, id, resp, ch, err) {
			failed++
		}
	}
	return resumed, failed, notSent
}

// chargedElsewhere reports, and prints, that rec's charge, which Resume
// did not send because it was no longer pending, was charged meanwhile
// under rec's key: by another run sharing the jar, which was sending it.
func chargedElsewhere(ctx context.Context, c *client.Client, rec idem.Record, stdout io.Writer) bool {
	now, err := c.Jar().Get(ctx, rec.Op)
	if err != nil || now.Key != rec.Key || now.State != idem.StateDone || now.LastStatus < 200 || now.LastStatus > 299 {
		return false
	}
	id := strings.TrimPrefix(rec.Op, opPrefix)
	fmt.Fprintf(stdout, "%s: charged by another run meanwhile (key %s)\n", id, now.Key)
	return true
}

func decode(resp *client.Response, ch *charge) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(ch); err != nil {
		return fmt.Errorf("decoding the charge: %w", err)
	}
	return nil
}

// report prints one order's outcome and reports whether it is charged.
func report(w io.Writer, id string, resp *client.Response, ch charge, err error) bool {
	var re *idem.ReconcileError
	switch {
	case errors.As(err, &re):
		fmt.Fprintf(w, "%s: first sent more than %v ago; look the order up on the server (GET /v1/orders/%s), then abandon or forget %s with idemctl\n", id, re.Horizon, id, re.Op)
		return false
	case errors.Is(err, idem.ErrPending):
		// ErrPending says this call got no answer; the operation may
		// still be done (or failed) in the jar, asked again for the
		// server's saved answer: say which.
		if st := knownState(err); st != "" {
			fmt.Fprintf(w, "%s: %s in an earlier run, no answer this run: %v\n", id, st, err)
		} else {
			fmt.Fprintf(w, "%s: outcome unknown, still pending: %v\n", id, err)
		}
		return false
	case err != nil:
		fmt.Fprintf(w, "%s: failed: %v\n", id, err)
		return false
	}
	how := "charged"
	if resp.Replayed {
		how = "charged (replayed: the server had already charged it)"
	}
	fmt.Fprintf(w, "%s: %s %s %d %s, key %s\n", id, how, shown(ch.ID), ch.Amount, shown(ch.Currency), resp.Key)
	return true
}

// knownState returns the state, done or failed, of an operation whose
// outcome the jar holds, from the *idem.PendingError or *client.ConflictError
// of a call that got no answer; "" when the operation is pending.
func knownState(err error) idem.State {
	var st idem.State
	var pe *idem.PendingError
	var ce *client.ConflictError
	switch {
	case errors.As(err, &pe):
		st = pe.State
	case errors.As(err, &ce):
		st = ce.State
	}
	if st == idem.StateDone || st == idem.StateFailed {
		return st
	}
	return ""
}

// orderIDs reads -orders: a count N (order-1 … order-N) or a list.
func orderIDs(s string) ([]string, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 1_000_000 {
			return nil, fmt.Errorf("order count %d out of range", n)
		}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = "order-" + strconv.Itoa(i+1)
		}
		return ids, nil
	}
	var ids []string
	for _, id := range strings.Split(s, ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("no order ids")
	}
	return ids, nil
}

// sendable reports whether server is a URL that charges can be sent to:
// the jar stores each charge's URL, and a resume sends it there again.
func sendable(server string) bool {
	u, err := url.Parse(server)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// quoteMasked returns arg, a -server URL or an argument that may be one
// (-server forgotten), quoted for a message, a URL's password masked
// (user:xxxxx@) as url.URL.Redacted masks it. One without an '@' has no
// userinfo, and is quoted as it is; one with an '@' that does not parse is
// not shown, as where its password ends cannot be told.
func quoteMasked(arg string) string {
	if !strings.Contains(arg, "@") {
		return strconv.Quote(arg)
	}
	if u, err := url.Parse(arg); err == nil {
		return strconv.Quote(u.Redacted())
	}
	return "(a URL that does not parse, not shown: it may hold a password)"
}

// argsMasked is w, where the flag package writes its errors, with each of
// args in them, which the flag package quotes (invalid value "…" for flag
// -lease) or prints as it is (flag provided but not defined: -…), and the
// value of each -name=value, as quoteMasked quotes it: a -server URL given
// to -lease or -amount by mistake is not printed with its password.
type argsMasked struct {
	w    io.Writer
	args []string
}

func (m argsMasked) Write(p []byte) (int, error) {
	s := string(p)
	for _, arg := range m.args {
		_, value, _ := strings.Cut(arg, "=")
		for _, a := range []string{arg, value} {
			if q := quoteMasked(a); q != strconv.Quote(a) {
				s = strings.ReplaceAll(strings.ReplaceAll(s, strconv.Quote(a), q), a, q)
			}
		}
	}
	if _, err := io.WriteString(m.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// bearer returns an Options.Header that sends token, or nil without one.
func bearer(token string) func(*http.Request) error {
	if token == "" {
		return nil
	}
	return func(r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
}

// shown returns a string a server sent as it is, or quoted as a Go string
// literal when it holds a character that a terminal would act on or not
// show (a control such as ESC, a bidi override, bytes that are not UTF-8):
// what a server sends must not reach the terminal raw.
func shown(s string) string {
	if q := strconv.Quote(s); q[1:len(q)-1] != s {
		return q
	}
	return s
}
