package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations[i] brings the schema from version i to version i+1. Versions
// are only ever appended: a released migration is never edited.
var migrations = [][]string{
	{ // 1
		`CREATE TABLE idempotency_keys (
			scope           text    NOT NULL,
			key             text    NOT NULL,
			fingerprint     text    NOT NULL,
			status          text    NOT NULL CHECK (status IN ('in_flight', 'done')),
			response_status integer,
			response_header text,    -- JSON object: header name to values
			response_body   bytea,
			locked_at       bigint  NOT NULL, -- the fencing token, Unix nanoseconds
			created         bigint  NOT NULL, -- Unix nanoseconds
			PRIMARY KEY (scope, key)
		)`,
		`CREATE INDEX idempotency_keys_created ON idempotency_keys (created)`,
	},
}

// ErrSchemaTooNew is returned by Open and New when the database's schema
// was written by a newer version of this package.
var ErrSchemaTooNew = errors.New("pgstore: database schema is newer than this program")

// migrateLock is the key of the transaction-scoped advisory lock that
// serialises migrations, so that server instances starting together do not
// race to create the tables.
const migrateLock = 0x6964656d73746f72 // "idemstor"

// migrate brings the schema to len(migrations) in one transaction, recording
// each version applied in idempotency_keys_schema.
func migrate(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	// READ COMMITTED whatever the database's default: under REPEATABLE
	// READ or SERIALIZABLE the snapshot would be taken before the lock
	// wait, and a process that waited for another's migration would not
	// see it.
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// The wait for another's migration is bounded by the deadline,
		// not by a lock_timeout the database or the role may set to keep
		// DDL from queueing: under it, of instances starting together all
		// but one would fail. The DDL itself keeps that lock_timeout.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = 0`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout TO DEFAULT`); err != nil {
			return err
		}
		// CREATE TABLE IF NOT EXISTS needs the CREATE privilege even when
		// the table exists: it only runs when the table is not in the
		// schema it would create it in, so that a role that may only read
		// and write the tables opens a schema that is current.
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_tables
			WHERE schemaname = current_schema() AND tablename = 'idempotency_keys_schema')`).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS idempotency_keys_schema (
				version    integer     PRIMARY KEY,
				applied_at timestamptz NOT NULL DEFAULT now()
			)`); err != nil {
				return err
			}
		}
		var v int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM idempotency_keys_schema`).Scan(&v); err != nil {
			return err
		}
		if v > len(migrations) {
			return fmt.Errorf("%w: version %d, this program knows %d", ErrSchemaTooNew, v, len(migrations))
		}
		for ; v < len(migrations); v++ {
			for _, stmt := range migrations[v] {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("version %d: %w", v+1, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys_schema (version) VALUES ($1)`, v+1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrSchemaTooNew) {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return err
}
