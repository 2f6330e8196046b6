package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// -db postgres://… and postgresql://… select pgstore, with PayCo's ledger in
// the same database; servers opening an empty database at once all get
// the schema.
func TestPostgresBackend(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := t.Context()
	const n = 4
	bs := make([]*backend, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			spec := dsn
			if i%2 == 1 {
				spec = "postgresql://" + strings.TrimPrefix(dsn, "postgres://")
			}
			bs[i], errs[i] = openBackend(ctx, spec, nil)
		})
	}
	wg.Wait()
	for i, b := range bs {
		if errs[i] != nil {
			t.Fatalf("openBackend %d of %d at once: %v", i, n, errs[i])
		}
		t.Cleanup(func() {
			if err := b.close(); err != nil {
				t.Error(err)
			}
		})
		if _, ok := b.store.(*pgstore.Store); !ok {
			t.Fatalf("backend %d has a %T; want a *pgstore.Store", i, b.store)
		}
	}

	// One ledger: a charge made through one backend is seen by the others,
	// and it is a row in PostgreSQL.
	c, err := bs[0].payco.Charge(ctx, "charge:o-1", "o-1", 1000, "usd")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := bs[1].payco.Charge(ctx, "charge:o-1", "o-1", 1000, "usd"); err != nil || again != c {
		t.Fatalf("same PayCo key through another backend: %+v, %v; want %+v", again, err, c)
	}
	if st, err := bs[2].payco.Stats(ctx); err != nil || st.Charges != 2 || st.Settled != 1 {
		t.Fatalf("stats through a third backend: %+v, %v; want 2 calls, 1 charge", st, err)
	}
	var rows int
	if err := pgtest.Connect(t, dsn).QueryRow(ctx, `SELECT count(*) FROM payco_charges WHERE id = $1`, c.ID).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("charge %s in PostgreSQL: %d rows, %v; want 1", c.ID, rows, err)
	}

	// One key space: a claim through one store is in flight for another.
	now := time.Now()
	if _, claimed, err := bs[1].store.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: now.UnixNano(), ClaimID: "1"}, now); err != nil || !claimed {
		t.Fatalf("first claim: %v, %v; want claimed", claimed, err)
	}
	if e, claimed, err := bs[3].store.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: now.UnixNano() + 1, ClaimID: "3"}, now); err != nil || claimed || e.Status != testserver.StatusInFlight {
		t.Fatalf("second claim through another backend: %+v, %v, %v; want the first one's, in flight", e, claimed, err)
	}
}

// The address line names the database without its password.
func TestRunPostgresHidesPassword(t *testing.T) {
	dsn := strings.Replace(pgtest.DB(t), "postgres://postgres@", "postgres://postgres:hunter2@", 1)
	if !strings.Contains(dsn, "hunter2") {
		t.Fatalf("DSN %q: no user to give a password to", dsn)
	}
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-db", dsn}, pw, io.Discard); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if err != nil || !strings.Contains(line, "listening on http://127.0.0.1:") || strings.Contains(line, "hunter2") ||
		!strings.Contains(line, "postgres://postgres:xxxxx@127.0.0.1:") {
		t.Fatalf("first line %q, %v; want the address and the database with its password masked", line, err)
	}
}

// answer is one charge request's outcome.
type answer struct {
	status     int
	replayed   string
	retryAfter string
	body       []byte
	err        error
}

// Two server processes on one PostgreSQL database, 64 identical requests
// at once split between them: PayCo is called once in total (its stats
// count calls before its own dedup); every other request gets 409 (in
// flight) or the replay of the one answer.
func testFleetOneExecution(t *testing.T, bin string) {
	dsn := pgtest.DB(t)
	// Started together on an empty database: they race to create the schema.
	servers := []*server{
		launch(t, bin, "-db", dsn, "-delay", "200ms"),
		launch(t, bin, "-db", dsn, "-delay", "200ms"),
	}
	for _, s := range servers {
		s.ready(t)
	}

	const n = 64
	answers := make([]answer, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			resp, body, err := servers[i%2].charge("fleet-key", "o-fleet")
			if err != nil {
				answers[i] = answer{err: err}
				return
			}
			answers[i] = answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"),
				retryAfter: resp.Header.Get("Retry-After"), body: body}
		})
	}
	close(gate)
	wg.Wait()

	var first []byte
	fresh, replays, conflicts := 0, 0, 0
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("request %d: %v", i, a.err)
		case a.status == http.StatusCreated && a.replayed == "":
			fresh++
			first = a.body
		case a.status == http.StatusCreated && a.replayed == "true":
			replays++
		case a.status == http.StatusConflict && a.retryAfter != "":
			conflicts++
		default:
			t.Fatalf("request %d: %d %q; want 201, its replay or 409 with Retry-After", i, a.status, a.body)
		}
	}
	if fresh != 1 || replays+conflicts != n-1 {
		t.Fatalf("%d answers made, %d replays, %d conflicts; want 1 made and %d replays or conflicts", fresh, replays, conflicts, n-1)
	}
	for i, a := range answers {
		if a.replayed == "true" && !bytes.Equal(a.body, first) {
			t.Fatalf("request %d replayed %q; want %q", i, a.body, first)
		}
	}
	for i, s := range servers {
		st := s.stats(t)
		if st.Charges != 1 || st.PerOrder["o-fleet"] != 1 || st.Settled != 1 {
			t.Fatalf("stats from server %d: %+v; want PayCo called once for o-fleet", i, st)
		}
	}
	var rows int
	var status string
	if err := pgtest.Connect(t, dsn).QueryRow(t.Context(), `SELECT count(*), min(status) FROM idempotency_keys WHERE key = 'fleet-key'`).Scan(&rows, &status); err != nil || rows != 1 || status != "done" {
		t.Fatalf("keys in PostgreSQL: %d rows, status %q, %v; want one, done", rows, status, err)
	}
	for _, s := range servers {
		s.stop(t)
	}
}

// A server is killed (SIGKILL) after PayCo charged, while it holds the claim.
// The other server takes the claim over once its lease is over and
// answers with PayCo's one charge; the killed server's token no longer
// matches the row, so a late write of it changes nothing.
func testFleetKilledServer(t *testing.T, bin string) {
	dsn := pgtest.DB(t)
	// A server's -lock-timeout also ends its own handler: the victim's is
	// long, so that it is still mid-work when killed however slow the
	// machine. The survivor's is short: that is the lease it waits out.
	victim := start(t, bin, "-db", dsn, "-lock-timeout", "1h", "-delay", "1h")
	survivor := start(t, bin, "-db", dsn, "-lock-timeout", "2s")
	conn := pgtest.Connect(t, dsn)
	ctx := t.Context()
	const key, order = "fleet-kill", "o-kill"

	victimErr := make(chan error, 1)
	go func() {
		resp, body, err := victim.charge(key, order)
		if err == nil {
			err = errors.New(resp.Status + " " + string(body))
		}
		victimErr <- err
	}()
	var victimFence testserver.Fence // the victim's claim, once PayCo has charged for it
	poll(t, 10*time.Second, "the victim to charge", func() bool {
		err := conn.QueryRow(ctx, `SELECT k.locked_at, k.claim_id FROM idempotency_keys k JOIN payco_calls c ON c.order_id = $2
			WHERE k.key = $1 AND k.status = 'in_flight' AND c.calls = 1`, key, order).Scan(&victimFence.Token, &victimFence.ClaimID)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})

	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.cmd.Wait()
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("victim ended with %v; want killed by SIGKILL", victim.cmd.ProcessState)
	}
	if err := <-victimErr; err == nil || strings.Contains(err.Error(), "201") {
		t.Fatalf("victim's caller got %v; want the connection dropped", err)
	}

	resp, body, conflicts := chargeUntilAnswered(t, survivor, key, order, 15*time.Second)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" || conflicts == 0 {
		t.Fatalf("survivor: %d %q after %d conflicts; want 409 while the lease lasted, then its own 201", resp.StatusCode, body, conflicts)
	}
	var c payments.Charge
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	var ids []string
	rows, err := conn.Query(ctx, `SELECT id FROM payco_charges WHERE order_id = $1`, order)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) != 1 || ids[0] != c.ID {
		t.Fatalf("ledger rows for %s: %q, %v; want the one charge answered, %s", order, ids, err, c.ID)
	}
	st := survivor.stats(t)
	if st.PerOrder[order] != 2 || st.Settled != 1 || st.SettledDoubleCharged != 0 {
		t.Fatalf("stats %+v; want the charge run twice (victim, survivor) and made once", st)
	}

	// Fenced: the row is the survivor's now, and a write with the
	// victim's fence, as its save would have been, changes nothing.
	var scope, status string
	var owner int64
	if err := conn.QueryRow(ctx, `SELECT scope, status, locked_at FROM idempotency_keys WHERE key = $1`, key).Scan(&scope, &status, &owner); err != nil {
		t.Fatal(err)
	}
	if status != "done" || owner <= victimFence.Token {
		t.Fatalf("row: %s, token %d; want done under a newer token than the victim's %d", status, owner, victimFence.Token)
	}
	store, err := pgstore.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Save(ctx, scope, key, victimFence, testserver.Response{Status: 500}); !errors.Is(err, testserver.ErrFenced) {
		t.Fatalf("save with the victim's fence: %v; want ErrFenced", err)
	}
	if released, err := store.Release(ctx, scope, key, victimFence); err != nil || released {
		t.Fatalf("release with the victim's fence: %v, %v; want nothing released", released, err)
	}
	resp, again, err := survivor.charge(key, order)
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again, body) {
		t.Fatalf("retry after the takeover: %v %v %q; want %q replayed", resp, err, again, body)
	}
	survivor.stop(t)
}

// poll calls done every few milliseconds until it reports true, for at most
// timeout.
func poll(t *testing.T, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
		<-tick.C
	}
}

// chargeUntilAnswered sends the charge to s until it answers something
// other than 409, never sooner than a 409's Retry-After asks, for at most
// timeout. It returns the answer and how many 409s came before it. Each
// Retry-After must be within the lease of s (2 s).
func chargeUntilAnswered(t *testing.T, s *server, key, order string, timeout time.Duration) (*http.Response, []byte, int) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	next, conflicts := time.Now(), 0
	for time.Now().Before(deadline) {
		if time.Now().Before(next) {
			<-tick.C
			continue
		}
		resp, body, err := s.charge(key, order)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusConflict {
			return resp, body, conflicts
		}
		conflicts++
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 1 || ra > 2 {
			t.Fatalf("409 with Retry-After %q; want 1 or 2 seconds, what is left of the lease", resp.Header.Get("Retry-After"))
		}
		next = time.Now().Add(time.Duration(ra) * time.Second)
	}
	t.Fatalf("no answer but 409 from %s within %v (%d conflicts)", s.url, timeout, conflicts)
	return nil, nil, 0
}

// -query-timeout (pgstore's QueryTimeout) is the statement_timeout of the
// store's sessions and of the ledger's: a ledger statement that waits
// longer for a lock is canceled by the server (57014), rather than left
// waiting, its connection held, for as long as its request's context
// lasts.
func TestPostgresQueryTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := t.Context()
	b, err := openBackend(ctx, dsn, &pgstore.Options{QueryTimeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	var timeout string
	if err := b.store.(*pgstore.Store).Pool().QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil || timeout != "250ms" {
		t.Fatalf("statement_timeout of the store's sessions = %q, %v; want 250ms", timeout, err)
	}
	tx, err := pgtest.Connect(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `LOCK TABLE payco_calls IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// Without a statement_timeout, the charge waits for the lock until
	// this context ends.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = b.payco.Charge(cctx, "charge:o-1", "o-1", 1000, "usd")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("charge while another session locks the ledger: %v; want the server's statement timeout (57014)", err)
	}
}

// A server started on a database at the keys' schema version 1 migrates it
// to the current version within -migration-timeout, whatever the URL's
// statement_timeout; here another session's lock on the key table keeps
// the migration waiting past it. run fails (status 1, not a usage error)
// with pgstore.ErrMigrationTimeout and the server's 57014, and says to
// raise -migration-timeout, and the database stays at version 1. Before
// -migration-timeout, the migration ran within -query-timeout, or a URL's
// statement_timeout of a minute, past the 4 s this test waits.
func TestPostgresMigrationTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := t.Context()
	b, err := openBackend(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, dsn)
	// Back to version 1, as an earlier version of the server left it.
	for _, stmt := range []string{
		`ALTER TABLE idempotency_keys DROP COLUMN claim_id`,
		`ALTER TABLE idempotency_keys ALTER COLUMN scope TYPE text COLLATE "default", ALTER COLUMN key TYPE text COLLATE "default"`,
		`DELETE FROM idempotency_keys_schema WHERE version > 1`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	// 1s, not less: pgstore's own deadline for each statement of the
	// migration, twice -migration-timeout, must not run out before the
	// server cancels the waiting statement, on a busy machine too.
	for _, c := range []struct{ dsn, timeout, want string }{
		{dsn, "1s", "raise -migration-timeout"},
		{dsn + sep + "statement_timeout=60000", "1s", "raise -migration-timeout"},
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE idempotency_keys IN ACCESS SHARE MODE`); err != nil {
			t.Fatal(err)
		}
		// Shorter than pgstore's default QueryTimeout: a server that did
		// not take the timeout would still be waiting when this ends.
		rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		err = run(rctx, []string{"-db", c.dsn, "-migration-timeout", c.timeout, "-addr", "127.0.0.1:0"}, io.Discard, io.Discard)
		cancel()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		var pgErr *pgconn.PgError
		if !errors.Is(err, pgstore.ErrMigrationTimeout) || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("run -migration-timeout %s -db %s while the migration waited: %v; want ErrMigrationTimeout, the server's statement timeout (57014)",
				c.timeout, c.dsn, err)
		}
		var ue *cliflag.UsageError
		if errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("run -migration-timeout %s -db %s while the migration waited: %v; want an error (not a usage error) that says to %s",
				c.timeout, c.dsn, err, c.want)
		}
		var v int
		if err := conn.QueryRow(ctx, `SELECT max(version) FROM idempotency_keys_schema`).Scan(&v); err != nil || v != 1 {
			t.Fatalf("schema version after the failed migration = %d, %v; want 1", v, err)
		}
	}
}

// A -query-timeout too short for the server to connect and read the keys'
// schema runs out of pgstore's own deadline, twice -query-timeout, before
// the server's statement_timeout: run fails (status 1, not a usage error)
// with a line that says to raise -query-timeout, as when the server
// cancels the migration, not with a bare "context deadline exceeded".
func TestPostgresQueryTimeoutTooShort(t *testing.T) {
	dsn := pgtest.DB(t)
	err := run(t.Context(), []string{"-db", dsn, "-query-timeout", "1ms", "-addr", "127.0.0.1:0"}, io.Discard, io.Discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("run -query-timeout 1ms: %v; want an error wrapping context.DeadlineExceeded", err)
	}
	var ue *cliflag.UsageError
	if errors.As(err, &ue) || !strings.Contains(err.Error(), "raise -query-timeout") {
		t.Fatalf("run -query-timeout 1ms: %v; want an error (not a usage error) that says to raise -query-timeout", err)
	}
}

// A URL with pgxpool's own parameters (pool_max_conns, …), which pgstore
// reads, opens the ledger too: they are not sent to the server as
// settings, which it would refuse.
func TestPostgresPoolParameters(t *testing.T) {
	dsn := pgtest.DB(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	b, err := openBackend(t.Context(), dsn+sep+"pool_max_conns=3&pool_min_conns=0", nil)
	if err != nil {
		t.Fatalf("openBackend with pool_max_conns: %v", err)
	}
	defer b.close()
	if got := b.store.(*pgstore.Store).Pool().Config().MaxConns; got != 3 {
		t.Fatalf("store pool: MaxConns %d; want 3", got)
	}
	if _, err := b.payco.Charge(t.Context(), "charge:o-1", "o-1", 1000, "usd"); err != nil {
		t.Fatalf("charge through the ledger: %v", err)
	}
}

// ownedTables returns a new database in which a server started once as
// the owner created the keys' and the ledger's tables.
func ownedTables(t *testing.T) string {
	t.Helper()
	dsn := pgtest.DB(t)
	b, err := openBackend(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// An operator creates the tables by starting a server once as their
// owner, then runs the servers as a role that may read and write them but
// create nothing (PostgreSQL 15 grants no one CREATE on public; revoked
// here for earlier versions). Such a server starts, claims a key, charges
// and replays. Before, PayCo's CREATE TABLE IF NOT EXISTS, which needs
// CREATE on the schema even when the tables exist, kept it from starting
// with SQLSTATE 42501.
func TestPostgresWithoutCreatePrivilege(t *testing.T) {
	dsn := ownedTables(t)
	appDSN := pgtest.AppRole(t, dsn, `GRANT SELECT ON idempotency_keys_schema`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys, payco_calls, payco_charges`)
	b, err := openBackend(t.Context(), appDSN, nil)
	if err != nil {
		t.Fatalf("openBackend as a role that may not create tables: %v", err)
	}
	defer b.close()
	now := time.Now()
	if _, claimed, err := b.store.Claim(t.Context(), "s", "k", "fp", testserver.Fence{Token: now.UnixNano()}, now); err != nil || !claimed {
		t.Fatalf("Claim as that role = %v, %v; want claimed", claimed, err)
	}
	c, err := b.payco.Charge(t.Context(), "charge:o-1", "o-1", 1000, "usd")
	if err != nil {
		t.Fatalf("Charge as that role: %v", err)
	}
	if again, err := b.payco.Charge(t.Context(), "charge:o-1", "o-1", 1000, "usd"); err != nil || again != c {
		t.Fatalf("Charge again with the same key = %+v, %v; want %+v", again, err, c)
	}
}

// A server run as a role that may write the keys but only read PayCo's
// tables does not start: openBackend fails with payments.ErrPrivilege,
// saying what to grant. Before, it started, and answered every charge
// 502 ("permission denied for table payco_calls").
func TestPostgresLedgerReadOnlyRole(t *testing.T) {
	dsn := ownedTables(t)
	appDSN := pgtest.AppRole(t, dsn, `GRANT SELECT ON idempotency_keys_schema, payco_calls, payco_charges`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys`)
	b, err := openBackend(t.Context(), appDSN, nil)
	if err == nil {
		b.close()
	}
	if !errors.Is(err, payments.ErrPrivilege) || err == nil || !strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE ON") {
		t.Fatalf("openBackend as a role that may only read the ledger = %v; want %v saying what to grant", err, payments.ErrPrivilege)
	}
}

// A server starts while another holds the lock under which it creates
// PayCo's tables, in a database whose lock_timeout (set there, or on the
// role, to keep DDL from queueing behind long transactions) is shorter
// than that wait: it must wait for the lock, within its deadline, as
// pgstore's migration does, rather than fail with 55P03
// lock_not_available, which leaves servers that start together but one
// unable to start.
func TestPostgresLedgerLockDespiteLockTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+
		" SET lock_timeout = '10ms'"); err != nil {
		t.Fatal(err)
	}
	var lockTimeout string
	err := pgtest.HoldLock(t, dsn, paycoLock, 50*time.Millisecond, func() error {
		b, err := openBackend(t.Context(), dsn, nil)
		if err != nil {
			return err
		}
		defer b.close()
		// The store's sessions keep the database's lock_timeout.
		return b.store.(*pgstore.Store).Pool().QueryRow(t.Context(), `SHOW lock_timeout`).Scan(&lockTimeout)
	})
	if err != nil {
		t.Fatalf("openBackend while another server created the ledger: %v", err)
	}
	if lockTimeout != "10ms" {
		t.Errorf("lock_timeout of the store's sessions after openBackend = %q; want the database's 10ms", lockTimeout)
	}
}

// A server creates PayCo's tables on its own connection while a
// transaction of the store's pool holds the lock that serialises their
// creation, idle meanwhile. In a database whose
// idle_in_transaction_session_timeout (set there, on the role or in the
// DSN) is shorter than that creation, the server ended that session: the
// lock went with it, and the server failed to start with 25P03. Here
// another session keeps PayCo's index creation waiting for 500 ms, past
// a timeout of 200 ms: openBackend must wait and open.
func TestPostgresLedgerLockDespiteIdleTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	b, err := openBackend(t.Context(), dsn, nil) // PayCo's tables exist
	if err != nil {
		t.Fatal(err)
	}
	b.close()
	ctx := t.Context()
	blocker := pgtest.Connect(t, dsn)
	// Without its index, PayCo's ledger is created again: PayCo only
	// runs its CREATE statements when one of its tables or its index is
	// missing.
	if _, err := blocker.Exec(ctx, `DROP INDEX payco_charges_order`); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{blocker.Config().Database}.Sanitize()+
		" SET idle_in_transaction_session_timeout = '200ms'"); err != nil {
		t.Fatal(err)
	}
	// The blocker's transaction (its session began before the timeout was
	// set) holds a lock that CREATE INDEX waits for.
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `LOCK TABLE payco_charges IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		b, err := openBackend(ctx, dsn, nil)
		if err == nil {
			err = b.close()
		}
		opened <- err
	}()
	watcher := pgtest.Connect(t, dsn)
	poll(t, 30*time.Second, "PayCo's index creation waiting 500ms for the lock", func() bool {
		var n int
		if err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%CREATE INDEX%'
			AND clock_timestamp() - query_start > interval '500 ms'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("openBackend while PayCo's table creation waited past idle_in_transaction_session_timeout: %v", err)
	}
}

// serve runs the server in this process with args, on 127.0.0.1 at a port
// the OS chooses, until t ends, and returns it once it listens.
func serve(t *testing.T, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	const prefix = "idemserver: listening on "
	if err != nil || !strings.HasPrefix(line, prefix) {
		t.Fatalf("first line %q, %v", line, err)
	}
	url, _, _ := strings.Cut(strings.TrimPrefix(line, prefix), " ")
	return &server{url: url}
}

// Once PostgreSQL ended the server's sessions, as a restart or
// pg_terminate_backend does, the next charge is served: PayCo's ledger,
// like the keys' store, hands no statement a connection the server
// closed. Before, database/sql handed out the ledger's connection used
// last (it pings only those idle for a second), the charge failed with
// 502 payco-failed, and -on-error save saved that answer: the key
// answered 502 for good, though nothing was charged and nothing was
// wrong any more.
func TestPostgresLedgerAfterSessionsEnded(t *testing.T) {
	dsn := pgtest.DB(t)
	s := serve(t, "-db", dsn, "-on-error", "save")
	if resp, body, err := s.charge("before", "o-before"); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("charge before: %v %q, %v; want 201", resp, body, err)
	}
	// Ends the database's other sessions, the server's, each waited for
	// (up to 10 s) until it exits.
	var ended int
	if err := pgtest.Connect(t, dsn).QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended); err != nil || ended == 0 {
		t.Fatalf("sessions ended: %d, %v; want the server's", ended, err)
	}
	for i, replayed := range []string{"", "true"} { // the charge, then its retry
		resp, body, err := s.charge("after", "o-after")
		if err != nil {
			t.Fatalf("charge %d after the sessions ended: %v", i+1, err)
		}
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != replayed {
			t.Errorf("charge %d after the sessions ended: %d %q, replayed %q; want 201, replayed %q",
				i+1, resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"), replayed)
		}
	}
}

// PayCo's ledger runs as the keys' store does, whatever the database's or
// the role's defaults: with synchronous_commit on, so that a charge the
// ledger reported made, and an answer saved that names it, are not lost
// in a crash of PostgreSQL, and READ COMMITTED, so that a charge of an
// order that another server is charging under the same PayCo key (the
// worker it took over, still running) waits for that charge and returns
// it. Before, the ledger kept the database's defaults: here
// synchronous_commit=off, and under REPEATABLE READ the second charge
// failed with a serialization error (40001), answered 502 payco-failed.
func TestPostgresLedgerSessionSettings(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := t.Context()
	admin := pgtest.Connect(t, dsn)
	db := pgx.Identifier{admin.Config().Database}.Sanitize()
	for _, stmt := range []string{
		"ALTER DATABASE " + db + " SET default_transaction_isolation = 'repeatable read'",
		"ALTER DATABASE " + db + " SET synchronous_commit = off",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	b, err := openBackend(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()

	// A trigger records synchronous_commit as the ledger's session has it.
	if _, err := admin.Exec(ctx, `CREATE TABLE seen (setting text);
		CREATE FUNCTION seen() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN INSERT INTO seen VALUES (current_setting('synchronous_commit')); RETURN NEW; END$$;
		CREATE TRIGGER seen BEFORE INSERT ON payco_charges FOR EACH ROW EXECUTE FUNCTION seen()`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.payco.Charge(ctx, "charge:o-1", "o-1", 1000, "usd"); err != nil {
		t.Fatal(err)
	}
	var setting string
	if err := admin.QueryRow(ctx, `SELECT setting FROM seen`).Scan(&setting); err != nil || setting != "on" {
		t.Errorf("synchronous_commit of the ledger's session = %q, %v; want on", setting, err)
	}

	// Another server charges order o-2 and has yet to commit.
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `INSERT INTO payco_calls (order_id, calls) VALUES ('o-2', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payco_charges (id, dedup_key, order_id, amount, currency, created)
		VALUES ('ch_other', 'charge:o-2', 'o-2', 1000, 'usd', 0)`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		c   payments.Charge
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := b.payco.Charge(ctx, "charge:o-2", "o-2", 1000, "usd")
		got <- result{c, err}
	}()
	watcher := pgtest.Connect(t, dsn)
	poll(t, 10*time.Second, "the charge to wait for the other server's", func() bool {
		var n int
		if err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.c.ID != "ch_other" {
		t.Errorf("charge of an order another server charged meanwhile = %+v, %v; want its charge, ch_other", r.c, r.err)
	}
}

// timedOut says what to raise for each way pgstore.Open runs out of time:
// -migration-timeout for the migration, -query-timeout (or the URL's
// statement_timeout) for a statement the server canceled otherwise.
func TestTimedOutSaysWhatToRaise(t *testing.T) {
	canceled := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	migration := fmt.Errorf("%w: version 2: %w", pgstore.ErrMigrationTimeout, canceled)
	for _, c := range []struct {
		err       error
		dsn, want string
	}{
		{migration, "postgres://127.0.0.1/db", "raise -migration-timeout"},
		{migration, "postgres://127.0.0.1/db?statement_timeout=100", "raise -migration-timeout"},
		{fmt.Errorf("pgstore: migrate: %w", canceled), "postgres://127.0.0.1/db", "ran past -query-timeout 2s: raise -query-timeout"},
		{fmt.Errorf("pgstore: migrate: %w", canceled), "postgres://127.0.0.1/db?statement_timeout=100", "drop statement_timeout from the URL"},
	} {
		err := timedOut(t.Context(), c.err, c.dsn, &pgstore.Options{QueryTimeout: 2 * time.Second})
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("timedOut(%v, %s) = %v; want it wrapped, saying %q", c.err, c.dsn, err, c.want)
		}
	}
}
