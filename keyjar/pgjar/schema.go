package pgjar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations[i] brings the schema from version i to version i+1. Versions
// are only ever appended: a released migration is never edited.
//
// Times are Unix nanoseconds in bigint columns, NULL for the zero time:
// PostgreSQL's timestamps keep only microseconds. op sorts bytewise
// (COLLATE "C"), as Go compares strings.
var migrations = [][]string{
	{ // 1
		`CREATE TABLE idem_operations (
			op           text COLLATE "C" PRIMARY KEY,
			key          text    NOT NULL,
			fingerprint  text    NOT NULL,
			state        text    NOT NULL
				CHECK (state IN ('pending', 'done', 'failed', 'reconcile', 'abandoned')),
			method       text    NOT NULL,
			url          text    NOT NULL,
			header       text,             -- JSON object; NULL for a nil header
			body         bytea,            -- NULL for a nil body
			body_size    bigint  NOT NULL,
			created      bigint,
			updated      bigint,
			attempts     bigint  NOT NULL,
			last_status  integer NOT NULL,
			last_error   text    NOT NULL,
			next_attempt bigint,
			note         text    NOT NULL,
			holder       text    NOT NULL,
			lease_until  bigint
		)`,
		`CREATE INDEX idem_operations_by_created ON idem_operations (created NULLS FIRST, op)`,
		`CREATE INDEX idem_operations_by_state ON idem_operations (state, updated)`,
	},
}

// migrateLock is the key of the transaction-scoped advisory lock that
// serialises migrations, so that workers starting together do not race to
// create the tables.
const migrateLock = 0x6964656d6a617273 // "idemjars"

// migrate brings the schema to len(migrations) in one transaction, recording
// each version applied in idem_operations_schema.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
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
			WHERE schemaname = current_schema() AND tablename = 'idem_operations_schema')`).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS idem_operations_schema (
				version    integer     PRIMARY KEY,
				applied_at timestamptz NOT NULL DEFAULT now()
			)`); err != nil {
				return err
			}
		}
		var v int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM idem_operations_schema`).Scan(&v); err != nil {
			return err
		}
		if v > len(migrations) {
			return fmt.Errorf("%w: version %d, this package knows up to %d", ErrVersion, v, len(migrations))
		}
		for ; v < len(migrations); v++ {
			for _, stmt := range migrations[v] {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("version %d: %w", v+1, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO idem_operations_schema (version) VALUES ($1)`, v+1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrVersion) {
		return fmt.Errorf("pgjar: migrate: %w", err)
	}
	return err
}

// columns are the columns of idem_operations in the order scanRecord reads
// them.
const columns = `op, key, fingerprint, state, method, url, header, body, body_size,
	created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until`

func scanRecord(row pgx.Row) (idem.Record, error) {
	var (
		r                                  idem.Record
		header                             *string
		created, updated, next, leaseUntil *int64
	)
	err := row.Scan(&r.Op, &r.Key, &r.Fingerprint, &r.State, &r.Method, &r.URL, &header, &r.Body, &r.BodySize,
		&created, &updated, &r.Attempts, &r.LastStatus, &r.LastError, &next, &r.Note, &r.Holder, &leaseUntil)
	if err != nil {
		return idem.Record{}, err
	}
	if header != nil {
		if r.Header, err = hdrjson.Unmarshal([]byte(*header)); err != nil {
			return idem.Record{}, fmt.Errorf("header of %q: %w", r.Op, err)
		}
		if r.Header == nil {
			r.Header = http.Header{}
		}
	}
	r.Created, r.Updated = fromNanos(created), fromNanos(updated)
	r.NextAttempt, r.LeaseUntil = fromNanos(next), fromNanos(leaseUntil)
	return r, nil
}

func fromNanos(n *int64) time.Time {
	if n == nil {
		return time.Time{}
	}
	return time.Unix(0, *n).UTC()
}

// nanos encodes t as Unix nanoseconds, the zero time as NULL. A time that
// Unix nanoseconds cannot hold is an ErrInvalid.
func nanos(field string, t time.Time) (*int64, error) {
	if t.IsZero() {
		return nil, nil
	}
	n := t.UnixNano()
	if !time.Unix(0, n).Equal(t) {
		return nil, fmt.Errorf("%w: %s %v is outside the years 1678 to 2262", ErrInvalid, field, t)
	}
	return &n, nil
}

// cutoff encodes before for "updated < before", clamped into the range of
// Unix nanoseconds: a time before it still lets NULL (the zero time) match.
func cutoff(before time.Time) int64 {
	switch {
	case before.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case before.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return before.UnixNano()
}
