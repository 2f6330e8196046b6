package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pgApp opens an app on the PostgreSQL database dsn names: the keys in
// pgstore, the ledger through database/sql (pgx's stdlib driver).
func pgApp(t *testing.T, dsn string) *payments.App {
	t.Helper()
	ctx := context.Background()
	store, err := pgstore.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	payco, err := payments.NewPayCo(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	return &payments.App{PayCo: payco, Idempotency: &testserver.Middleware{Store: store}}
}

// backends opens two apps on one fresh database of each kind: two server
// processes sharing their keys and their ledger.
var backends = []struct {
	name string
	open func(t *testing.T) (*payments.App, *payments.App)
}{
	{"sqlite", func(t *testing.T) (*payments.App, *payments.App) {
		path := t.TempDir() + "/server.db"
		return newApp(t, path), newApp(t, path)
	}},
	{"postgres", func(t *testing.T) (*payments.App, *payments.App) {
		dsn := pgtest.DB(t)
		return pgApp(t, dsn), pgApp(t, dsn)
	}},
}

// The ledger behaves alike on both databases: charges, replays across
// servers, PayCo's dedup, amounts beyond 32 bits, a key reused for another
// amount.
func TestLedgerOnEachDatabase(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			one, two := b.open(t)
			h1, h2 := one.Handler(), two.Handler()
			big := `{"amount": 5000000000, "currency": "usd", "order_id": "o-big"}` // 2^32 < 5e9
			first := decode(t, post(h1, "k", "application/json", big))
			if first.Amount != 5_000_000_000 {
				t.Fatalf("charge %+v; want the amount 5000000000 kept", first)
			}
			replay := post(h2, "k", "application/json", big)
			if decode(t, replay) != first || replay.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second server: %q; want the first server's charge replayed", replay.Body)
			}
			var got payments.Charge
			if code := get(t, h2, "/v1/charges/"+first.ID, &got); code != http.StatusOK || got != first {
				t.Fatalf("GET charge on the second server: %d %+v; want %+v", code, got, first)
			}

			// Another key for the same order reaches PayCo, whose key
			// charge:<order_id> keeps one charge.
			if again := decode(t, post(h2, "k2", "application/json", big)); again != first {
				t.Fatalf("second key for the order: %+v; want PayCo's charge %+v again", again, first)
			}
			w := post(h1, "k3", "application/json", `{"amount": 1, "currency": "usd", "order_id": "o-big"}`)
			if w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("order charged again with another amount: %d %q; want 422", w.Code, w.Body)
			}
			s := stats(t, h1)
			// The refused call rolled back with its count.
			if s.Charges != 2 || s.PerOrder["o-big"] != 2 || s.DoubleCharged != 1 || s.Settled != 1 || s.SettledDoubleCharged != 0 {
				t.Fatalf("stats %+v; want 2 calls for o-big and 1 charge", s)
			}

			one.PayCo.NoDedup = true
			decode(t, post(h1, "k4", "application/json", jsonBody))
			decode(t, post(h1, "k5", "application/json", jsonBody))
			if s := stats(t, h2); s.Settled != 3 || s.SettledDoubleCharged != 1 {
				t.Fatalf("without dedup: %+v; want o-1 charged twice", s)
			}
		})
	}
}

// Many keys for one order, at once, on two servers: PayCo counts every
// call and makes one charge, whatever the interleaving of its transactions.
func TestConcurrentChargesOneOrder(t *testing.T) {
	const calls = 16
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			one, two := b.open(t)
			hs := []http.Handler{one.Handler(), two.Handler()}
			ids := make([]string, calls)
			var wg sync.WaitGroup
			for i := range calls {
				wg.Go(func() {
					w := post(hs[i%2], fmt.Sprint("key-", i), "application/json", jsonBody)
					if w.Code != http.StatusCreated {
						t.Errorf("charge %d: %d %q; want 201", i, w.Code, w.Body)
						return
					}
					var c payments.Charge
					if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
						t.Errorf("charge %d: %v", i, err)
					}
					ids[i] = c.ID
				})
			}
			wg.Wait()
			for i, id := range ids {
				if id != ids[0] {
					t.Fatalf("charge %d is %q, charge 0 is %q; want one charge for the order", i, id, ids[0])
				}
			}
			if s := stats(t, hs[0]); s.Charges != calls || s.Settled != 1 {
				t.Fatalf("stats %+v; want %d calls, 1 charge", s, calls)
			}
		})
	}
}

// TestIDsTextCannotHold: a charge or order id that PostgreSQL's text
// cannot hold (a NUL byte, bytes that are not UTF-8), as a path's escapes
// can spell it, names no charge: 404 and no charges, on both databases,
// rather than a 503 that asks the client to retry what will never succeed,
// logged as the ledger failing.
func TestIDsTextCannotHold(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			app, _ := b.open(t)
			var logged strings.Builder
			app.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			h := app.Handler()
			decode(t, post(h, "k", "application/json", jsonBody))
			for _, id := range []string{"%00", "ch_%00", "%FF", "caf%E9"} {
				var p testserver.Problem
				if code := get(t, h, "/v1/charges/"+id, &p); code != http.StatusNotFound || !strings.HasSuffix(p.Type, "#no-charge") {
					t.Errorf("GET /v1/charges/%s: %d %+v; want 404 no-charge", id, code, p)
				}
				var order struct {
					Charges []payments.Charge `json:"charges"`
				}
				if code := get(t, h, "/v1/orders/"+id, &order); code != http.StatusOK || order.Charges == nil || len(order.Charges) != 0 {
					t.Errorf("GET /v1/orders/%s: %d %+v; want 200 and no charges", id, code, order)
				}
			}
			if logged.Len() > 0 {
				t.Errorf("logged %q; want nothing: the ledger did not fail", logged.String())
			}
		})
	}
}

// TestStatsReadOneMoment: Stats counts the calls and the charges as of one
// moment. Here a charge commits after Stats read the calls and before it
// reads the charges (which it waits for, behind a lock the charge holds):
// read under READ COMMITTED, each with its own snapshot, the counts said
// one charge made of no call.
func TestStatsReadOneMoment(t *testing.T) {
	dsn := pgtest.DB(t)
	app := pgApp(t, dsn)
	ctx := t.Context()
	charger, watcher := pgtest.Connect(t, dsn), pgtest.Connect(t, dsn)
	tx, err := charger.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `LOCK TABLE payco_charges IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		s   payments.Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := app.PayCo.Stats(ctx)
		done <- result{s, err}
	}()
	// Each poll a round trip: seconds at most, not forever.
	for i := 0; ; i++ {
		if i == 100_000 {
			t.Fatal("Stats never waited for the lock on payco_charges")
		}
		var waiting bool
		if err := watcher.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%payco_charges%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
	}
	for _, stmt := range []string{`INSERT INTO payco_calls (order_id, calls) VALUES ('o-late', 1)`,
		`INSERT INTO payco_charges (id, dedup_key, order_id, amount, currency, created)
			VALUES ('ch_late', 'charge:o-late', 'o-late', 100, 'usd', 1)`} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.s.Charges != r.s.Settled {
		t.Errorf("Stats = %+v, %v; want as many calls as charges (both 0, or both 1)", r.s, r.err)
	}
}
