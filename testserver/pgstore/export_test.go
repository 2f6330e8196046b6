package pgstore

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/testserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateLock is the advisory lock that serialises migrations.
var MigrateLock = schema.Lock

// MigrateTo brings the database of pool to version v of the schema, as the
// package did when v was its latest: migrations[:v], under the same lock,
// and ErrSchemaTooNew for a database at a later version.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, v int) error {
	old := schema
	old.Migrations = migrations[:v]
	_, err := old.Migrate(ctx, pool, pgmigrate.Timeouts{})
	return err
}

// EarlierStore is the store of an earlier version of the package, of
// schema version 2, whose statements knew no claim_id: its writes are
// fenced by the token alone, and it reads no ID.
type EarlierStore struct {
	*Store
	claim, takeOver, save, release string
}

// OnSchema returns an EarlierStore on pool that uses the store's table in
// schema name as it finds it, migrating nothing.
func OnSchema(pool *pgxpool.Pool, name string) *EarlierStore {
	const columns = `fingerprint, status, response_status, response_header, response_body, locked_at, created`
	q := func(stmt string) string { return pgmigrate.Qualify(stmt, name) }
	return &EarlierStore{
		Store: &Store{pool: pool, timeout: DefaultQueryTimeout, batch: DefaultPruneBatch, sql: newStatements(name)},
		claim: q(`WITH ins AS (
			INSERT INTO {schema}.idempotency_keys (scope, key, fingerprint, status, locked_at, created)
			VALUES ($1, $2, $3, 'in_flight', $4, $5)
			ON CONFLICT (scope, key) DO NOTHING
			RETURNING ` + columns + `
		)
		SELECT true, ` + columns + ` FROM ins
		UNION ALL
		SELECT false, ` + columns + ` FROM {schema}.idempotency_keys
		WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT FROM ins)`),
		takeOver: q(`UPDATE {schema}.idempotency_keys SET locked_at = $4
			WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND locked_at = $3`),
		save: q(`UPDATE {schema}.idempotency_keys
			SET status = 'done', response_status = $4, response_header = $5, response_body = $6
			WHERE scope = $1 AND key = $2 AND locked_at = $3 AND status = 'in_flight'`),
		release: q(`DELETE FROM {schema}.idempotency_keys
			WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND locked_at = $3`),
	}
}

// Claim claims with f's token alone; the entry it returns has no ID.
func (s *EarlierStore) Claim(ctx context.Context, scope, key, fingerprint string, f testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	e := testserver.Entry{Scope: scope, Key: key}
	var (
		claimed bool
		status  *int32
		header  []byte
		body    []byte
		created int64
	)
	err := s.pool.QueryRow(ctx, s.claim, scope, key, fingerprint, f.Token, now.UnixNano()).
		Scan(&claimed, &e.Fingerprint, &e.Status, &status, &header, &body, &e.Token, &created)
	if err != nil || status == nil {
		return e, claimed, err
	}
	e.Response = &testserver.Response{Status: int(*status), Body: body}
	e.Response.Header, err = hdrjson.Unmarshal(header)
	return e, claimed, err
}

// TakeOver takes over by the tokens alone.
func (s *EarlierStore) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	n, err := s.exec(ctx, s.takeOver, scope, key, old.Token, new.Token)
	return n == 1, err
}

// Save saves fenced by the token alone.
func (s *EarlierStore) Save(ctx context.Context, scope, key string, f testserver.Fence, resp testserver.Response) error {
	header, err := hdrjson.Marshal(resp.Header)
	if err != nil {
		return err
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	n, err := s.exec(ctx, s.save, scope, key, f.Token, resp.Status, string(header), resp.Body)
	if err == nil && n == 0 {
		err = testserver.ErrFenced
	}
	return err
}

// Release releases fenced by the token alone.
func (s *EarlierStore) Release(ctx context.Context, scope, key string, f testserver.Fence) (bool, error) {
	n, err := s.exec(ctx, s.release, scope, key, f.Token)
	return n == 1, err
}

// PoolOf returns s's connection pool.
func PoolOf(s *Store) *pgxpool.Pool { return s.pool }
