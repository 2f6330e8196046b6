package pgstore_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/idemkit/idem/testserver/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchConns is the pool size of both sides of BenchmarkClaimSave: one
// connection per caller at 32 callers.
const benchConns = 32

// benchResponse is the answer every benchmark saves.
var benchResponse = testserver.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"ch_1","status":"succeeded"}`),
}

// BenchmarkClaimSave: a claim and the save of its answer through the Store,
// beside the same two SQL statements run through a pgx pool directly, with
// 1 and 32 callers, on one database of the test cluster (fsync and
// synchronous_commit on). Both pools have 32 connections and the same
// statement_timeout; the table is emptied before each round.
func BenchmarkClaimSave(b *testing.B) {
	dsn := pgtest.DB(b)
	u, err := url.Parse(dsn)
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(benchConns))
	u.RawQuery = q.Encode()
	dsn = u.String()

	s, err := pgstore.Open(context.Background(), dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// The raw pool: the store's settings, statement_timeout included.
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(pgstore.DefaultQueryTimeout.Milliseconds(), 10)
	raw, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	header := `{"Content-Type":["application/json"]}`

	impls := []struct {
		name string
		op   func(ctx context.Context, key string, f testserver.Fence) error
	}{
		{"store", func(ctx context.Context, key string, f testserver.Fence) error {
			if _, claimed, err := s.Claim(ctx, "tenant", key, "fp", f, time.Now()); err != nil || !claimed {
				return fmt.Errorf("Claim = %v, %v; want claimed", claimed, err)
			}
			return s.Save(ctx, "tenant", key, f, benchResponse)
		}},
		{"rawsql", func(ctx context.Context, key string, f testserver.Fence) error {
			// Store.Claim's statement: the insert, or the existing row.
			var claimed bool
			var fp, status string
			var respStatus *int32
			var respHeader, respBody []byte
			var lockedAt, created int64
			var claimID string
			err := raw.QueryRow(ctx, `WITH ins AS (
					INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, created, claim_id)
					VALUES ($1, $2, $3, 'in_flight', $4, $5, $6)
					ON CONFLICT (scope, key) DO NOTHING
					RETURNING fingerprint, status, response_status, response_header, response_body, locked_at, claim_id, created
				)
				SELECT true, fingerprint, status, response_status, response_header, response_body, locked_at, claim_id, created FROM ins
				UNION ALL
				SELECT false, fingerprint, status, response_status, response_header, response_body, locked_at, claim_id, created FROM idempotency_keys
				WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT FROM ins)`,
				"tenant", key, "fp", f.Token, time.Now().UnixNano(), f.ClaimID).
				Scan(&claimed, &fp, &status, &respStatus, &respHeader, &respBody, &lockedAt, &claimID, &created)
			if err != nil || !claimed {
				return fmt.Errorf("claim = %v, %v; want claimed", claimed, err)
			}
			// Store.Save's statement: the fenced update.
			tag, err := raw.Exec(ctx, `UPDATE idempotency_keys
				SET status = 'done', response_status = $4, response_header = $5, response_body = $6
				WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND locked_at = $3 AND claim_id = $7`,
				"tenant", key, f.Token, benchResponse.Status, header, benchResponse.Body, f.ClaimID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("update changed %d rows; want 1", tag.RowsAffected())
			}
			return nil
		}},
	}
	for _, callers := range []int{1, benchConns} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			for _, impl := range impls {
				b.Run("impl="+impl.name, func(b *testing.B) {
					if _, err := raw.Exec(context.Background(), "TRUNCATE idempotency_keys"); err != nil {
						b.Fatal(err)
					}
					storetest.RunCallers(b, callers, impl.op)
				})
			}
		})
	}
}
