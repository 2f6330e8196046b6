package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/reconnect"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/idemkit/idem/testserver/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, dsn string, opts *pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(t.Context(), dsn, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Unix(1_700_000_000, 123_456_789)

func TestClaimSaveReplayRoundTrip(t *testing.T) {
	s := open(t, pgtest.DB(t), nil)
	ctx := t.Context()
	e, claimed, err := s.Claim(ctx, "tenant", "k1", "fp1", testserver.Fence{Token: 42}, t0)
	if err != nil || !claimed {
		t.Fatalf("first Claim = %v, %v; want claimed", claimed, err)
	}
	if e.Status != testserver.StatusInFlight || e.Token != 42 || e.Fingerprint != "fp1" || !e.Created.Equal(t0) || e.Response != nil {
		t.Errorf("claimed entry = %+v", e)
	}
	resp := testserver.Response{
		Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:   []byte(`{"id":"ch_1"}` + "\x00\xff"),
	}
	if err := s.Save(ctx, "tenant", "k1", testserver.Fence{Token: 42}, resp); err != nil {
		t.Fatalf("Save: %v", err)
	}
	e, claimed, err = s.Claim(ctx, "tenant", "k1", "fp2", testserver.Fence{Token: 43}, t0.Add(time.Hour))
	if err != nil || claimed {
		t.Fatalf("second Claim = %v, %v; want the existing entry", claimed, err)
	}
	if e.Status != testserver.StatusDone || e.Token != 42 || e.Fingerprint != "fp1" || !e.Created.Equal(t0) {
		t.Errorf("existing entry = %+v", e)
	}
	if e.Response == nil {
		t.Fatal("existing entry has no response")
	}
	if e.Response.Status != 201 || string(e.Response.Body) != string(resp.Body) ||
		!slices.Equal(e.Response.Header["X-Multi"], []string{"a", "b"}) ||
		e.Response.Header.Get("Content-Type") != "application/json" {
		t.Errorf("replayed response = %+v; want %+v", *e.Response, resp)
	}

	// Another scope never meets this key.
	if _, claimed, err := s.Claim(ctx, "other", "k1", "fp9", testserver.Fence{Token: 7}, t0); err != nil || !claimed {
		t.Errorf("Claim in another scope = %v, %v; want claimed", claimed, err)
	}
}

// TestClaimRace runs many claims of one key at once, through two stores on
// the same database (as two server instances): exactly one wins, and the
// others see the winner's entry.
func TestClaimRace(t *testing.T) {
	dsn := pgtest.DB(t)
	stores := []*pgstore.Store{open(t, dsn, nil), open(t, dsn, nil)}
	const n = 32
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int64
		seen    = map[int64]int{}
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			e, claimed, err := stores[i%2].Claim(t.Context(), "s", "race", "fp", testserver.Fence{Token: int64(i + 1)}, t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Claim %d: %v", i, err)
				return
			}
			if claimed {
				winners = append(winners, int64(i+1))
			}
			seen[e.Token]++
		})
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d claims won (%v); want exactly 1", len(winners), winners)
	}
	if len(seen) != 1 || seen[winners[0]] != n {
		t.Errorf("tokens seen = %v; want all %d callers to see the winner's token %d", seen, n, winners[0])
	}
}

func TestTakeOverRace(t *testing.T) {
	dsn := pgtest.DB(t)
	stores := []*pgstore.Store{open(t, dsn, nil), open(t, dsn, nil)}
	if _, _, err := stores[0].Claim(t.Context(), "s", "k", "fp", testserver.Fence{Token: 100}, t0); err != nil {
		t.Fatal(err)
	}
	const n = 16
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []testserver.Fence
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			next := testserver.Fence{Token: int64(200 + i), ClaimID: fmt.Sprint("taker-", i)}
			ok, err := stores[i%2].TakeOver(t.Context(), "s", "k", testserver.Fence{Token: 100}, next)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("TakeOver: %v", err)
			}
			if ok {
				wins = append(wins, next)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d takeovers won; want exactly 1", len(wins))
	}
	// The old holder is fenced out; the new one saves.
	if err := stores[0].Save(t.Context(), "s", "k", testserver.Fence{Token: 100}, testserver.Response{Status: 200}); !errors.Is(err, testserver.ErrFenced) {
		t.Errorf("Save with the old token = %v; want ErrFenced", err)
	}
	if ok, err := stores[0].Release(t.Context(), "s", "k", testserver.Fence{Token: 100}); ok || err != nil {
		t.Errorf("Release with the old token = %v, %v; want false, nil", ok, err)
	}
	if err := stores[1].Save(t.Context(), "s", "k", wins[0], testserver.Response{Status: 200}); err != nil {
		t.Errorf("Save with the new token: %v", err)
	}
	// A done entry cannot be taken over, saved again or released.
	if ok, err := stores[0].TakeOver(t.Context(), "s", "k", wins[0], testserver.Fence{Token: wins[0].Token + 1}); ok || err != nil {
		t.Errorf("TakeOver of a done entry = %v, %v; want false, nil", ok, err)
	}
	if err := stores[0].Save(t.Context(), "s", "k", wins[0], testserver.Response{Status: 500}); !errors.Is(err, testserver.ErrFenced) {
		t.Errorf("second Save = %v; want ErrFenced", err)
	}
	if ok, err := stores[0].Release(t.Context(), "s", "k", wins[0]); ok || err != nil {
		t.Errorf("Release of a done entry = %v, %v; want false, nil", ok, err)
	}
}

func TestReleaseLetsTheKeyBeClaimedAgain(t *testing.T) {
	s := open(t, pgtest.DB(t), nil)
	ctx := t.Context()
	if _, _, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 1}, t0); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Release(ctx, "s", "k", testserver.Fence{Token: 2}); ok || err != nil {
		t.Fatalf("Release with a wrong token = %v, %v; want false, nil", ok, err)
	}
	if ok, err := s.Release(ctx, "s", "k", testserver.Fence{Token: 1}); !ok || err != nil {
		t.Fatalf("Release = %v, %v; want true, nil", ok, err)
	}
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 3}, t0); !claimed || err != nil {
		t.Errorf("Claim after Release = %v, %v; want claimed", claimed, err)
	}
}

// TestWritesSeeRowsCommittedWhileTheyWait makes Claim's insert wait for
// another transaction's uncommitted insert of the same key, then commits
// it: the row is newer than the claim's snapshot, and Claim must still
// return it, unclaimed. It then makes Save wait for an uncommitted
// takeover of that claim: the late save must be fenced. Both hold when the
// database's default isolation is stricter than READ COMMITTED, a setting
// some databases have, where they would fail with a serialization error
// instead (which the Middleware would take for a store failure, and answer
// the stale worker's caller with its handler's answer).
func TestWritesSeeRowsCommittedWhileTheyWait(t *testing.T) {
	for _, level := range []string{"", "repeatable read", "serializable"} {
		t.Run("default "+level, func(t *testing.T) {
			dsn := pgtest.DB(t)
			if level != "" {
				setDatabaseDefault(t, dsn, "default_transaction_isolation", level)
			}
			s := open(t, dsn, nil)
			ctx := t.Context()
			// concurrently runs f while stmt, uncommitted, holds the row
			// f needs, then commits it: f's error.
			concurrently := func(stmt string, f func() error) error {
				tx, err := s.Pool().Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(context.Background())
				if _, err := tx.Exec(ctx, stmt); err != nil {
					t.Fatal(err)
				}
				errc := make(chan error, 1)
				go func() { errc <- f() }()
				waitBlocked(t, s.Pool(), 1)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				return <-errc
			}

			err := concurrently(`INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created)
				VALUES ('s', 'k', 'theirs', 'in_flight', 7, 0)`, func() error {
				e, claimed, err := s.Claim(ctx, "s", "k", "mine", testserver.Fence{Token: 8}, t0)
				if err == nil && (claimed || e.Fingerprint != "theirs" || e.Token != 7) {
					err = fmt.Errorf("claimed %v, entry %+v; want the committed one, unclaimed", claimed, e)
				}
				return err
			})
			if err != nil {
				t.Errorf("Claim of a key inserted while it waited: %v", err)
			}
			err = concurrently(`UPDATE idempotency_keys SET locked_at = 9 WHERE scope = 's' AND key = 'k'`, func() error {
				return s.Save(ctx, "s", "k", testserver.Fence{Token: 7}, testserver.Response{Status: 200})
			})
			if !errors.Is(err, testserver.ErrFenced) {
				t.Errorf("Save of a claim taken over while it waited = %v; want ErrFenced", err)
			}
		})
	}
}

// setDatabaseDefault sets a default of dsn's database for the sessions
// that connect after it.
func setDatabaseDefault(t *testing.T, dsn, setting, value string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s SET %s = '%s'",
		pgx.Identifier{conn.Config().Database}.Sanitize(), setting, value)); err != nil {
		t.Fatal(err)
	}
}

type queryRower interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// waitBlocked waits until n backends of the database wait for a lock.
func waitBlocked(t *testing.T, db queryRower, n int) {
	t.Helper()
	waitLockWaiters(t, db, func(waiting int) bool { return waiting >= n }, fmt.Sprintf("%d backends waiting for a lock", n))
}

// waitNotBlocked waits until no backend of the database waits for a lock.
func waitNotBlocked(t *testing.T, db queryRower) {
	t.Helper()
	waitLockWaiters(t, db, func(waiting int) bool { return waiting == 0 }, "no backend waiting for a lock")
}

// waitLockWaiters polls pg_stat_activity, a bounded number of times, until
// done says the count of the database's backends waiting for a lock is
// what the test waits for, what. db must not be in a transaction, in which
// pg_stat_activity is read once.
func waitLockWaiters(t *testing.T, db queryRower, done func(waiting int) bool, what string) {
	t.Helper()
	for range 100_000 {
		var waiting int
		err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if done(waiting) {
			return
		}
	}
	t.Fatalf("never saw %s", what)
}

func TestQueryTimeoutFailsClosed(t *testing.T) {
	dsn := pgtest.DB(t)
	s := open(t, dsn, &pgstore.Options{QueryTimeout: 300 * time.Millisecond})
	ctx := t.Context()
	if _, _, err := s.Claim(ctx, "s", "locked", "fp", testserver.Fence{Token: 7}, t0); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	// An uncommitted insert of "pending", and a lock on "locked".
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created)
		VALUES ('s', 'pending', 'fp', 'in_flight', 7, 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM idempotency_keys WHERE key = 'locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// The server cancels each statement at the timeout, before the store
	// gives up waiting: the error is the server's, and nothing is applied
	// later when the locks go.
	e, claimed, err := s.Claim(ctx, "s", "pending", "fp", testserver.Fence{Token: 8}, t0)
	if err == nil || claimed {
		t.Fatalf("Claim blocked past its timeout = %+v, %v, %v; want an error, unclaimed", e, claimed, err)
	}
	checkCancelled(t, "Claim", err)
	ok, err := s.TakeOver(ctx, "s", "locked", testserver.Fence{Token: 7}, testserver.Fence{Token: 9})
	if ok {
		t.Error("TakeOver blocked past its timeout reported success")
	}
	checkCancelled(t, "TakeOver", err)
	checkCancelled(t, "Save", s.Save(ctx, "s", "locked", testserver.Fence{Token: 7}, testserver.Response{Status: 200}))
	ok, err = s.Release(ctx, "s", "locked", testserver.Fence{Token: 7})
	if ok {
		t.Error("Release blocked past its timeout reported success")
	}
	checkCancelled(t, "Release", err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if e, claimed, err := s.Claim(ctx, "s", "locked", "fp", testserver.Fence{Token: 10}, t0); err != nil || claimed ||
		e.Status != testserver.StatusInFlight || e.Token != 7 {
		t.Errorf("after timed-out writes: %+v, claimed %v, %v; want the entry unchanged", e, claimed, err)
	}
	if _, claimed, err := s.Claim(ctx, "s", "pending", "fp", testserver.Fence{Token: 11}, t0); err != nil || !claimed {
		t.Errorf("the rolled-back key: claimed %v, %v; want it free", claimed, err)
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

// TestPoolWaitLeavesTheServerFirst has a Claim wait for the pool's only
// connection for most of its own deadline, and then for a lock: the
// server's statement_timeout must still be the first to give up, so that
// the claim the store reported as failed is not made later, once the lock
// is free (it would stay in flight, refusing every retry with 409, until
// the lock timeout).
func TestPoolWaitLeavesTheServerFirst(t *testing.T) {
	dsn := pgtest.DB(t)
	s := open(t, dsn+"&pool_max_conns=1", &pgstore.Options{QueryTimeout: time.Second})
	ctx := t.Context()
	var err error
	conns := make([]*pgx.Conn, 2) // one holds the locks, one watches
	for i := range conns {
		if conns[i], err = pgx.Connect(ctx, dsn); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close(context.Background())
	}
	if _, _, err := s.Claim(ctx, "s", "busy", "fp", testserver.Fence{Token: 7}, t0); err != nil {
		t.Fatal(err)
	}
	// An uncommitted insert of "k", and a lock on "busy".
	tx, err := conns[0].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created)
		VALUES ('s', 'k', 'theirs', 'in_flight', 7, 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM idempotency_keys WHERE key = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The pool's connection waits for the lock on "busy" for 1.5 s (its
	// own statement_timeout), while Claim waits for the connection.
	busy := make(chan error, 1)
	go func() {
		busy <- pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 1500`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT FROM idempotency_keys WHERE key = 'busy' FOR UPDATE`)
			return err
		})
	}()
	waitBlocked(t, conns[1], 1)
	_, claimed, err := s.Claim(ctx, "s", "k", "mine", testserver.Fence{Token: 8}, t0)
	if claimed {
		t.Fatal("Claim of a key locked by another transaction reported claimed")
	}
	checkCancelled(t, "Claim", err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	checkCancelled(t, "the statement holding the pool", <-busy)
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 9}, t0); err != nil || !claimed {
		t.Errorf("after the lock was freed: claimed %v, %v; want the key free, not claimed by the failed Claim", claimed, err)
	}
}

// TestServerRestart restarts PostgreSQL (as pg_ctl restart -m fast) under a
// store in use. While it is down, a claim fails at once, and so does the save of a
// claim made before, once its context ends (not with ErrFenced); neither
// changes anything. After it,
// every call succeeds, the first one included: the pool hands no statement
// a connection the server closed (one claim failed per connection it held,
// when it pinged only those idle for a second). The claim made before is
// still in flight with its token, and saves.
func TestServerRestart(t *testing.T) {
	c, dsn := pgtest.Own(t)
	const conns = 4
	s := open(t, fmt.Sprintf("%s&pool_max_conns=%d", dsn, conns), &pgstore.Options{QueryTimeout: time.Hour})
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := range conns { // every connection of the pool used just now
		wg.Go(func() {
			if _, _, err := s.Claim(ctx, "s", fmt.Sprint("before-", i), "fp", testserver.Fence{Token: 1}, t0); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	err := c.Restart(ctx, func() {
		// A claim sent nowhere made nothing: it fails at once, where one
		// tried again would wait for the server until its context ended.
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, claimed, err := s.Claim(cctx, "s", "down", "fp", testserver.Fence{Token: 2, ClaimID: "down"}, t0); err == nil || claimed || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Claim while the server is down = %v, %v; want an error at once", claimed, err)
		}
		// Save tries again until its context ends.
		sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		err := s.Save(sctx, "s", "before-0", testserver.Fence{Token: 1}, testserver.Response{Status: 201})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, testserver.ErrFenced) {
			t.Errorf("Save while the server is down = %v; want its context's error, not ErrFenced", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		if _, claimed, err := s.Claim(ctx, "s", fmt.Sprint("after-", i), "fp", testserver.Fence{Token: 3}, t0); err != nil || !claimed {
			t.Errorf("claim %d after the restart = %v, %v; want claimed", i+1, claimed, err)
		}
	}
	if _, claimed, err := s.Claim(ctx, "s", "down", "fp", testserver.Fence{Token: 4}, t0); err != nil || !claimed {
		t.Errorf("Claim of the key claimed while down = %v, %v; want it free", claimed, err)
	}
	if e, claimed, err := s.Claim(ctx, "s", "before-0", "fp", testserver.Fence{Token: 5}, t0); err != nil || claimed ||
		e.Status != testserver.StatusInFlight || e.Token != 1 {
		t.Errorf("the claim made before = %+v, claimed %v, %v; want it in flight with token 1", e, claimed, err)
	}
	if err := s.Save(ctx, "s", "before-0", testserver.Fence{Token: 1}, testserver.Response{Status: 201}); err != nil {
		t.Errorf("Save after the restart: %v", err)
	}
}

// TestSaveAcrossRestart restarts PostgreSQL while a handler runs, and lets
// it start again once the Middleware's save of the answer found it down.
// The save is run again once the server is back: the caller gets the
// handler's answer, and its retry the replay, the handler having run once.
// Before, the save failed, the claim stayed in flight until LockTimeout,
// and the retry after it ran the handler again.
func TestSaveAcrossRestart(t *testing.T) {
	c, dsn := pgtest.Own(t)
	relay, dsn := pgtest.NewRelay(t, dsn)
	s := open(t, dsn, nil)
	ctx := t.Context()
	var runs, now atomic.Int64
	now.Store(t0.UnixNano())
	mw := &testserver.Middleware{Store: s, LockTimeout: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }}
	restarted := make(chan error, 1)
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			// The claim is made: the server goes down, and starts again
			// once a connection found it down.
			down := make(chan struct{})
			go func() {
				restarted <- c.Restart(ctx, func() {
					close(down)
					<-relay.Refused()
				})
			}()
			<-down
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", runs.Load())
	})))
	defer srv.Close()
	if a := post(t, srv, "k", "", `{"amount":1}`); a.status != http.StatusCreated || a.body != "charge 1" {
		t.Errorf("first request = %d %q; want 201 charge 1", a.status, a.body)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	now.Add(int64(2 * time.Minute)) // the retry comes after LockTimeout
	if a := post(t, srv, "k", "", `{"amount":1}`); a.status != http.StatusCreated || a.body != "charge 1" || a.replayed != "true" {
		t.Errorf("retry = %d %q, replayed %q; want the replay of 201 charge 1", a.status, a.body, a.replayed)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times; want 1", n)
	}
}

// answer is what post got back.
type answer struct {
	status         int
	body, replayed string // replayed: the Idempotent-Replayed header
}

// post sends a POST of body to srv with the Idempotency-Key key and, unless
// account is "", the header Account, and returns the answer.
func post(t *testing.T, srv *httptest.Server, key, account, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	if account != "" {
		req.Header.Set("Account", account)
	}
	resp, err := srv.Client().Do(req)
	var b []byte
	if err == nil {
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed")}
}

// TestWritesAcrossRestart restarts PostgreSQL between a claim and the
// write that follows it, on a pool that holds a connection: TakeOver and
// Release, like Save, find the server down, and run again once it is
// back. Before, they failed, and the claim stayed in flight until
// LockTimeout.
func TestWritesAcrossRestart(t *testing.T) {
	c, dsn := pgtest.Own(t)
	relay, dsn := pgtest.NewRelay(t, dsn)
	s := open(t, dsn, nil)
	ctx := t.Context()
	for _, k := range []string{"taken", "released"} {
		if _, claimed, err := s.Claim(ctx, "s", k, "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
			t.Fatalf("Claim %s = %v, %v", k, claimed, err)
		}
	}
	var won, released bool
	err := pgtest.CallDuringRestart(t, c, relay, func() (err error) {
		won, err = s.TakeOver(ctx, "s", "taken", testserver.Fence{Token: 1}, testserver.Fence{Token: 2})
		return err
	})
	if err != nil || !won {
		t.Errorf("TakeOver across a restart = %v, %v; want won", won, err)
	}
	err = pgtest.CallDuringRestart(t, c, relay, func() (err error) {
		released, err = s.Release(ctx, "s", "released", testserver.Fence{Token: 1})
		return err
	})
	if err != nil || !released {
		t.Errorf("Release across a restart = %v, %v; want released", released, err)
	}
	if e, claimed, err := s.Claim(ctx, "s", "taken", "fp", testserver.Fence{Token: 3}, t0); err != nil || claimed || e.Token != 2 {
		t.Errorf("the entry taken over = %+v, claimed %v, %v; want it in flight with token 2", e, claimed, err)
	}
	if _, claimed, err := s.Claim(ctx, "s", "released", "fp", testserver.Fence{Token: 3}, t0); err != nil || !claimed {
		t.Errorf("Claim of the key released = %v, %v; want it free", claimed, err)
	}
}

// answerLost opens a store behind a relay, claims key "k" of scope "s"
// with token 1, and calls call with the relay set to lose the answer to
// the next statement whose command tag begins with tag. It fails t when
// no answer was lost, and returns the store.
func answerLost(t *testing.T, tag string, call func(*pgstore.Store)) *pgstore.Store {
	t.Helper()
	return answerLostAfter(t, tag, func(*pgstore.Store) {}, call)
}

// answerLostAfter is answerLost with before run on the store after the
// claim, before the relay is made to lose an answer.
func answerLostAfter(t *testing.T, tag string, before, call func(*pgstore.Store)) *pgstore.Store {
	t.Helper()
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	s := open(t, dsn, nil)
	if _, claimed, err := s.Claim(t.Context(), "s", "k", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	before(s)
	lost := relay.LoseNext(tag)
	call(s)
	select {
	case <-lost:
	default:
		t.Fatal("the relay lost no answer")
	}
	return s
}

// TestReleaseAnswerLost loses the answer to a Release that the server
// applied: Release runs its statement again, finds the entry gone, and
// reports it released, not taken over. Before, it returned the lost
// connection's error.
func TestReleaseAnswerLost(t *testing.T) {
	ctx := t.Context()
	s := answerLost(t, "DELETE", func(s *pgstore.Store) {
		if released, err := s.Release(ctx, "s", "k", testserver.Fence{Token: 1}); err != nil || !released {
			t.Errorf("Release whose answer was lost = %v, %v; want released", released, err)
		}
	})
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 2}, t0); err != nil || !claimed {
		t.Errorf("Claim after the release = %v, %v; want the key free", claimed, err)
	}
}

// TestClaimAnswerLost loses the answer to a Claim that the server
// applied. Run again, the claim finds the entry in flight under its own
// fence, token and ClaimID, and reports it claimed. Before, Claim was not
// run again: it returned the lost connection's error, and the Middleware
// answered 503 to a request whose claim was made. A claim of a key that
// holds another's entry, under the same token but another ClaimID, or
// none, is not a win: the entry is another's, or, with the caller's own
// fence but no ClaimID to prove it, unknown, and Claim fails closed.
func TestClaimAnswerLost(t *testing.T) {
	ctx := t.Context()
	mine := testserver.Fence{Token: 2, ClaimID: "mine"}
	s := answerLost(t, "SELECT", func(s *pgstore.Store) {
		if e, claimed, err := s.Claim(ctx, "s", "c", "fp", mine, t0); err != nil || !claimed || e.Fence != mine {
			t.Errorf("Claim whose answer was lost = %+v, claimed %v, %v; want claimed with fence %+v", e, claimed, err, mine)
		}
	})
	if e, claimed, err := s.Claim(ctx, "s", "c", "fp", testserver.Fence{Token: 3, ClaimID: "next"}, t0); err != nil || claimed || e.Fence != mine {
		t.Errorf("entry = %+v, claimed %v, %v; want it in flight with fence %+v", e, claimed, err, mine)
	}
	// "k" is in flight under token 1 and no ClaimID (see answerLost).
	answerLost(t, "SELECT", func(s *pgstore.Store) {
		if e, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 1, ClaimID: "other"}, t0); err != nil || claimed || e.Token != 1 || e.ClaimID != "" {
			t.Errorf("Claim of another's entry whose answer was lost = %+v, claimed %v, %v; want that entry, not claimed", e, claimed, err)
		}
	})
	answerLost(t, "SELECT", func(s *pgstore.Store) {
		if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 1}, t0); err == nil || claimed {
			t.Errorf("Claim with no ClaimID whose answer was lost = %v, %v; want an error", claimed, err)
		}
	})
}

// TestTakeOverAnswerLost loses the answer to a TakeOver that the server
// applied. Run again, it finds the entry in flight under its new fence,
// token and ClaimID, and reports it won. Before, it could not tell that
// from another caller's win and returned an error, and the Middleware
// answered 503 to a request that held the claim. A new fence with no
// ClaimID proves nothing, whatever the token: such a take-over still
// fails closed with an error, not a win (which could run the handler
// twice) nor a loss (which would leave its own claim unused), and the
// entry stays in flight under the new token.
func TestTakeOverAnswerLost(t *testing.T) {
	ctx := t.Context()
	mine := testserver.Fence{Token: 2, ClaimID: "mine"}
	s := answerLost(t, "UPDATE", func(s *pgstore.Store) {
		if won, err := s.TakeOver(ctx, "s", "k", testserver.Fence{Token: 1}, mine); err != nil || !won {
			t.Errorf("TakeOver whose answer was lost = %v, %v; want won", won, err)
		}
	})
	if e, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 3}, t0); err != nil || claimed || e.Fence != mine {
		t.Errorf("entry = %+v, claimed %v, %v; want it in flight with fence %+v", e, claimed, err, mine)
	}
	s = answerLost(t, "UPDATE", func(s *pgstore.Store) {
		if won, err := s.TakeOver(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Fence{Token: 2}); err == nil || won {
			t.Errorf("TakeOver to no ClaimID whose answer was lost = %v, %v; want an error", won, err)
		}
	})
	if e, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 3}, t0); err != nil || claimed || e.Token != 2 {
		t.Errorf("entry = %+v, claimed %v, %v; want it in flight with token 2", e, claimed, err)
	}
}

// TestTakeOverAnswerLostToAnother loses the answer to a TakeOver of an
// entry that another caller took over, saved or released first. Run again,
// it finds the entry under a third fence, done or gone, with nothing under
// its own new fence: it reports the take-over not won, as it does without
// a lost answer, and the Middleware answers as for another's claim (409,
// or the saved answer, or a claim of the key afresh). Before, it returned
// an error, and the Middleware answered 503.
func TestTakeOverAnswerLostToAnother(t *testing.T) {
	ctx := t.Context()
	other := testserver.Fence{Token: 3, ClaimID: "other"}
	for _, c := range []struct {
		name   string
		before func(*pgstore.Store) error
		after  func(testserver.Entry, bool) bool // the entry Claim then finds, and whether it claimed it
	}{
		{"taken over", func(s *pgstore.Store) error {
			_, err := s.TakeOver(ctx, "s", "k", testserver.Fence{Token: 1}, other)
			return err
		}, func(e testserver.Entry, claimed bool) bool { return !claimed && e.Fence == other }},
		{"saved", func(s *pgstore.Store) error {
			return s.Save(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Response{Status: http.StatusCreated})
		}, func(e testserver.Entry, claimed bool) bool { return !claimed && e.Status == testserver.StatusDone }},
		{"released", func(s *pgstore.Store) error {
			_, err := s.Release(ctx, "s", "k", testserver.Fence{Token: 1})
			return err
		}, func(_ testserver.Entry, claimed bool) bool { return claimed }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := answerLostAfter(t, "UPDATE", func(s *pgstore.Store) {
				if err := c.before(s); err != nil {
					t.Fatal(err)
				}
			}, func(s *pgstore.Store) {
				if won, err := s.TakeOver(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Fence{Token: 2, ClaimID: "mine"}); err != nil || won {
					t.Errorf("TakeOver whose answer was lost, of an entry %s by another = %v, %v; want not won, no error", c.name, won, err)
				}
			})
			if e, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 4, ClaimID: "next"}, t0); err != nil || !c.after(e, claimed) {
				t.Errorf("then Claim = %+v, claimed %v, %v; want the entry as the other left it", e, claimed, err)
			}
		})
	}
}

// TestMiddlewareAnswerLost loses the answer to the Middleware's claim of a
// key, and to its take-over of a stale claim: the request gets the
// handler's answer, the handler having run once (and known the take-over
// for one), and its retry the replay. Before, it got 503, and its retry
// 409 until the lock timeout.
func TestMiddlewareAnswerLost(t *testing.T) {
	for _, tc := range []struct {
		name, tag string
		stale     bool // a stale claim of the key is there to take over
	}{
		{"claim", "SELECT", false},
		{"take-over", "UPDATE", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
			s := open(t, dsn, nil)
			const body = `{"amount":1}`
			var runs, takenOver atomic.Int64
			mw := &testserver.Middleware{Store: s, LockTimeout: time.Minute, Now: func() time.Time { return t0.Add(2 * time.Minute) }}
			srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c, _ := testserver.ClaimFrom(r.Context()); c.TakenOver {
					takenOver.Add(1)
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "charge %d", runs.Add(1))
			})))
			defer srv.Close()
			if tc.stale {
				fp := testserver.Fingerprint(httptest.NewRequest(http.MethodPost, "/", nil), "", []byte(body)) // post's
				if _, claimed, err := s.Claim(t.Context(), "", "k", fp, testserver.Fence{Token: t0.UnixNano(), ClaimID: "stale"}, t0); err != nil || !claimed {
					t.Fatalf("stale Claim = %v, %v", claimed, err)
				}
			}
			lost := relay.LoseNext(tc.tag)
			if a := post(t, srv, "k", "", body); a.status != http.StatusCreated || a.body != "charge 1" {
				t.Errorf("request whose %s's answer was lost = %d %q; want 201 charge 1", tc.name, a.status, a.body)
			}
			select {
			case <-lost:
			default:
				t.Fatal("the relay lost no answer")
			}
			if a := post(t, srv, "k", "", body); a.status != http.StatusCreated || a.body != "charge 1" || a.replayed != "true" {
				t.Errorf("retry = %d %q, replayed %q; want the replay of 201 charge 1", a.status, a.body, a.replayed)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times; want 1", n)
			}
			if n, want := takenOver.Load(), map[bool]int64{true: 1}[tc.stale]; n != want {
				t.Errorf("the handler ran %d times taking over; want %d", n, want)
			}
		})
	}
}

// TestSaveAnswerLost loses the answer to a Save that the server applied:
// Save runs its statement again, which finds the entry done with its own
// token and answer, and returns nil, not ErrFenced. The entry keeps that
// answer, and still refuses another one under the same token.
func TestSaveAnswerLost(t *testing.T) {
	ctx := t.Context()
	s := answerLost(t, "UPDATE", func(s *pgstore.Store) {
		if err := s.Save(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Response{Status: 201, Body: []byte("charged")}); err != nil {
			t.Errorf("Save whose answer was lost = %v; want nil", err)
		}
	})
	e, _, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 2}, t0)
	if err != nil || e.Status != testserver.StatusDone || e.Response == nil || string(e.Response.Body) != "charged" {
		t.Errorf("entry = %+v, %v; want done with the answer saved", e, err)
	}
	if err := s.Save(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Response{Status: 500}); !errors.Is(err, testserver.ErrFenced) {
		t.Errorf("Save of another answer under the same token = %v; want ErrFenced", err)
	}
}

// appRole creates a database for t with a current schema, and in it a
// role that may use the store's table but create nothing. It returns a
// connection as the database's owner, the role's name and a DSN that logs
// in as the role.
func appRole(t *testing.T) (owner *pgx.Conn, role, dsn string) {
	t.Helper()
	dsn = pgtest.DB(t)
	open(t, dsn, nil) // creates the schema, as the owner
	owner, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close(context.Background()) })
	role = owner.Config().Database + "_app"
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON idempotency_keys_schema TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO ` + role,
	} {
		if _, err := owner.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return owner, role, u.String()
}

// TestSaveRefusedLoginFailsAtOnce ends the sessions of a store's role
// after its pool warmed, and makes the role unable to log in: the save
// that follows fails at once, with the server's refusal (SQLSTATE 28000),
// after one connection attempt. Before, a refused login counted as a lost
// connection, and Save tried again until twice QueryTimeout had passed.
func TestSaveRefusedLoginFailsAtOnce(t *testing.T) {
	owner, role, dsn := appRole(t)
	cfg, err := pgxpool.ParseConfig(pgtest.SSLModePrefer(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { dials.Add(1); return nil }
	cfg.ShouldPing = reconnect.ShouldPing // as Open's pool
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := pgstore.New(t.Context(), pool, &pgstore.Options{QueryTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := s.Claim(t.Context(), "s", "k", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	if _, err := owner.Exec(t.Context(), `ALTER ROLE `+role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	// Ends the role's sessions, waiting (up to 10 s) for each to exit.
	if _, err := owner.Exec(t.Context(), `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE usename = $1`, role); err != nil {
		t.Fatal(err)
	}
	dials.Store(0)
	err = s.Save(t.Context(), "s", "k", testserver.Fence{Token: 1}, testserver.Response{Status: 201})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28000" ||
		!strings.HasPrefix(err.Error(), "pgstore: save: connection to the database failed") || strings.Contains(err.Error(), "tls") {
		t.Errorf("Save as a role that may no longer log in = %v; want the server's refusal, SQLSTATE 28000, told in one line as Open tells it, without the TLS attempt", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("Save tried %d connections; want 1", n)
	}
}

// TestCallerDeadlineFailsClosed gives up through the caller's context,
// before the server's timeout: the claim fails.
func TestCallerDeadlineFailsClosed(t *testing.T) {
	s := open(t, pgtest.DB(t), nil)
	tx, err := s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created)
		VALUES ('s', 'k', 'fp', 'in_flight', 7, 0)`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 8}, t0); err == nil || claimed || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Claim past the caller's deadline = claimed %v, %v; want an error wrapping context.DeadlineExceeded", claimed, err)
	}
}

func TestClosedPoolFailsClosed(t *testing.T) {
	dsn := pgtest.DB(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(t.Context(), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Close leaves a pool it did not open.
	s.Close()
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("Close closed the caller's pool: %v", err)
	}
	// A store left open, whose pool its caller closes, fails every call.
	if s, err = pgstore.New(t.Context(), pool, nil); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	ctx := t.Context()
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 1}, t0); err == nil || claimed {
		t.Errorf("Claim on a closed pool = %v, %v; want an error", claimed, err)
	}
	if ok, err := s.TakeOver(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Fence{Token: 2}); err == nil || ok {
		t.Errorf("TakeOver on a closed pool = %v, %v; want an error", ok, err)
	}
	if err := s.Save(ctx, "s", "k", testserver.Fence{Token: 1}, testserver.Response{Status: 200}); err == nil || errors.Is(err, testserver.ErrFenced) {
		t.Errorf("Save on a closed pool = %v; want an error other than ErrFenced", err)
	}
	if ok, err := s.Release(ctx, "s", "k", testserver.Fence{Token: 1}); err == nil || ok {
		t.Errorf("Release on a closed pool = %v, %v; want an error", ok, err)
	}
	if _, err := s.Prune(ctx, t0, 10); err == nil {
		t.Error("Prune on a closed pool: no error")
	}
}

// TestClosed checks Close on a store that owns its pool (Open) and on one
// that leaves the caller's open (New).
func TestClosed(t *testing.T) {
	t.Run("Open", func(t *testing.T) {
		storetest.RunClosed(t, func(t *testing.T) storetest.Closer { return open(t, pgtest.DB(t), nil) }, pgstore.ErrClosed)
	})
	t.Run("New", func(t *testing.T) {
		storetest.RunClosed(t, func(t *testing.T) storetest.Closer {
			pool, err := pgxpool.New(t.Context(), pgtest.DB(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := pgstore.New(t.Context(), pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, pgstore.ErrClosed)
	})
}

func TestPruneInBatches(t *testing.T) {
	s := open(t, pgtest.DB(t), &pgstore.Options{PruneBatch: 4})
	ctx := t.Context()
	for i := range 25 {
		if _, _, err := s.Claim(ctx, "s", fmt.Sprintf("old-%d", i), "fp", testserver.Fence{Token: 1}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Save(ctx, "s", fmt.Sprintf("old-%d", i), testserver.Fence{Token: 1}, testserver.Response{Status: 200}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cutoff := t0.Add(time.Hour)
	for i := range 5 {
		if _, _, err := s.Claim(ctx, "s", fmt.Sprintf("new-%d", i), "fp", testserver.Fence{Token: 1}, cutoff.Add(time.Duration(i))); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Prune(ctx, cutoff, 0); n != 0 || err != nil {
		t.Errorf("Prune(limit 0) = %d, %v; want 0", n, err)
	}
	if n, err := s.Prune(ctx, cutoff, 10); n != 10 || err != nil {
		t.Errorf("Prune(limit 10) = %d, %v; want 10", n, err)
	}
	// The oldest went first.
	if _, claimed, err := s.Claim(ctx, "s", "old-9", "fp", testserver.Fence{Token: 2}, t0); !claimed || err != nil {
		t.Errorf("old-9 still there after pruning the 10 oldest (claimed %v, %v)", claimed, err)
	}
	if _, claimed, err := s.Claim(ctx, "s", "old-10", "fp", testserver.Fence{Token: 2}, t0); claimed || err != nil {
		t.Errorf("old-10 pruned among the 10 oldest (claimed %v, %v)", claimed, err)
	}
	// old-10…old-24 and the new old-9 are older than cutoff.
	if n, err := s.Prune(ctx, cutoff, 100); n != 16 || err != nil {
		t.Errorf("Prune(limit 100) = %d, %v; want 16", n, err)
	}
	for i := range 5 {
		if _, claimed, err := s.Claim(ctx, "s", fmt.Sprintf("new-%d", i), "fp", testserver.Fence{Token: 2}, t0); claimed || err != nil {
			t.Errorf("new-%d pruned (claimed %v, %v); want it kept", i, claimed, err)
		}
	}
	if n, err := s.Prune(ctx, time.Time{}, 100); n != 0 || err != nil {
		t.Errorf("Prune(before zero time) = %d, %v; want 0", n, err)
	}
}

// TestPruneLimitWithStaleStatistics: Prune deletes at most its limit when
// the table's statistics are out of date, as they are in a store that grew
// since autovacuum last analysed it. The planner then takes the table for
// one row and runs the subquery that picks the batch again for each row it
// scans, each run locking, and picking, a row the last one did not.
func TestPruneLimitWithStaleStatistics(t *testing.T) {
	dsn := pgtest.DB(t)
	s := open(t, dsn, nil)
	ctx := t.Context()
	done := func(key string) {
		t.Helper()
		if _, _, err := s.Claim(ctx, "s", key, "fp", testserver.Fence{Token: 1}, t0); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(ctx, "s", key, testserver.Fence{Token: 1}, testserver.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	done("k0")
	if _, err := pgtest.Connect(t, dsn).Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		done(fmt.Sprint("k", i))
	}
	if n, err := s.Prune(ctx, t0.Add(time.Hour), 1); n != 1 || err != nil {
		t.Errorf("Prune(limit 1) = %d, %v; want 1", n, err)
	}
	if n, err := s.Prune(ctx, t0.Add(time.Hour), 100); n != 3 || err != nil {
		t.Errorf("Prune(limit 100) after Prune(limit 1) = %d, %v; want the 3 left", n, err)
	}
}

func TestMigrations(t *testing.T) {
	dsn := pgtest.DB(t)
	// Instances starting together migrate once, without error.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			s, err := pgstore.Open(t.Context(), dsn, nil)
			if err != nil {
				t.Errorf("concurrent Open: %v", err)
				return
			}
			s.Close()
		})
	}
	wg.Wait()
	s := open(t, dsn, nil)
	if v := versions(t, s.Pool()); !slices.Equal(v, []int32{1, 2, 3}) {
		t.Errorf("schema versions = %v; want [1 2 3]", v)
	}
	if _, err := s.Pool().Exec(t.Context(), `INSERT INTO idempotency_keys_schema (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	const want = `pgstore: database schema is newer than this program: in schema "public", version 99, this package knows up to 3`
	if _, err := pgstore.Open(t.Context(), dsn, nil); !errors.Is(err, pgstore.ErrSchemaTooNew) || err.Error() != want {
		t.Errorf("Open of a newer schema = %v; want ErrSchemaTooNew: %s", err, want)
	}
}

// TestOpenWaitsForAnotherMigrationDespiteLockTimeout opens a store while
// another instance holds the migration lock, in a database whose
// lock_timeout (set there, or on the role, to keep DDL from queueing
// behind long transactions) is shorter than that migration: Open must wait
// for it, within its own deadline, rather than fail with 55P03
// lock_not_available, which leaves instances that start together but one
// unable to start.
func TestOpenWaitsForAnotherMigrationDespiteLockTimeout(t *testing.T) {
	dsn := pgtest.DB(t)
	setDatabaseDefault(t, dsn, "lock_timeout", "10ms")
	err := pgtest.HoldLock(t, dsn, pgstore.MigrateLock, 50*time.Millisecond, func() error {
		s, err := pgstore.Open(t.Context(), dsn, nil)
		if err == nil {
			s.Close()
		}
		return err
	})
	if err != nil {
		t.Errorf("Open after another instance migrated: %v", err)
	}
}

// TestOpenWithoutCreatePrivilege opens, as a role that may read and write
// the store's tables but not create any (a deployment that migrates under
// another role), a database whose schema is current: Open must not need to
// create anything.
func TestOpenWithoutCreatePrivilege(t *testing.T) {
	_, _, dsn := appRole(t)
	s, err := pgstore.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatalf("Open as a role that cannot create tables: %v", err)
	}
	defer s.Close()
	if _, claimed, err := s.Claim(t.Context(), "s", "k", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Errorf("Claim as that role = %v, %v; want claimed", claimed, err)
	}
}

// TestOpenWithoutCreatePrivilegeNoStore opens, as a role that may not
// create tables, a database that does not hold the store yet: Open
// returns ErrPrivilege, naming the schema and saying to open the store
// once as a role that may, with the server's error (42501) still in it,
// and creates nothing. Before, it was a bare "pgstore: migrate: ERROR:
// permission denied for schema public (SQLSTATE 42501)".
func TestOpenWithoutCreatePrivilegeNoStore(t *testing.T) {
	dsn := pgtest.DB(t)
	_, err := pgstore.Open(t.Context(), pgtest.AppRole(t, dsn), nil)
	pgtest.RefusedCreate(t, dsn, err, pgstore.ErrPrivilege, "public")
}

// TestOpenWithoutAdvisoryLock opens an existing store as a role that may
// use its tables but not execute pg_advisory_xact_lock, which the
// migration takes: Open returns ErrPrivilege naming the function, not a
// bare SQLSTATE 42501.
func TestOpenWithoutAdvisoryLock(t *testing.T) {
	owner, _, dsn := appRole(t)
	pgtest.RefusedLock(t, owner.Config().ConnString(), pgstore.ErrPrivilege, func() error {
		s, err := pgstore.Open(t.Context(), dsn, nil)
		if err == nil {
			s.Close()
		}
		return err
	})
}

// TestMigrationsStartingTogether: instances whose migrations wait for one
// another migrate once, also when the database's default isolation is
// REPEATABLE READ.
func TestMigrationsStartingTogether(t *testing.T) {
	dsn := pgtest.DB(t)
	errs := pgtest.StartTogether(t, dsn, pgstore.MigrateLock, 2, func() error {
		s, err := pgstore.Open(t.Context(), dsn, nil)
		if err == nil {
			s.Close()
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("Open of an instance starting together with another: %v", err)
		}
	}
}

func TestOpenBadDSN(t *testing.T) {
	if _, err := pgstore.Open(t.Context(), "postgres://%zz", nil); err == nil {
		t.Error("Open with a malformed DSN: no error")
	}
}

// TestOpenUnreachable: Open's error for a database that refuses the
// connection, or a server that is down, says the connection failed and
// why, in words of its own rather than "migrate: failed to connect"
// followed by pgx's refused TLS attempt.
func TestOpenUnreachable(t *testing.T) {
	pgtest.RefusedConnect(t, pgtest.DB(t), "pgstore", func(dsn string) (io.Closer, error) {
		return pgstore.Open(t.Context(), dsn, nil)
	})
}

// TestOpenBehindPgBouncer: a PgBouncer that takes none of the startup
// parameters Open sets refuses Open's first session, and Open says what to
// do about it, at once.
func TestOpenBehindPgBouncer(t *testing.T) {
	pgtest.RefusedByPgBouncer(t, "pgstore", func(dsn string) (io.Closer, error) {
		return pgstore.Open(t.Context(), dsn, nil)
	})
}

// TestOpenUnparsedDSNMasksPassword: Open's error for a connection string
// that pgx cannot parse shows none of its password.
func TestOpenUnparsedDSNMasksPassword(t *testing.T) {
	for _, dsn := range pgtest.UnparsedDSNs {
		_, err := pgstore.Open(t.Context(), dsn, nil)
		pgtest.RefusedUnparsed(t, dsn, err)
	}
}

// TestOpenBadOptions: each option pgstore cannot honour is ErrOptions from
// Open and New, naming the field, with "pgstore:" once, and nothing is
// created: New takes no connection of its pool. A negative QueryTimeout or
// PruneBatch was taken for the default, and a QueryTimeout above
// PostgreSQL's longest statement_timeout failed Open's first connection
// with the server's error or, past 146 years, made New's waits of twice it
// overflow into none.
func TestOpenBadOptions(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DB(t)
	_, pool := openers(t, dsn)
	for _, c := range []struct {
		o     pgstore.Options
		field string
	}{
		{pgstore.Options{QueryTimeout: -time.Second}, "QueryTimeout"},
		{pgstore.Options{QueryTimeout: -1}, "QueryTimeout"},
		{pgstore.Options{QueryTimeout: pgstore.MaxQueryTimeout + time.Millisecond}, "QueryTimeout"},
		{pgstore.Options{QueryTimeout: math.MaxInt64}, "QueryTimeout"},
		{pgstore.Options{PruneBatch: -1}, "PruneBatch"},
		{pgstore.Options{QueryTimeout: time.Second, PruneBatch: math.MinInt}, "PruneBatch"},
	} {
		for name, open := range map[string]func() (*pgstore.Store, error){
			"Open": func() (*pgstore.Store, error) { return pgstore.Open(ctx, dsn, &c.o) },
			"New":  func() (*pgstore.Store, error) { return pgstore.New(ctx, pool, &c.o) },
		} {
			acquired := pool.Stat().AcquireCount()
			s, err := open()
			if err == nil {
				s.Close()
			}
			pgtest.RefusedOptions(t, fmt.Sprintf("%s with %+v", name, c.o), err, pgstore.ErrOptions, c.field, "pgstore")
			if n := pool.Stat().AcquireCount() - acquired; name == "New" && n != 0 {
				t.Errorf("New with %+v took %d connections of its pool; want none", c.o, n)
			}
		}
	}
	if tables := pgtest.Tables(t, dsn); tables != "" {
		t.Errorf("tables after the refused opens: %s; want none", tables)
	}
	s := open(t, dsn, &pgstore.Options{QueryTimeout: pgstore.MaxQueryTimeout})
	if _, claimed, err := s.Claim(ctx, "s", "k", "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
		t.Fatalf("Claim on a store with the longest QueryTimeout = %v, %v; want claimed", claimed, err)
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) testserver.Store { return open(t, pgtest.DB(t), nil) })
}

// TestSessionSettings checks the settings Open gives the store's
// connections: statement_timeout from QueryTimeout, and synchronous_commit
// on, so that a claim is on stable storage before Claim reports it, also in
// a database whose default is off (a crash would otherwise lose a claim
// whose handler ran, and a retry would run it again). An explicit choice
// in the DSN is the operator's.
func TestSessionSettings(t *testing.T) {
	dsn := pgtest.DB(t)
	setDatabaseDefault(t, dsn, "synchronous_commit", "off")
	show := func(s *pgstore.Store, setting string) string {
		var v string
		if err := s.Pool().QueryRow(t.Context(), "SHOW "+setting).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	s := open(t, dsn, &pgstore.Options{QueryTimeout: 1500 * time.Millisecond})
	if got := show(s, "statement_timeout"); got != "1500ms" {
		t.Errorf("statement_timeout = %q; want 1500ms, the QueryTimeout", got)
	}
	if got := show(s, "synchronous_commit"); got != "on" {
		t.Errorf("synchronous_commit = %q; want on", got)
	}
	if got := show(open(t, dsn, nil), "statement_timeout"); got != "5s" {
		t.Errorf("statement_timeout by default = %q; want 5s", got)
	}
	s = open(t, dsn+"&statement_timeout=0&synchronous_commit=remote_write", nil)
	if got := show(s, "statement_timeout"); got != "0" {
		t.Errorf("statement_timeout with the DSN's choice = %q; want 0", got)
	}
	if got := show(s, "synchronous_commit"); got != "remote_write" {
		t.Errorf("synchronous_commit with the DSN's choice = %q; want remote_write", got)
	}
}

// openers returns, by name, an Open of dsn and a New on a pool of it, and
// that pool, closed when the test ends.
func openers(t *testing.T, dsn string) (map[string]func() (*pgstore.Store, error), *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return map[string]func() (*pgstore.Store, error){
		"Open": func() (*pgstore.Store, error) { return pgstore.Open(t.Context(), dsn, nil) },
		"New":  func() (*pgstore.Store, error) { return pgstore.New(t.Context(), pool, nil) },
	}, pool
}

// TestOpenIncompleteSchema: a database that records the current schema
// version but lost the store's table, or one of its indexes, is refused by
// Open and New with ErrSchema naming what is missing and the schema it
// looked in, and nothing is re-created. Before, both opened it, and every
// claim then failed with "relation does not exist".
func TestOpenIncompleteSchema(t *testing.T) {
	for _, c := range []struct{ drop, missing string }{
		{`DROP TABLE idempotency_keys`, "no idempotency_keys, idempotency_keys_pkey, idempotency_keys_created"},
		{`DROP INDEX idempotency_keys_created`, "no idempotency_keys_created (only an index is missing, no row is lost: create it again, as the owner: " +
			`CREATE INDEX idempotency_keys_created ON "public".idempotency_keys (created))`},
		{`ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey`, "no idempotency_keys_pkey"},
	} {
		dsn := pgtest.DB(t)
		s := open(t, dsn, nil)
		if _, err := s.Pool().Exec(t.Context(), c.drop); err != nil {
			t.Fatal(err)
		}
		s.Close()
		opens, pool := openers(t, dsn)
		for what, opened := range opens {
			s, err := opened()
			if err == nil {
				s.Close()
			}
			want := `pgstore: database lacks part of the store's schema: in schema "public", ` + c.missing
			if !errors.Is(err, pgstore.ErrSchema) || err.Error() != want {
				t.Errorf("after %s: %s = %v; want ErrSchema: %s", c.drop, what, err, want)
			}
		}
		var missing string
		if err := pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(name, ', ' ORDER BY n), '')
			FROM unnest('{idempotency_keys,idempotency_keys_pkey,idempotency_keys_created}'::text[]) WITH ORDINALITY AS o(name, n)
			WHERE to_regclass(name) IS NULL`).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		if want, _, _ := strings.Cut(strings.TrimPrefix(c.missing, "no "), " ("); missing != want {
			t.Errorf("after %s and the opens: missing %q; want %q, nothing re-created", c.drop, missing, want)
		}
	}
}

// TestNewPoolSettings: New refuses, creating nothing, a pool whose
// connections do not run READ COMMITTED by default (concurrent claims
// would fail with serialization errors) or that would commit claims with
// synchronous_commit off without the pool's config choosing it (a crash
// could lose a claim whose handler ran); it takes one whose config sets
// either. Before, New took every pool.
func TestNewPoolSettings(t *testing.T) {
	if _, err := pgstore.New(t.Context(), nil, nil); !errors.Is(err, pgstore.ErrPool) {
		t.Errorf("New(nil pool) = %v; want ErrPool", err)
	}
	dsn := pgtest.DB(t)
	setDatabaseDefault(t, dsn, "synchronous_commit", "off")
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, c := range []struct {
		params string // added to the DSN
		ok     bool
	}{
		{"", false},
		{"&default_transaction_isolation=serializable&synchronous_commit=on", false},
		{"&default_transaction_isolation=repeatable%20read&synchronous_commit=on", false},
		{"&synchronous_commit=on", true},
		{"&synchronous_commit=off", true},
	} {
		pool, err := pgxpool.New(t.Context(), dsn+c.params)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := pgstore.New(t.Context(), pool, nil)
		if err == nil {
			if _, claimed, err := s.Claim(t.Context(), "s", "k"+c.params, "fp", testserver.Fence{Token: 1}, t0); err != nil || !claimed {
				t.Errorf("Claim on a pool with %q = %v, %v; want claimed", c.params, claimed, err)
			}
			s.Close()
		}
		if c.ok != (err == nil) || !c.ok && !errors.Is(err, pgstore.ErrPool) {
			t.Errorf("New on a pool with %q = %v; want ok %v, or ErrPool", c.params, err, c.ok)
		}
		var table bool
		if err := conn.QueryRow(t.Context(), `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&table); err != nil {
			t.Fatal(err)
		}
		if table != c.ok {
			t.Fatalf("after New on a pool with %q: the store's table exists: %v; want %v", c.params, table, c.ok)
		}
	}
}

// TestOpenUnrecordedSchema: a database whose table of versions was dropped
// or emptied while the store's table kept its claims is refused by Open and
// New with ErrSchema naming what it found and the schema, and left as it
// was. Before, both ran migration 1 on it and failed with PostgreSQL's own
// "relation already exists".
func TestOpenUnrecordedSchema(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		{`DROP TABLE idempotency_keys_schema`, "no idempotency_keys_schema"},
		{`TRUNCATE idempotency_keys_schema`, "idempotency_keys_schema records no version"},
	} {
		dsn := pgtest.DB(t)
		s := open(t, dsn, nil)
		if _, _, err := s.Claim(t.Context(), "tenant", "k1", "fp1", testserver.Fence{Token: 42}, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Pool().Exec(t.Context(), c.sql); err != nil {
			t.Fatal(err)
		}
		s.Close()
		opens, pool := openers(t, dsn)
		state := func() string {
			t.Helper()
			var versions, keys string
			if err := pool.QueryRow(t.Context(), `SELECT coalesce(to_regclass('idempotency_keys_schema')::text, 'none'),
				(SELECT count(*) FROM idempotency_keys)`).Scan(&versions, &keys); err != nil {
				t.Fatal(err)
			}
			if versions != "none" {
				if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys_schema`).Scan(&versions); err != nil {
					t.Fatal(err)
				}
			}
			return "versions " + versions + ", keys " + keys
		}
		before := state()
		want := `pgstore: database lacks part of the store's schema: in schema "public", ` + c.want +
			", but the database holds idempotency_keys, idempotency_keys_pkey, idempotency_keys_created"
		for what, opened := range opens {
			s, err := opened()
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, pgstore.ErrSchema) || err.Error() != want {
				t.Errorf("after %s: %s = %v; want ErrSchema: %s", c.sql, what, err, want)
			}
			if after := state(); after != before {
				t.Errorf("after %s: %s left %s; want %s, as before", c.sql, what, after, before)
			}
		}
	}
}

// TestFleet runs three server instances, each on a store of its own with
// a pool of its own, on one database, one of them crashing mid-request
// (see storetest.RunFleet).
func TestFleet(t *testing.T) {
	dsn := pgtest.DB(t)
	storetest.RunFleet(t, func(t *testing.T) testserver.Store { return open(t, dsn, nil) })
}

// TestOpenThatCannotWrite: Open refuses a connection that could never
// write the store (read-only transactions, or a role that may only read
// idempotency_keys) with ErrPrivilege, where it opened one on a current
// schema and every request then got a 503.
func TestOpenThatCannotWrite(t *testing.T) {
	pgtest.RefusedWrite(t, pgstore.ErrPrivilege, "idempotency_keys", func(dsn string) (io.Closer, error) {
		return pgstore.Open(t.Context(), dsn, nil)
	})
}

// TestOpenBehindTransactionPooler: behind a pooler in transaction mode, a
// claim whose statement pgx prepared on another server session (or would
// prepare under a name the session holds) is run again at once in pgx's
// exec mode, and goes through; with default_query_exec_mode=exec in Open's
// DSN it prepares nothing by name.
func TestOpenBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerMixUp(t, pgtest.DB(t), func(dsn string) (*pgxpool.Pool, func() error) {
		s := open(t, dsn, nil)
		var n int64
		return pgstore.PoolOf(s), func() error {
			n++
			_, _, err := s.Claim(t.Context(), "tenant", fmt.Sprint("k", n), "fp", testserver.Fence{Token: n}, t0)
			return err
		}
	})
}

// TestSaveBehindTransactionPooler: a Save after the handler ran, on a
// session whose prepared statements are not those of pgx's cache (a
// pooler in transaction mode handed pgx another server session; here
// pgtest.MixUp), is run again at once in pgx's exec mode: the caller gets
// the handler's answer, and its retry after LockTimeout the replay, the
// handler having run once. Before, the save failed (SQLSTATE 26000 or
// 42P05), the claim stayed in flight, and the retry took it over and ran
// the handler again.
func TestSaveBehindTransactionPooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		t.Run(code, func(t *testing.T) {
			s := open(t, pgtest.DB(t)+"&pool_max_conns=1", nil)
			var runs, now atomic.Int64
			now.Store(t0.UnixNano())
			mw := &testserver.Middleware{Store: s, LockTimeout: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }}
			srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Idempotency-Key") == "k" {
					if err := pgtest.MixUp(r.Context(), pgstore.PoolOf(s), code); err != nil {
						t.Error(err)
					}
					runs.Add(1)
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "charge %d", runs.Load())
			})))
			defer srv.Close()
			// The first request has pgx prepare the claim and the save.
			if a := post(t, srv, "warm", "", `{"amount":1}`); a.status != http.StatusCreated {
				t.Fatalf("first request = %d %q; want 201", a.status, a.body)
			}
			if a := post(t, srv, "k", "", `{"amount":1}`); a.status != http.StatusCreated || a.body != "charge 1" {
				t.Errorf("request = %d %q; want 201 charge 1", a.status, a.body)
			}
			// The retries come after LockTimeout; one that meets the store
			// down (503) is sent again, as a client does.
			for i := range 3 {
				now.Add(int64(2 * time.Minute))
				a := post(t, srv, "k", "", `{"amount":1}`)
				if a.status == http.StatusServiceUnavailable && i < 2 {
					continue
				}
				if a.status != http.StatusCreated || a.body != "charge 1" || a.replayed != "true" {
					t.Errorf("retry %d = %d %q, replayed %q; want the replay of 201 charge 1", i+1, a.status, a.body, a.replayed)
				}
				break
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times; want 1", n)
			}
			if st := mw.Stats(); st.StoreErrors != 0 || st.Takeovers != 0 {
				t.Errorf("stats %+v; want no store error and no take-over", st)
			}
		})
	}
}

// TestWritesBehindTransactionPooler: Claim, TakeOver, Save, Release and
// Prune, each on a session whose prepared statements are not those of
// pgx's cache (see pgtest.MixUp), go through, run again at once in pgx's
// exec mode.
func TestWritesBehindTransactionPooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		t.Run(code, func(t *testing.T) {
			s := open(t, pgtest.DB(t)+"&pool_max_conns=1", nil)
			ctx := t.Context()
			f1, f2 := testserver.Fence{Token: 1, ClaimID: "c1"}, testserver.Fence{Token: 2, ClaimID: "c2"}
			resp := testserver.Response{Status: 201, Body: []byte("ok")}
			round := func(key string) error {
				if _, claimed, err := s.Claim(ctx, "s", key, "fp", f1, t0); err != nil || !claimed {
					return fmt.Errorf("claim %s: %v, %v", key, claimed, err)
				}
				if won, err := s.TakeOver(ctx, "s", key, f1, f2); err != nil || !won {
					return fmt.Errorf("take over %s: %v, %v", key, won, err)
				}
				if err := s.Save(ctx, "s", key, f2, resp); err != nil {
					return fmt.Errorf("save %s: %w", key, err)
				}
				if _, claimed, err := s.Claim(ctx, "s", key+"-r", "fp", f1, t0); err != nil || !claimed {
					return fmt.Errorf("claim %s-r: %v, %v", key, claimed, err)
				}
				if released, err := s.Release(ctx, "s", key+"-r", f1); err != nil || !released {
					return fmt.Errorf("release %s-r: %v, %v", key, released, err)
				}
				if _, err := s.Prune(ctx, t0.Add(-time.Hour), 10); err != nil {
					return fmt.Errorf("prune: %w", err)
				}
				return nil
			}
			if err := round("warm"); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				name string
				call func() error
			}{
				{"claim", func() error { _, _, err := s.Claim(ctx, "s", "k", "fp", f1, t0); return err }},
				{"take over", func() error { _, err := s.TakeOver(ctx, "s", "k", f1, f2); return err }},
				{"save", func() error { return s.Save(ctx, "s", "k", f2, resp) }},
				{"claim", func() error { _, _, err := s.Claim(ctx, "s", "k-r", "fp", f1, t0); return err }},
				{"release", func() error { _, err := s.Release(ctx, "s", "k-r", f1); return err }},
				{"prune", func() error { _, err := s.Prune(ctx, t0.Add(-time.Hour), 10); return err }},
			}
			for _, step := range steps {
				if err := pgtest.MixUp(ctx, pgstore.PoolOf(s), code); err != nil {
					t.Fatal(err)
				}
				if err := step.call(); err != nil {
					t.Errorf("%s on a mixed-up session: %v; want it through", step.name, err)
				}
			}
			if e, claimed, err := s.Claim(ctx, "s", "k", "fp", f1, t0); err != nil || claimed || e.Status != testserver.StatusDone || e.Fence != f2 {
				t.Errorf("claim of k = %+v, %v, %v; want its entry done under %+v", e, claimed, err, f2)
			}
		})
	}
}

// TestReadOnlyWindowEnds: a session made while the database's transactions
// were read-only (default_transaction_read_only set for the database, later
// reset) keeps that default for its life. A claim during the window fails
// with the server's error (SQLSTATE 25006), and the first claim after it
// succeeds: the store drops the sessions made meanwhile rather than give
// them back to its pool, which would keep them for up to an hour.
func TestReadOnlyWindowEnds(t *testing.T) {
	dsn := pgtest.DB(t)
	s := open(t, dsn+"&pool_max_conns=1", nil)
	ctx := t.Context()
	if _, _, err := s.Claim(ctx, "s", "before", "fp", testserver.Fence{Token: 1}, t0); err != nil {
		t.Fatal(err)
	}
	admin := pgtest.Connect(t, dsn) // made before the window: it may write
	setDatabaseDefault(t, dsn, "default_transaction_read_only", "on")
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Claim(ctx, "s", "during", "fp", testserver.Fence{Token: 2}, t0)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("Claim while transactions are read-only: %v; want SQLSTATE 25006", err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{admin.Config().Database}.Sanitize()+
		` RESET default_transaction_read_only`); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := s.Claim(ctx, "s", "after", "fp", testserver.Fence{Token: 3}, t0); err != nil || !claimed {
		t.Errorf("Claim once transactions may write again = %v, %v; want claimed", claimed, err)
	}
}

// TestWriteCommittedAsContextEnds: a Save, TakeOver or Release whose
// context ends after the server committed its statement, while its answer
// is on its way, reports what was done, not the context's error. pgx
// gives up the connection as the context ends and returns the context's
// error, whether or not the server had applied the statement: the
// Middleware would log a saved answer as a failed save, counted among its
// store errors, a claim released as one left in flight, and refuse a
// request whose take-over it made. A write whose context ends before the
// server applied it still fails, and is not applied.
//
// The relay holds the statement's answer, which the server sends once it
// has committed, until the call returned: no sleep orders the events.
func TestWriteCommittedAsContextEnds(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	s := open(t, dsn, nil)
	f, next := testserver.Fence{Token: 7, ClaimID: "c"}, testserver.Fence{Token: 8, ClaimID: "d"}
	// write runs w with a context that ends once the server has committed
	// the statement whose command tag begins with tag, before its answer
	// reaches the store.
	write := func(tag string, w func(ctx context.Context) error) error {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		held, let := relay.HoldNext(tag)
		defer let()
		result := make(chan error, 1)
		go func() { result <- w(ctx) }()
		select {
		case <-held:
		case err := <-result:
			t.Fatalf("%s returned before its answer was held: %v", tag, err)
		}
		cancel()
		return <-result
	}
	for _, key := range []string{"saved", "taken", "released", "blocked"} {
		if _, claimed, err := s.Claim(t.Context(), "s", key, "fp", f, t0); err != nil || !claimed {
			t.Fatalf("Claim(%s): claimed %v, %v", key, claimed, err)
		}
	}
	if err := write("UPDATE", func(ctx context.Context) error {
		return s.Save(ctx, "s", "saved", f, testserver.Response{Status: 201, Body: []byte("ok")})
	}); err != nil {
		t.Errorf("Save committed as its context ended: %v; want nil", err)
	}
	if err := write("UPDATE", func(ctx context.Context) error {
		won, err := s.TakeOver(ctx, "s", "taken", f, next)
		if err == nil && !won {
			return errors.New("not won")
		}
		return err
	}); err != nil {
		t.Errorf("TakeOver committed as its context ended: %v; want won", err)
	}
	if err := write("DELETE", func(ctx context.Context) error {
		released, err := s.Release(ctx, "s", "released", f)
		if err == nil && !released {
			return errors.New("not released")
		}
		return err
	}); err != nil {
		t.Errorf("Release committed as its context ended: %v; want released", err)
	}

	// A Save that waits for a row lock as its context ends: the server
	// applied nothing, and the store's read finds the entry in flight.
	tx, err := s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT FROM idempotency_keys WHERE key = 'blocked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	result := make(chan error, 1)
	go func() { result <- s.Save(ctx, "s", "blocked", f, testserver.Response{Status: 201}) }()
	// Watched from outside tx, whose snapshot of pg_stat_activity would
	// stay as it first read it.
	waitBlocked(t, s.Pool(), 1)
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("Save cancelled while it waited for a lock: %v; want context.Canceled", err)
	}
	// pgx cancels the statement of the connection it gave up: once the
	// server has, the lock can go without the save being applied.
	waitNotBlocked(t, s.Pool())
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}

	other := testserver.Fence{Token: 9, ClaimID: "e"}
	if e, _, err := s.Claim(t.Context(), "s", "saved", "fp", other, t0); err != nil || e.Status != testserver.StatusDone || e.Response == nil || string(e.Response.Body) != "ok" {
		t.Errorf("the key saved as the context ended: %+v, %v; want it done with the answer", e, err)
	}
	if e, _, err := s.Claim(t.Context(), "s", "taken", "fp", other, t0); err != nil || e.Status != testserver.StatusInFlight || e.Fence != next {
		t.Errorf("the key taken over as the context ended: %+v, %v; want it in flight with the new fence", e, err)
	}
	if _, claimed, err := s.Claim(t.Context(), "s", "released", "fp", other, t0); err != nil || !claimed {
		t.Errorf("the key released as the context ended: claimed %v, %v; want it free", claimed, err)
	}
	if e, _, err := s.Claim(t.Context(), "s", "blocked", "fp", other, t0); err != nil || e.Status != testserver.StatusInFlight || e.Fence != f {
		t.Errorf("the key whose save was cancelled: %+v, %v; want it in flight with its claim's fence", e, err)
	}
}

// TestMiddlewareTakeOverAsCallerHangsUp: a caller hangs up once the server
// has committed the Middleware's take-over of a stale claim, before its
// answer reaches the store (the relay holds it). The take-over is made:
// the handler runs, under it, and its answer is saved, for the caller's
// retry to replay, with no store error. Before, the store returned the
// caller's context's error: the Middleware ran nothing and left the
// take-over it had made in flight, the caller's retries refused with 409
// until the lock timeout.
func TestMiddlewareTakeOverAsCallerHangsUp(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	s := open(t, dsn, nil)
	const body = `{"amount":1}`
	var runs, takenOver atomic.Int64
	mw := &testserver.Middleware{Store: s, LockTimeout: time.Minute, Now: func() time.Time { return t0.Add(2 * time.Minute) }}
	handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := testserver.ClaimFrom(r.Context()); c.TakenOver {
			takenOver.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", runs.Add(1))
	}))
	srv := httptest.NewServer(handler)
	fp := testserver.Fingerprint(httptest.NewRequest(http.MethodPost, "/", nil), "", []byte(body)) // post's
	if _, claimed, err := s.Claim(t.Context(), "", "k", fp, testserver.Fence{Token: t0.UnixNano(), ClaimID: "stale"}, t0); err != nil || !claimed {
		t.Fatalf("stale Claim = %v, %v", claimed, err)
	}

	held, let := relay.HoldNext("UPDATE")
	defer let()
	ctx, hangUp := context.WithCancel(t.Context())
	defer hangUp()
	result := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
		if err == nil {
			req.Header.Set("Idempotency-Key", "k")
			var resp *http.Response
			if resp, err = srv.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		}
		result <- err
	}()
	select {
	case <-held:
	case err := <-result:
		t.Fatalf("the request ended before the take-over's answer was held: %v", err)
	}
	hangUp() // the server sees the connection close, and ends the request's context
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Fatalf("request hung up: %v; want context.Canceled", err)
	}
	// Close waits for the request the caller left, and what the
	// Middleware does after it.
	srv.Close()

	if n := mw.Stats().StoreErrors; n != 0 {
		t.Errorf("store errors = %d; want 0", n)
	}
	if r, to := runs.Load(), takenOver.Load(); r != 1 || to != 1 {
		t.Errorf("the handler ran %d times, %d taking over; want once, taking over", r, to)
	}
	srv = httptest.NewServer(handler)
	defer srv.Close()
	if a := post(t, srv, "k", "", body); a.status != http.StatusCreated || a.body != "charge 1" || a.replayed != "true" {
		t.Errorf("retry = %d %q, replayed %q; want the replay of 201 charge 1", a.status, a.body, a.replayed)
	}
}

// TestNewBehindTransactionPooler: New on a pool whose one session's
// prepared statements are not those of pgx's cache (see pgtest.MixUp)
// goes through, its statements run again at once in pgx's exec mode.
// Before, it failed with SQLSTATE 26000 or 42P05.
func TestNewBehindTransactionPooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		t.Run(code, func(t *testing.T) {
			pool, err := pgxpool.New(t.Context(), pgtest.DB(t)+"&pool_max_conns=1")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s, err := pgstore.New(t.Context(), pool, nil) // pgx prepares New's statements
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			if err := pgtest.MixUp(t.Context(), pool, code); err != nil {
				t.Fatal(err)
			}
			s, err = pgstore.New(t.Context(), pool, nil)
			if err != nil {
				t.Fatalf("New on a mixed-up session: %v; want it through", err)
			}
			s.Close()
		})
	}
}
