package pgjar_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/jartest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The tests that take a second or more run in parallel: the conformance
// suites, the tests on a cluster of their own (pgtest.Own) and those that
// wait for the server's timeouts or for worker processes. Each has a
// database of its own (pgtest.DB; the roles they make are named after it,
// the settings they change are set on it alone) or a cluster of its own:
// they share nothing. TestTransportOneSendAtATime cannot: it sets an
// environment variable for its workers. The others take a few tenths of
// a second; in parallel too they made no difference that could be measured.

func open(t *testing.T, dsn string, opts *pgjar.Options) *pgjar.Jar {
	t.Helper()
	j, err := pgjar.Open(t.Context(), dsn, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return closeAtEnd(t, j)
}

// closeAtEnd closes j when the test ends, and returns it.
func closeAtEnd(t *testing.T, j *pgjar.Jar) *pgjar.Jar {
	t.Cleanup(func() {
		if err := j.Close(); err != nil && !errors.Is(err, pgjar.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return j
}

// setDatabaseDefault sets a default of dsn's database for the sessions
// that connect after it.
func setDatabaseDefault(t *testing.T, dsn, setting, value string) {
	t.Helper()
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s SET %s = '%s'",
		pgx.Identifier{conn.Config().Database}.Sanitize(), setting, value)); err != nil {
		t.Fatal(err)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	jartest.Run(t, func(t *testing.T) jartest.Jar { return open(t, pgtest.DB(t), nil) })
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func record(op string) idem.Record {
	return idem.Record{Op: op, Key: "key-" + op, Fingerprint: "fp", State: idem.StatePending,
		Method: http.MethodPost, URL: "https://api.example.com/charges", Created: t0, Updated: t0}
}

// TestSecretHeadersNeverReachTheDatabase reads the table itself: no
// credential is in any column, whatever the API returns.
func TestSecretHeadersNeverReachTheDatabase(t *testing.T) {
	dsn := pgtest.DB(t)
	j := open(t, dsn, nil)
	r := record("op")
	r.Header = http.Header{
		"Authorization": {"Bearer sk_live_SECRET1"},
		"Cookie":        {"session=SECRET2"},
		"X-Api-Key":     {"SECRET3"},
		"Content-Type":  {"application/json"},
	}
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	var row string
	if err := pgtest.Connect(t, dsn).QueryRow(t.Context(),
		`SELECT t::text FROM idem_operations t WHERE op = 'op'`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(row, "SECRET") || strings.Contains(row, "Bearer") {
		t.Errorf("stored row holds a credential: %s", row)
	}
	// Their names stay, with no values, for Record.Withheld.
	if !strings.Contains(row, `""Authorization"":[]`) || !strings.Contains(row, `""X-Api-Key"":[]`) {
		t.Errorf("stored row lost the names of the credentials withheld: %s", row)
	}
	if !strings.Contains(row, "application/json") {
		t.Errorf("stored row lost the public header: %s", row)
	}
}

func TestSessionSettings(t *testing.T) {
	dsn := pgtest.DB(t)
	// A database whose default is off: the jar turns it on for itself.
	setDatabaseDefault(t, dsn, "synchronous_commit", "off")
	show := func(j *pgjar.Jar, setting string) string {
		var v string
		if err := pgjar.PoolOf(j).QueryRow(t.Context(), "SHOW "+setting).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	j := open(t, dsn, &pgjar.Options{QueryTimeout: 2 * time.Second})
	if got := show(j, "synchronous_commit"); got != "on" {
		t.Errorf("synchronous_commit = %q; want on", got)
	}
	if got := show(j, "statement_timeout"); got != "2s" {
		t.Errorf("statement_timeout = %q; want 2s, the QueryTimeout", got)
	}
	// An explicit choice in the DSN is the operator's.
	j = open(t, dsn+"&synchronous_commit=remote_write&statement_timeout=0", nil)
	if got := show(j, "synchronous_commit"); got != "remote_write" {
		t.Errorf("synchronous_commit with the DSN's choice = %q; want remote_write", got)
	}
	if got := show(j, "statement_timeout"); got != "0" {
		t.Errorf("statement_timeout with the DSN's choice = %q; want 0", got)
	}
}

// TestCommitModes logs, from a trigger inside each write's transaction,
// the synchronous_commit it commits with: a key creation waits for the WAL
// flush, an Update or a deferred change does not (the idem.Jar contract
// allows losing them), but for an Update to StateAbandoned, which does as
// a key creation does, and a DSN's explicit choice applies to all, also on
// a pool passed to New, and to an Update run in a transaction.
func TestCommitModes(t *testing.T) {
	dsn := pgtest.DB(t)
	open(t, dsn, nil) // creates the schema
	conn := pgtest.Connect(t, dsn)
	for _, stmt := range []string{
		`CREATE TABLE commit_log (n serial, verb text, setting text)`,
		`CREATE FUNCTION log_commit() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				INSERT INTO commit_log (verb, setting) VALUES (TG_OP, current_setting('synchronous_commit'));
				RETURN NULL;
			END $$`,
		`CREATE TRIGGER log_commit AFTER INSERT OR UPDATE ON idem_operations FOR EACH ROW EXECUTE FUNCTION log_commit()`,
	} {
		if _, err := conn.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		dsn          string
		begin, write string
		viaNew       bool
	}{
		{dsn, "on", "off", false},
		{dsn + "&synchronous_commit=remote_write", "remote_write", "remote_write", false},
		{dsn, "on", "off", true},
		{dsn + "&synchronous_commit=remote_write", "remote_write", "remote_write", true},
	} {
		var j *pgjar.Jar
		if c.viaNew {
			j = onPool(t, newPool(t, c.dsn), nil)
		} else {
			j = open(t, c.dsn, nil)
		}
		// A header value that begins with a NUL byte, stored in base64, is
		// one that Update writes in a transaction (see TestDecodes).
		for _, h := range []http.Header{nil, {"X-Nul": {"\x00"}}} {
			if _, err := conn.Exec(t.Context(), `TRUNCATE commit_log`); err != nil {
				t.Fatal(err)
			}
			op := fmt.Sprint("op-", c.begin, c.viaNew, h != nil)
			r := record(op)
			r.Header = h
			if _, _, err := j.Begin(t.Context(), r); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Update(t.Context(), op, "", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
				t.Fatal(err)
			}
			if err := j.Defer(op, "", idem.Change{Now: t0, Attempts: 1}); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Get(t.Context(), op); err != nil { // waits for the deferred change
				t.Fatal(err)
			}
			if _, err := j.Update(t.Context(), op, "", idem.Change{Now: t0, State: idem.StateAbandoned}); err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(t.Context(), `SELECT verb || ' ' || setting FROM commit_log ORDER BY n`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"INSERT " + c.begin, "UPDATE " + c.write, "UPDATE " + c.write, "UPDATE " + c.begin}
			if !slices.Equal(got, want) {
				t.Errorf("DSN %q (New %v), header %q: commits %q; want %q", c.dsn, c.viaNew, h, got, want)
			}
		}
	}
}

func TestInvalid(t *testing.T) {
	j := open(t, pgtest.DB(t), nil)
	ctx := t.Context()
	far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, edit := range map[string]func(*idem.Record){
		"empty op":      func(r *idem.Record) { r.Op = "" },
		"empty key":     func(r *idem.Record) { r.Key = "" },
		"bad state":     func(r *idem.Record) { r.State = "sent" },
		"created 2300":  func(r *idem.Record) { r.Created = far },
		"lease in 1600": func(r *idem.Record) { r.LeaseUntil = time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		r := record("invalid")
		edit(&r)
		_, _, err := j.Begin(ctx, r)
		if !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Begin with %s: err = %v; want ErrInvalid", name, err)
		}
		if strings.Count(err.Error(), "pgjar:") != 1 {
			t.Errorf("Begin with %s: %q; want \"pgjar:\" once", name, err)
		}
	}
	if _, err := j.Get(ctx, "invalid"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("an invalid Begin wrote a record (Get: %v)", err)
	}

	// An empty State means pending.
	r := record("op")
	r.State = ""
	if got, _, err := j.Begin(ctx, r); err != nil || got.State != idem.StatePending {
		t.Fatalf("Begin with no state = %q, %v; want pending", got.State, err)
	}
	if _, err := j.Update(ctx, "op", "", idem.Change{Now: t0, State: "sent"}); !errors.Is(err, pgjar.ErrInvalid) {
		t.Errorf("Update to a bad state: err = %v; want ErrInvalid", err)
	}
	if _, err := j.Update(ctx, "op", "", idem.Change{Now: far}); !errors.Is(err, pgjar.ErrInvalid) {
		t.Errorf("Update at 2300: err = %v; want ErrInvalid", err)
	}
	if _, err := j.Acquire(ctx, "op", "a", far, time.Minute); !errors.Is(err, pgjar.ErrInvalid) {
		t.Errorf("Acquire at 2300: err = %v; want ErrInvalid", err)
	}
	if _, err := j.Acquire(ctx, "op", "a", time.Time{}, time.Minute); !errors.Is(err, pgjar.ErrInvalid) {
		t.Errorf("Acquire at the zero time: err = %v; want ErrInvalid", err)
	}
	if got, err := j.Get(ctx, "op"); err != nil || got.State != idem.StatePending || !got.Updated.Equal(t0) || got.Holder != "" {
		t.Errorf("after invalid changes: %+v, %v; want the record unchanged", got, err)
	}
}

func TestClosed(t *testing.T) {
	jartest.RunClosed(t, func(t *testing.T) jartest.Closer { return open(t, pgtest.DB(t), nil) }, pgjar.ErrClosed)
}

// uncommitted inserts a record for op with key "theirs" in a transaction it
// leaves open until the test ends, unless the test ends it first.
func uncommitted(t *testing.T, dsn, op string) pgx.Tx {
	t.Helper()
	tx, err := pgtest.Connect(t, dsn).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `INSERT INTO idem_operations (op, key, fingerprint, state, method, url,
		body_size, attempts, last_status, last_error, note, holder)
		VALUES ($1, 'theirs', '', 'pending', 'POST', '', 0, 0, 0, '', '', '')`, op); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestQueryTimeoutFailsClosed blocks the jar's statements behind another
// transaction's locks: each fails with its deadline, and never reports a
// key or a lease it did not get.
func TestQueryTimeoutFailsClosed(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	j := open(t, dsn, &pgjar.Options{QueryTimeout: time.Second})
	ctx := t.Context()
	if _, _, err := j.Begin(ctx, record("locked")); err != nil {
		t.Fatal(err)
	}
	tx := uncommitted(t, dsn, "uncommitted")
	if _, err := tx.Exec(ctx, `SELECT FROM idem_operations WHERE op = 'locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// The server cancels each statement at the timeout, before the jar
	// gives up waiting: the error is the server's, and nothing is applied
	// later when the locks go.
	rec, created, err := j.Begin(ctx, record("uncommitted"))
	if err == nil || created {
		t.Errorf("Begin blocked past its timeout = %+v, created %v, %v; want an error", rec, created, err)
	}
	checkCancelled(t, "Begin", err)
	rec, err = j.Acquire(ctx, "locked", "a", t0, time.Minute)
	if err == nil || rec.Holder == "a" {
		t.Errorf("Acquire blocked past its timeout = holder %q, %v; want an error", rec.Holder, err)
	}
	checkCancelled(t, "Acquire", err)
	_, err = j.Update(ctx, "locked", "", idem.Change{Now: t0, State: idem.StateDone})
	checkCancelled(t, "Update", err)
	checkCancelled(t, "Forget", j.Forget(ctx, "locked"))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := j.Get(ctx, "locked"); err != nil || got.State != idem.StatePending || got.Holder != "" {
		t.Errorf("after timed-out writes: %+v, %v; want the record unchanged", got, err)
	}
	if _, err := j.Get(ctx, "uncommitted"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("the timed-out Begin created a record later (Get: %v)", err)
	}
}

// checkCancelled checks that err is the server's statement timeout.
func checkCancelled(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Errorf("%s: err = %v; want the server's query_canceled (57014)", what, err)
	}
}

// TestPoolWaitLeavesTheServerFirst has a Begin wait for the pool's only
// connection for most of its own deadline, and then for a lock: the
// server's statement_timeout must still be the first to give up, so that
// the record Begin reported as not created is not created later, once the
// lock is free (pending, never sent, and leased for a minute to a call
// that returned an error).
func TestPoolWaitLeavesTheServerFirst(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	j := open(t, dsn+"&pool_max_conns=1", &pgjar.Options{QueryTimeout: time.Second})
	ctx := t.Context()
	if _, _, err := j.Begin(ctx, record("busy")); err != nil {
		t.Fatal(err)
	}
	// An uncommitted record of "op", and a lock on "busy".
	tx := uncommitted(t, dsn, "op")
	if _, err := tx.Exec(ctx, `SELECT FROM idem_operations WHERE op = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The pool's connection waits for the lock on "busy" for 1.5 s (its
	// own statement_timeout), while Begin waits for the connection.
	busy := make(chan error, 1)
	go func() {
		busy <- pgx.BeginFunc(ctx, pgjar.PoolOf(j), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 1500`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT FROM idem_operations WHERE op = 'busy' FOR UPDATE`)
			return err
		})
	}()
	waitBlocked(t, pgtest.Connect(t, dsn))
	rec, created, err := j.Begin(ctx, record("op"))
	if created || rec.Key != "" {
		t.Fatalf("Begin of a name locked by another transaction = key %q, created %v", rec.Key, created)
	}
	checkCancelled(t, "Begin", err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	checkCancelled(t, "the statement holding the pool", <-busy)
	if _, err := j.Get(ctx, "op"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("after the lock was freed: Get = %v; want ErrNotFound, no record created by the failed Begin", err)
	}
}

// TestServerRestart restarts PostgreSQL (as pg_ctl restart -m fast) under a
// jar in use. While it is down, a Begin and a fenced Update try again
// until their context ends, fail with its error (not ErrLeaseLost), and
// change nothing. After it, every call
// succeeds, the first one included: the pool hands no statement a
// connection the server closed (one call failed per connection it held,
// when it pinged only those idle for a second). The record begun before is
// still pending under its holder's lease, and updates.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	c, dsn := pgtest.Own(t)
	const conns = 4
	j := open(t, fmt.Sprintf("%s&pool_max_conns=%d", dsn, conns), nil)
	ctx := t.Context()
	before := record("before")
	before.Holder, before.LeaseUntil = "w1", t0.Add(time.Hour)
	if _, _, err := j.Begin(ctx, before); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range conns { // every connection of the pool used just now
		wg.Go(func() {
			if _, err := j.Get(ctx, "before"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	err := c.Restart(ctx, func() {
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, created, err := j.Begin(dctx, record("down")); !errors.Is(err, context.DeadlineExceeded) || created {
			t.Errorf("Begin while the server is down = created %v, %v; want its context's error", created, err)
		}
		dctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := j.Update(dctx, "before", "w1", idem.Change{Now: t0, State: idem.StateDone}); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Update while the server is down = %v; want its context's error, not ErrLeaseLost", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		rec, err := j.Get(ctx, "before")
		if err != nil {
			t.Errorf("Get %d after the restart: %v", i+1, err)
		} else if rec.State != idem.StatePending || rec.Holder != "w1" {
			t.Errorf("the record begun before: state %s, holder %q; want pending, w1", rec.State, rec.Holder)
		}
	}
	if _, err := j.Get(ctx, "down"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("the record begun while down: Get = %v; want ErrNotFound", err)
	}
	if _, err := j.Update(ctx, "before", "w1", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
		t.Errorf("Update after the restart: %v", err)
	}
}

// TestWritesAcrossRestart restarts PostgreSQL between two calls on a jar
// whose pool holds a connection: Begin, Acquire and Update find the server
// down, and run again once it is back, an Update that counts an attempt
// included (nothing was sent). Before, they failed with the refused
// connection.
func TestWritesAcrossRestart(t *testing.T) {
	t.Parallel()
	c, dsn := pgtest.Own(t)
	relay, dsn := pgtest.NewRelay(t, dsn)
	j := open(t, dsn, nil)
	ctx := t.Context()
	if _, _, err := j.Begin(ctx, record("acquired")); err != nil {
		t.Fatal(err)
	}
	leased(t, j, "updated")

	var (
		rec     idem.Record
		created bool
	)
	err := pgtest.CallDuringRestart(t, c, relay, func() (err error) {
		rec, created, err = j.Begin(ctx, record("begun"))
		return err
	})
	if err != nil || !created || rec.Key != "key-begun" {
		t.Errorf("Begin across a restart = key %q, created %v, %v; want key-begun created", rec.Key, created, err)
	}
	err = pgtest.CallDuringRestart(t, c, relay, func() (err error) {
		rec, err = j.Acquire(ctx, "acquired", "w", t0, time.Minute)
		return err
	})
	if err != nil || rec.Holder != "w" {
		t.Errorf("Acquire across a restart = holder %q, %v; want w", rec.Holder, err)
	}
	err = pgtest.CallDuringRestart(t, c, relay, func() (err error) {
		rec, err = j.Update(ctx, "updated", "h", idem.Change{Now: t0, Attempts: 1})
		return err
	})
	if err != nil || rec.Attempts != 1 {
		t.Errorf("Update across a restart = %d attempts, %v; want 1", rec.Attempts, err)
	}
}

// TestReadsAndDeletesAcrossRestart restarts PostgreSQL between two calls
// on a jar whose pool holds a connection: Get, List, ByKey, Forget,
// ForgetKey and Prune find the server down, and run again once it is
// back. A Forget of an op the jar does not hold still reports it not
// found: nothing was sent, so nothing was lost. Before, each failed with
// the refused connection.
func TestReadsAndDeletesAcrossRestart(t *testing.T) {
	t.Parallel()
	c, dsn := pgtest.Own(t)
	relay, dsn := pgtest.NewRelay(t, dsn)
	j := open(t, dsn, nil)
	ctx := t.Context()
	for _, op := range []string{"read", "forgotten", "forgotten-by-key", "pruned"} {
		if _, _, err := j.Begin(ctx, record(op)); err != nil {
			t.Fatal(err)
		}
	}
	for _, op := range []string{"forgotten-by-key", "pruned"} {
		if _, err := j.Update(ctx, op, "", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
			t.Fatal(err)
		}
	}
	for _, call := range []struct {
		name string
		call func() error
	}{
		{"Get", func() error {
			rec, err := j.Get(ctx, "read")
			if err == nil && rec.Key != "key-read" {
				err = fmt.Errorf("key %q; want key-read", rec.Key)
			}
			return err
		}},
		{"List", func() error {
			all, err := j.List(ctx, idem.Filter{})
			if err == nil && len(all) != 4 {
				err = fmt.Errorf("%d records; want 4", len(all))
			}
			return err
		}},
		{"ByKey", func() error {
			found, err := j.ByKey(ctx, "key-read")
			if err == nil && len(found) != 1 {
				err = fmt.Errorf("%d records; want 1", len(found))
			}
			return err
		}},
		{"Forget", func() error { return j.Forget(ctx, "forgotten") }},
		{"Forget of an unknown op", func() error {
			if err := j.Forget(ctx, "unknown"); !errors.Is(err, idem.ErrNotFound) {
				return fmt.Errorf("%v; want ErrNotFound", err)
			}
			return nil
		}},
		{"ForgetKey", func() error { return j.ForgetKey(ctx, "forgotten-by-key", "key-forgotten-by-key") }},
		{"Prune", func() error {
			n, err := j.Prune(ctx, t0.Add(time.Hour), 0)
			if err == nil && n != 1 {
				err = fmt.Errorf("%d pruned; want 1", n)
			}
			return err
		}},
	} {
		if err := pgtest.CallDuringRestart(t, c, relay, call.call); err != nil {
			t.Errorf("%s across a restart: %v", call.name, err)
		}
	}
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 1 || all[0].Op != "read" {
		t.Errorf("left after the calls: %v, %v; want only read", all, err)
	}
}

// answerLost calls call with relay set to lose the answer to the next
// statement whose command tag begins with tag, and fails t when no answer
// was lost.
func answerLost(t *testing.T, relay *pgtest.Relay, tag string, call func()) {
	t.Helper()
	lost := relay.LoseNext(tag)
	call()
	select {
	case <-lost:
	default:
		t.Fatal("the relay lost no answer")
	}
}

// TestBeginAnswerLost loses the answer to a Begin whose INSERT committed:
// Begin runs it again, which finds the record it wrote itself, and reports
// it created, as it is, not found (its caller would take its own key for
// another's). Before, Begin returned the lost connection's error. A Begin
// whose lost INSERT found another's record still reports that record
// found.
func TestBeginAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, nil)
	ctx := t.Context()
	mine := record("mine")
	mine.Holder, mine.LeaseUntil = "h", t0.Add(time.Minute)
	answerLost(t, relay, "INSERT", func() {
		rec, created, err := j.Begin(ctx, mine)
		if err != nil || !created || rec.Key != mine.Key || rec.Holder != "h" {
			t.Errorf("Begin whose answer was lost = key %q, holder %q, created %v, %v; want its own key, created",
				rec.Key, rec.Holder, created, err)
		}
	})
	if _, _, err := j.Begin(ctx, record("theirs")); err != nil {
		t.Fatal(err)
	}
	again := record("theirs")
	again.Key, again.Holder = "another-key", "h2"
	answerLost(t, relay, "INSERT", func() {
		rec, created, err := j.Begin(ctx, again)
		if err != nil || created || rec.Key != "key-theirs" {
			t.Errorf("Begin of a name taken, whose answer was lost = key %q, created %v, %v; want key-theirs found",
				rec.Key, created, err)
		}
	})
}

// TestAcquireAnswerLost loses the answer to an Acquire whose UPDATE
// committed: run again, it finds the lease its own, and takes it again.
// Before, Acquire returned the lost connection's error.
func TestAcquireAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, nil)
	if _, _, err := j.Begin(t.Context(), record("op")); err != nil {
		t.Fatal(err)
	}
	answerLost(t, relay, "UPDATE", func() {
		if rec, err := j.Acquire(t.Context(), "op", "w", t0, time.Minute); err != nil || rec.Holder != "w" {
			t.Errorf("Acquire whose answer was lost = holder %q, %v; want w", rec.Holder, err)
		}
	})
}

// TestUpdateAnswerLost loses the answer to an Update whose UPDATE
// committed. One that releases the lease is run again, which its own
// release fences off: Update finds the record as the change left it, and
// returns it (before, the lost connection's error; a mere resend would
// report ErrLeaseLost). One that counts an attempt and keeps the lease is
// not run again, which would count it twice: Update returns the error,
// and the attempt is counted once.
func TestUpdateAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, nil)
	ctx := t.Context()
	leased(t, j, "released")
	leased(t, j, "counted")
	answerLost(t, relay, "UPDATE", func() {
		rec, err := j.Update(ctx, "released", "h", done)
		if err != nil || rec.State != idem.StateDone || rec.Holder != "" {
			t.Errorf("release whose answer was lost = %s, holder %q, %v; want done, free", rec.State, rec.Holder, err)
		}
	})
	answerLost(t, relay, "UPDATE", func() {
		if _, err := j.Update(ctx, "counted", "h", idem.Change{Now: t0, Attempts: 1}); err == nil || errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("counted attempt whose answer was lost = %v; want the lost connection's error", err)
		}
	})
	if rec, err := j.Get(ctx, "counted"); err != nil || rec.Attempts != 1 || rec.Holder != "h" {
		t.Errorf("record counted = %d attempts, holder %q, %v; want 1, h", rec.Attempts, rec.Holder, err)
	}
}

// TestAbandonKeyAnswerLost loses the answer to AbandonKey's UPDATE, which
// committed: sent again, it finds the record abandoned as the lost one left
// it, and reports it abandoned, not ErrNotAbandoned.
func TestAbandonKeyAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, nil)
	ctx := t.Context()
	if _, _, err := j.Begin(ctx, record("abandoned")); err != nil {
		t.Fatal(err)
	}
	answerLost(t, relay, "UPDATE", func() {
		if err := j.AbandonKey(ctx, "abandoned", "key-abandoned", "", "did not happen", t0.Add(time.Hour)); err != nil {
			t.Errorf("AbandonKey whose answer was lost: %v", err)
		}
	})
	if rec, err := j.Get(ctx, "abandoned"); err != nil || rec.State != idem.StateAbandoned || rec.Note != "did not happen" {
		t.Errorf("after AbandonKey: %s, note %q, %v; want abandoned, did not happen", rec.State, rec.Note, err)
	}
}

// TestDeleteAnswerLost loses the answer to a DELETE that committed.
// Forget and ForgetKey run it again, which finds nothing, and report the
// record forgotten, as it is, not ErrNotFound. Prune without a limit runs
// its batch again, which deletes what is left: every prunable record is
// gone, and the count misses the rows of the lost batch. Before, each
// returned the lost connection's error. Prune with a limit does not run a
// lost batch again, which could delete more than the limit: it returns
// the error, and what the batch deleted stays within the limit.
func TestDeleteAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, &pgjar.Options{PruneBatch: 2})
	ctx := t.Context()
	beginDone(t, j, "forgotten")
	beginDone(t, j, "forgotten-by-key")
	answerLost(t, relay, "DELETE", func() {
		if err := j.Forget(ctx, "forgotten"); err != nil {
			t.Errorf("Forget whose answer was lost: %v", err)
		}
	})
	answerLost(t, relay, "DELETE", func() {
		if err := j.ForgetKey(ctx, "forgotten-by-key", "key-forgotten-by-key"); err != nil {
			t.Errorf("ForgetKey whose answer was lost: %v", err)
		}
	})
	for _, op := range []string{"forgotten", "forgotten-by-key"} {
		if _, err := j.Get(ctx, op); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get(%q) after its Forget: %v; want ErrNotFound", op, err)
		}
	}

	for i := range 5 {
		beginDone(t, j, fmt.Sprint("pruned-", i))
	}
	answerLost(t, relay, "DELETE", func() {
		// Batches of 2: the first one's answer is lost, 2 and then 1 are
		// counted.
		if n, err := j.Prune(ctx, t0.Add(time.Hour), 0); n != 3 || err != nil {
			t.Errorf("Prune whose first answer was lost = %d, %v; want 3, the rows of the batches answered", n, err)
		}
	})
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 0 {
		t.Errorf("left after Prune: %d records, %v; want none", len(all), err)
	}

	for i := range 3 {
		beginDone(t, j, fmt.Sprint("limited-", i))
	}
	answerLost(t, relay, "DELETE", func() {
		if n, err := j.Prune(ctx, t0.Add(time.Hour), 1); n != 0 || err == nil {
			t.Errorf("Prune(limit 1) whose answer was lost = %d, %v; want 0 and the lost connection's error", n, err)
		}
	})
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 2 {
		t.Errorf("left after Prune(limit 1): %d records, %v; want 2", len(all), err)
	}
}

// TestCallerDeadlineFailsClosed gives up through the caller's context,
// before the server's timeout: the call fails, and reports no key.
func TestCallerDeadlineFailsClosed(t *testing.T) {
	dsn := pgtest.DB(t)
	j := open(t, dsn, nil)
	uncommitted(t, dsn, "op")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	rec, created, err := j.Begin(ctx, record("op"))
	if err == nil || created || rec.Key != "" {
		t.Errorf("Begin past the caller's deadline = key %q, created %v, %v; want an error and no key", rec.Key, created, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v; want it to wrap context.DeadlineExceeded", err)
	}
}

// TestWritesSeeRecordsCommittedWhileTheyWait makes Begin wait for another
// transaction's uncommitted record of the same name, then commits it:
// Begin must return that record, not create a second key. Acquire and a
// fenced Update that wait for another holder's lease must likewise see it
// (ErrLeased, ErrLeaseLost). All hold when the database's default
// isolation is stricter than READ COMMITTED, a setting some databases
// have, where they would fail with a serialization error instead (which
// idem.Transport returns as a *idem.JarError, where it would resume with
// the key or wait for the lease).
func TestWritesSeeRecordsCommittedWhileTheyWait(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"", "repeatable read", "serializable"} {
		t.Run("default "+level, func(t *testing.T) {
			dsn := pgtest.DB(t)
			conn := pgtest.Connect(t, dsn)
			if level != "" {
				setDatabaseDefault(t, dsn, "default_transaction_isolation", level)
			}
			j := open(t, dsn, nil)
			ctx := t.Context()
			// concurrently runs f while tx holds the row it needs, and
			// commits tx: f's error.
			concurrently := func(tx pgx.Tx, f func() error) error {
				errc := make(chan error, 1)
				go func() { errc <- f() }()
				waitBlocked(t, conn)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				return <-errc
			}

			err := concurrently(uncommitted(t, dsn, "op"), func() error {
				rec, created, err := j.Begin(ctx, record("op"))
				if err == nil && (created || rec.Key != "theirs") {
					err = fmt.Errorf("key %q, created %v; want their key, not created", rec.Key, created)
				}
				return err
			})
			if err != nil {
				t.Errorf("Begin of a record created while it waited: %v", err)
			}

			lease := func() pgx.Tx {
				tx, err := pgtest.Connect(t, dsn).Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tx.Rollback(context.Background()) })
				if _, err := tx.Exec(ctx, `UPDATE idem_operations SET holder = 'other', lease_until = $1 WHERE op = 'op'`,
					t0.Add(time.Hour).UnixNano()); err != nil {
					t.Fatal(err)
				}
				return tx
			}
			err = concurrently(lease(), func() error {
				_, err := j.Acquire(ctx, "op", "me", t0, time.Minute)
				return err
			})
			if !errors.Is(err, idem.ErrLeased) {
				t.Errorf("Acquire of a lease taken while it waited = %v; want ErrLeased", err)
			}

			if _, err := j.Update(ctx, "op", "", idem.Change{Now: t0, Release: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Acquire(ctx, "op", "me", t0, time.Minute); err != nil {
				t.Fatal(err)
			}
			err = concurrently(lease(), func() error {
				_, err := j.Update(ctx, "op", "me", idem.Change{Now: t0, State: idem.StateDone})
				return err
			})
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("Update of a lease taken while it waited = %v; want ErrLeaseLost", err)
			}
		})
	}
}

// waitBlocked waits until a backend of the database waits for a lock.
func waitBlocked(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for range 100_000 {
		var waiting int
		err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
	}
	t.Fatal("never saw a backend wait for a lock")
}

// TestAcquireUnderContention has goroutines on two jars (two pools, as two
// processes) take and release one lease as fast as they can: a refusal is
// ErrLeased, never another error, and no two hold it at once.
func TestAcquireUnderContention(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	jars := []*pgjar.Jar{open(t, dsn, nil), open(t, dsn, nil)}
	if _, _, err := jars[0].Begin(t.Context(), record("op")); err != nil {
		t.Fatal(err)
	}
	const goroutines, attempts = 8, 100
	var (
		inside, maxInside, held atomic.Int64
		wg                      sync.WaitGroup
	)
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			j, holder := jars[g%2], fmt.Sprint("holder-", g)
			<-start
			for range attempts {
				_, err := j.Acquire(t.Context(), "op", holder, time.Now(), time.Minute)
				if errors.Is(err, idem.ErrLeased) {
					continue
				}
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				n := inside.Add(1)
				for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
				}
				inside.Add(-1)
				held.Add(1)
				if _, err := j.Update(t.Context(), "op", holder, idem.Change{Now: time.Now(), Attempts: 1, Release: true}); err != nil {
					t.Errorf("release: %v", err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if maxInside.Load() != 1 {
		t.Errorf("at most %d holders at once; want 1", maxInside.Load())
	}
	if rec, err := jars[1].Get(t.Context(), "op"); err != nil || int64(rec.Attempts) != held.Load() || rec.Holder != "" {
		t.Errorf("record: %d attempts, holder %q, %v; want %d attempts, no holder", rec.Attempts, rec.Holder, err, held.Load())
	}
}

func TestPruneInBatches(t *testing.T) {
	j := open(t, pgtest.DB(t), &pgjar.Options{PruneBatch: 2})
	ctx := t.Context()
	for i := range 7 {
		op := fmt.Sprint("done-", i)
		if _, _, err := j.Begin(ctx, record(op)); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Update(ctx, op, "", idem.Change{Now: t0.Add(time.Duration(i) * time.Second), State: idem.StateDone}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := j.Begin(ctx, record("pending")); err != nil {
		t.Fatal(err)
	}
	before := t0.Add(time.Hour)
	if n, err := j.Prune(ctx, before, 3); n != 3 || err != nil {
		t.Fatalf("Prune(limit 3) = %d, %v; want 3", n, err)
	}
	// The least recently updated went first.
	for i := range 7 {
		_, err := j.Get(ctx, fmt.Sprint("done-", i))
		if gone := errors.Is(err, idem.ErrNotFound); gone != (i < 3) {
			t.Errorf("done-%d pruned = %v; want %v", i, gone, i < 3)
		}
	}
	if n, err := j.Prune(ctx, before, 0); n != 4 || err != nil {
		t.Fatalf("Prune(no limit) = %d, %v; want the 4 left", n, err)
	}
	if n, err := j.Prune(ctx, time.Time{}, 0); n != 0 || err != nil {
		t.Errorf("Prune(before the zero time) = %d, %v; want 0", n, err)
	}
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 1 || all[0].Op != "pending" {
		t.Errorf("left after Prune: %v, %v; want only pending", all, err)
	}
}

// beginDone begins op in j and marks it done at t0.
func beginDone(t *testing.T, j *pgjar.Jar, op string) {
	t.Helper()
	if _, _, err := j.Begin(t.Context(), record(op)); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(t.Context(), op, "", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
}

// TestPruneLimitWithStaleStatistics: Prune deletes at most its limit when
// the table's statistics are out of date, as they are in a jar that grew
// since autovacuum last analysed it. The planner then takes the table for
// one row and runs the subquery that picks the batch again for each row it
// scans, each run locking, and picking, a row the last one did not.
func TestPruneLimitWithStaleStatistics(t *testing.T) {
	dsn := pgtest.DB(t)
	j := open(t, dsn, nil)
	ctx := t.Context()
	beginDone(t, j, "done-0")
	if _, err := pgtest.Connect(t, dsn).Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		beginDone(t, j, fmt.Sprint("done-", i))
	}
	if n, err := j.Prune(ctx, t0.Add(time.Hour), 1); n != 1 || err != nil {
		t.Errorf("Prune(limit 1) = %d, %v; want 1", n, err)
	}
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 3 {
		t.Errorf("left after Prune(limit 1): %d records, %v; want 3", len(all), err)
	}
}

func TestMigrations(t *testing.T) {
	dsn := pgtest.DB(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			j, err := pgjar.Open(t.Context(), dsn, nil)
			if err != nil {
				t.Errorf("concurrent Open: %v", err)
				return
			}
			j.Close()
		})
	}
	wg.Wait()
	conn := pgtest.Connect(t, dsn)
	var versions string
	if err := conn.QueryRow(t.Context(),
		`SELECT string_agg(version::text, ',' ORDER BY version) FROM idem_operations_schema`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != "1,2" {
		t.Errorf("schema versions = %q; want 1,2", versions)
	}
	if _, err := conn.Exec(t.Context(), `INSERT INTO idem_operations_schema (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pgjar.Open(t.Context(), dsn, nil); !errors.Is(err, pgjar.ErrVersion) {
		t.Errorf("Open of a newer schema: err = %v; want ErrVersion", err)
	}
}

// TestOpenWaitsForAnotherMigrationDespiteLockTimeout opens a jar while
// another worker holds the migration lock, in a database whose
// lock_timeout (set there, or on the role, to keep DDL from queueing
// behind long transactions) is shorter than that migration: Open must wait
// for it, within its own deadline, rather than fail with 55P03
// lock_not_available, which leaves workers that start together but one
// unable to start.
func TestOpenWaitsForAnotherMigrationDespiteLockTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	setDatabaseDefault(t, dsn, "lock_timeout", "10ms")
	err := pgtest.HoldLock(t, dsn, pgjar.MigrateLock, 50*time.Millisecond, func() error {
		j, err := pgjar.Open(t.Context(), dsn, nil)
		if err == nil {
			j.Close()
		}
		return err
	})
	if err != nil {
		t.Errorf("Open after another worker migrated: %v", err)
	}
}

// TestOpenWithoutCreatePrivilege opens, as a role that may read and write
// the jar's tables but not create any (a deployment that migrates under
// another role), a database whose schema is current: Open must not need to
// create anything.
func TestOpenWithoutCreatePrivilege(t *testing.T) {
	dsn := pgtest.DB(t)
	open(t, dsn, nil) // creates the schema, as the owner
	conn := pgtest.Connect(t, dsn)
	role := conn.Config().Database + "_worker"
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON idem_operations_schema TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idem_operations TO ` + role,
	} {
		if _, err := conn.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	j, err := pgjar.Open(t.Context(), u.String(), nil)
	if err != nil {
		t.Fatalf("Open as a role that cannot create tables: %v", err)
	}
	defer j.Close()
	if _, created, err := j.Begin(t.Context(), record("op")); err != nil || !created {
		t.Errorf("Begin as that role = %v, %v; want created", created, err)
	}
}

// TestOpenWithoutCreatePrivilegeNoJar opens, as a role that may use a
// schema owned by another but not create anything in it, a database that
// does not hold the jar yet: Open returns ErrPrivilege, naming the schema
// and saying to open the jar once as a role that may, with the server's
// error (42501) still in it, and creates nothing. Before, it was a bare
// "pgjar: migrate: ERROR: permission denied for schema jobs (SQLSTATE
// 42501)".
func TestOpenWithoutCreatePrivilegeNoJar(t *testing.T) {
	dsn := pgtest.DB(t)
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	_, err := pgjar.Open(t.Context(), pgtest.AppRole(t, dsn, `GRANT USAGE ON SCHEMA jobs`)+"&search_path=jobs", nil)
	pgtest.RefusedCreate(t, dsn, err, pgjar.ErrPrivilege, "jobs")
}

// TestOpenWithoutAdvisoryLock opens an existing jar as a role that may use
// its tables but not execute pg_advisory_xact_lock, which the migration
// takes: Open returns ErrPrivilege naming the function, not a bare
// SQLSTATE 42501; with MustExist, which takes no lock, it opens.
func TestOpenWithoutAdvisoryLock(t *testing.T) {
	dsn := pgtest.DB(t)
	open(t, dsn, nil) // creates the schema, as the owner
	app := pgtest.AppRole(t, dsn, `GRANT SELECT ON idem_operations_schema`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idem_operations`)
	pgtest.RefusedLock(t, dsn, pgjar.ErrPrivilege, func() error {
		j, err := pgjar.Open(t.Context(), app, nil)
		if err == nil {
			j.Close()
		}
		return err
	})
	open(t, app, &pgjar.Options{MustExist: true})
}

// TestMigrationsStartingTogether: processes whose migrations wait for one
// another migrate once, also when the database's default isolation is
// REPEATABLE READ.
func TestMigrationsStartingTogether(t *testing.T) {
	dsn := pgtest.DB(t)
	errs := pgtest.StartTogether(t, dsn, pgjar.MigrateLock, 2, func() error {
		j, err := pgjar.Open(t.Context(), dsn, nil)
		if err == nil {
			j.Close()
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("Open of a worker starting together with another: %v", err)
		}
	}
}

func TestOpenBadDSN(t *testing.T) {
	if _, err := pgjar.Open(t.Context(), "postgres://%zz", nil); err == nil {
		t.Error("Open with a malformed DSN: no error")
	}
}

// plan is the part of EXPLAIN (ANALYZE, FORMAT JSON) that listScan reads.
type plan struct {
	NodeType    string `json:"Node Type"`
	IndexName   string `json:"Index Name"`
	IndexCond   string `json:"Index Cond"`
	ActualRows  int    `json:"Actual Rows"`
	RowsRemoved int    `json:"Rows Removed by Filter"`
	Plans       []plan `json:"Plans"`
}

// TestListPagePlan: on a table of 100,000 operations, a page of List of
// 1000, from the start or after a cursor, is a Limit over an index scan
// that begins at the cursor (its Index Cond) and reads the page: no
// sequential scan, no sort. Without a State it reads
// idem_operations_by_created; with one, idem_operations_by_state_created,
// and no record of another state.
func TestListPagePlan(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DB(t)
	// A minute for the INSERT of 100 000 rows below, which a loaded
	// machine has taken past the default 5 s.
	j := open(t, dsn, &pgjar.Options{QueryTimeout: time.Minute})
	ctx := t.Context()
	// In the order of their times, as a jar's records are written; three
	// share each Created; one in ten pending.
	if _, err := pgjar.PoolOf(j).Exec(ctx, `INSERT INTO idem_operations
		(op, key, fingerprint, state, method, url, body_size, created, updated, attempts, last_status, last_error, note, holder)
		SELECT 'op-' || lpad(i::text, 6, '0'), 'k' || i, 'fp', CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'done' END,
			'POST', 'http://127.0.0.1/', 0, $1::bigint + (i::bigint / 3) * 1000000, $1::bigint, 1, 201, '', '', ''
		FROM generate_series(1, 100000) AS i`, time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, err := pgjar.PoolOf(j).Exec(ctx, "ANALYZE idem_operations"); err != nil {
		t.Fatal(err)
	}
	cursor, err := j.Get(ctx, "op-050001")
	if err != nil {
		t.Fatal(err)
	}
	const page = 1000
	byCreated, byState := "idem_operations_by_created", "idem_operations_by_state_created"
	for _, c := range []struct {
		name   string
		f      idem.Filter
		index  string
		cond   string // in the scan's Index Cond
		others int    // at most this many rows of other states read
	}{
		{"first page", idem.Filter{Limit: page}, byCreated, "", 0},
		{"first page pending", idem.Filter{Limit: page, State: idem.StatePending}, byState, "(state = ", 0},
		{"after a cursor", idem.Filter{Limit: page, After: cursor.Cursor()}, byCreated, "ROW(created, op) > ROW(", 0},
		{"after a cursor pending", idem.Filter{Limit: page, After: cursor.Cursor(), State: idem.StatePending}, byState,
			"ROW(created, op) > ROW(", 0},
		{"after a cursor at the zero time", idem.Filter{Limit: page, After: idem.Cursor{Op: "op-1"}}, byCreated, "", 0},
		{"after a cursor at the zero time pending", idem.Filter{Limit: page, After: idem.Cursor{Op: "op-1"}, State: idem.StatePending},
			byState, "(state = ", 0},
	} {
		scan := listScan(t, j, c.f)
		if scan.IndexName != c.index || !strings.Contains(scan.IndexCond, c.cond) || scan.ActualRows != page ||
			scan.RowsRemoved > c.others {
			t.Errorf("%s: scan %+v; want an index scan of %s (Index Cond %q) that reads %d rows and at most %d others",
				c.name, scan, c.index, c.cond, page, c.others)
		}
	}
}

// listScan returns the index scan of the plan of List(f) on j (EXPLAIN
// ANALYZE): it fails t unless the plan is a Limit over one index scan.
func listScan(t *testing.T, j *pgjar.Jar, f idem.Filter) plan {
	t.Helper()
	query, args, none := pgjar.ListQuery(j, f)
	if none {
		t.Fatalf("List(%+v) runs no statement", f)
	}
	var out []byte
	if err := pgjar.PoolOf(j).QueryRow(t.Context(), "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "+query, args...).Scan(&out); err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	var plans []struct{ Plan plan }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("List(%+v): %v: %s", f, err, out)
	}
	top := plans[0].Plan
	if top.NodeType != "Limit" || len(top.Plans) != 1 || top.Plans[0].NodeType != "Index Scan" {
		t.Fatalf("List(%+v): plan %s; want a Limit over one index scan", f, out)
	}
	return top.Plans[0]
}

// TestListAfterAnOpTextCannotHold: a cursor whose Op PostgreSQL's text
// cannot hold, which no record's has, is ErrInvalid; nothing is sent.
func TestListAfterAnOpTextCannotHold(t *testing.T) {
	j := open(t, pgtest.DB(t), nil)
	for _, op := range []string{"a\x00b", "\xff"} {
		_, err := j.List(t.Context(), idem.Filter{After: idem.Cursor{Created: t0, Op: op}})
		if !errors.Is(err, pgjar.ErrInvalid) || strings.Count(err.Error(), "pgjar:") != 1 {
			t.Errorf("List after %q: %v; want ErrInvalid, with one pgjar: prefix", op, err)
		}
	}
}

// TestUndecodableRecordIsLeftAsItWas: Acquire and Update of a record that
// does not decode return an *idem.RecordError and change nothing: neither
// one whose header is not JSON, nor one that changed between the jar's
// read and its write (a trigger damages the header the UPDATE writes, as
// another program could meanwhile). Before, the UPDATE committed and its
// caller got the error of a change the jar had made. A header stored
// with a value that begins with a NUL byte, which hdrjson writes in
// base64, is acquired and updated as any other. ForgetKey of one that is
// pending returns idem.ErrNotForgotten, as of any other, where it returned
// the RecordError of the read that tells why nothing was deleted.
func TestUndecodableRecordIsLeftAsItWas(t *testing.T) {
	dsn := pgtest.DB(t)
	j := open(t, dsn, nil)
	ctx := t.Context()
	for _, op := range []string{"not-json", "raced", "nul"} {
		r := record(op)
		r.Holder, r.LeaseUntil = "h", t0.Add(time.Minute)
		r.Header = http.Header{"X-Nul": {"\x00b"}}
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	conn := pgtest.Connect(t, dsn)
	for _, stmt := range []string{
		`UPDATE idem_operations SET header = 'not json' WHERE op = 'not-json'`,
		`CREATE FUNCTION damage() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN NEW.header := 'not json'; RETURN NEW; END $$`,
		`CREATE TRIGGER damage BEFORE UPDATE ON idem_operations FOR EACH ROW WHEN (OLD.op = 'raced') EXECUTE FUNCTION damage()`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	row := func(op string) (s string) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT o::text FROM idem_operations o WHERE op = $1`, op).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, op := range []string{"not-json", "raced"} {
		before := row(op)
		_, aerr := j.Acquire(ctx, op, "h", t0, time.Hour)
		_, uerr := j.Update(ctx, op, "h", done)
		for _, key := range []string{"key-" + op, "other"} {
			if err := j.ForgetKey(ctx, op, key); !errors.Is(err, idem.ErrNotForgotten) {
				t.Errorf("ForgetKey(%s, %s) of a pending record that does not decode: %v; want ErrNotForgotten", op, key, err)
			}
		}
		for call, err := range map[string]error{"Acquire": aerr, "Update": uerr} {
			if re := (*idem.RecordError)(nil); !errors.As(err, &re) || re.Record.Op != op {
				t.Errorf("%s of %s: %v; want an *idem.RecordError", call, op, err)
			}
		}
		if after := row(op); after != before {
			t.Errorf("%s after Acquire and Update:\n\t%s\nwas\n\t%s", op, after, before)
		}
	}
	if rec, err := j.Acquire(ctx, "nul", "h", t0, time.Hour); err != nil || !rec.LeaseUntil.Equal(t0.Add(time.Hour)) {
		t.Errorf("Acquire of nul = lease until %v, %v; want %v", rec.LeaseUntil, err, t0.Add(time.Hour))
	}
	if rec, err := j.Update(ctx, "nul", "h", done); err != nil || rec.State != idem.StateDone || rec.Header.Get("X-Nul") != "\x00b" {
		t.Errorf("Update of nul = %s, header %q, %v; want done, its header as it was", rec.State, rec.Header, err)
	}
}
