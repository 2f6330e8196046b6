package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/pgmigrate"
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

var (
	// ErrSchemaTooNew is returned by Open and New when the database's
	// schema was written by a newer version of this package.
	ErrSchemaTooNew = errors.New("pgstore: database schema is newer than this program")

	// ErrSchema is returned by Open and New for a database that records
	// the store's current schema version but lacks its table or one of
	// its indexes, named after it. Neither re-creates it: a table dropped
	// took its claims and saved answers with it, and a retry of a request
	// whose key was lost would run its handler again. Restore it (from a
	// backup, or as the migration in migrate.go creates it) knowing what
	// was lost. It is returned too, naming what remains, for a database
	// whose idempotency_keys_schema was dropped or emptied but that holds
	// the store's table or an index of it: neither creates, alters or
	// drops anything there.
	ErrSchema = errors.New("pgstore: database lacks part of the store's schema")
)

// schema is pgstore's tables, recorded in idempotency_keys_schema.
var schema = pgmigrate.Schema{
	Lock:       0x6964656d73746f72, // "idemstor"
	Table:      "idempotency_keys_schema",
	Migrations: migrations,
	TooNew:     ErrSchemaTooNew,
	Objects:    []string{"idempotency_keys", "idempotency_keys_pkey", "idempotency_keys_created"},
	Incomplete: ErrSchema,
}

// migrate brings the schema to len(migrations) (see pgmigrate).
func migrate(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	err := schema.Migrate(ctx, pool)
	if err != nil && !errors.Is(err, ErrSchemaTooNew) && !errors.Is(err, ErrSchema) {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return err
}
