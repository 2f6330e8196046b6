package sqlitestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
	"github.com/idemkit/idem/testserver/storetest"
)

// benchResponse is the answer every benchmark saves.
var benchResponse = testserver.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"ch_1","status":"succeeded"}`),
}

// BenchmarkClaimSave: a claim and the save of its answer through the Store,
// beside the same SQL statements run through database/sql directly on the
// same kind of connection (one, WAL, synchronous=FULL, BEGIN IMMEDIATE),
// with 1 and 32 callers. Each round starts from an empty file.
func BenchmarkClaimSave(b *testing.B) {
	for _, callers := range []int{1, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			b.Run("impl=store", func(b *testing.B) {
				s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "keys.db"), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				storetest.RunCallers(b, callers, func(ctx context.Context, key string, f testserver.Fence) error {
					if _, claimed, err := s.Claim(ctx, "tenant", key, "fp", f, time.Now()); err != nil || !claimed {
						return fmt.Errorf("Claim = %v, %v; want claimed", claimed, err)
					}
					return s.Save(ctx, "tenant", key, f, benchResponse)
				})
			})
			b.Run("impl=rawsql", func(b *testing.B) {
				db := openRaw(b)
				header := `{"Content-Type":["application/json"]}`
				storetest.RunCallers(b, callers, func(ctx context.Context, key string, f testserver.Fence) error {
					// Store.Claim: one IMMEDIATE transaction around the insert.
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					res, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, claim_id, created)
						VALUES (?, ?, ?, 'in_flight', ?, ?, ?) ON CONFLICT (scope, key) DO NOTHING`,
						"tenant", key, "fp", f.Token, f.ClaimID, time.Now().UnixNano())
					if err != nil {
						tx.Rollback()
						return err
					}
					if n, err := res.RowsAffected(); err != nil || n != 1 {
						tx.Rollback()
						return fmt.Errorf("insert changed %d rows (%v); want 1", n, err)
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					// Store.Save: one fenced update.
					res, err = db.ExecContext(ctx, `UPDATE idempotency_keys SET status = 'done', response_status = ?, response_header = ?, response_body = ?
						WHERE scope = ? AND key = ? AND status = 'in_flight' AND locked_at = ? AND claim_id = ?`,
						benchResponse.Status, header, benchResponse.Body, "tenant", key, f.Token, f.ClaimID)
					if err != nil {
						return err
					}
					if n, err := res.RowsAffected(); err != nil || n != 1 {
						return fmt.Errorf("update changed %d rows (%v); want 1", n, err)
					}
					return nil
				})
			})
		})
	}
}

// openRaw returns a database/sql handle on a new file with the store's
// schema (made by Open) and the store's connection settings.
func openRaw(b *testing.B) *sql.DB {
	b.Helper()
	path := filepath.Join(b.TempDir(), "keys.db")
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		b.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate")
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	b.Cleanup(func() { db.Close() })
	return db
}
