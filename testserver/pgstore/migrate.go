package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations[i] brings the schema from version i to version i+1. Versions
// are only ever appended: a released migration is never edited. Tables
// are named {schema}.name, in the schema Open found (see pgmigrate.Qualify).
//
// The primary key's columns, scope and key, are in the "C" collation: they
// compare and sort bytewise, whatever the database's default collation.
// A libc collation (en_US.UTF-8, as initdb takes it from the environment)
// orders text as the operating system's C library does, and that order
// changes with it: glibc 2.28 changed where hyphens and spaces sort, and
// keys are strings the clients choose, UUIDs with hyphens among them. A
// B-tree index built under the old order and searched under the new one
// misses keys it holds, so a retry's claim of a key that has an entry
// would insert a second one and run the handler again: the one thing the
// store exists to prevent. Version 1 created them in the default
// collation; version 2 alters them, which rebuilds the primary key's
// index in the new order (a database whose index already lost its order
// may hold duplicate keys, and the rebuild then fails, and with it the
// migration, rather than keep them), and a database created now gets
// them through the same two versions.
//
// locked_at holds a claim's token (testserver.Fence.Token): the Unix
// nanoseconds of its clock's reading. Version 3 adds claim_id, the
// claim's ID (testserver.Fence.ClaimID), which fences the writes of a
// claim with its token. Claims in flight when it runs keep the empty ID,
// which their fences name. PostgreSQL adds a column with a constant
// default without rewriting the table.
var migrations = [][]string{
	{ // 1
		`CREATE TABLE {schema}.idempotency_keys (
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
		createdIndex,
	},
	{ // 2
		`ALTER TABLE {schema}.idempotency_keys
			ALTER COLUMN scope TYPE text COLLATE "C",
			ALTER COLUMN key TYPE text COLLATE "C"`,
	},
	{ // 3
		`ALTER TABLE {schema}.idempotency_keys ADD COLUMN claim_id text COLLATE "C" NOT NULL DEFAULT ''`,
	},
}

var (
	// ErrSchemaTooNew is returned by Open and New when the database's
	// schema was written by a newer version of this package. The schema
	// it is in (in schema "keys") and its version follow it.
	ErrSchemaTooNew = errors.New("pgstore: database schema is newer than this program")

	// ErrSchema is returned by Open and New for a database that records
	// the store's current schema version but lacks its table or one of
	// its indexes, named after it with the schema looked in (in schema
	// "keys", no idempotency_keys). Neither re-creates it: a table dropped
	// took its claims and saved answers with it, and a retry of a request
	// whose key was lost would run its handler again. Restore it (from a
	// backup, or as the migration in migrate.go creates it) knowing what
	// was lost. It is returned too, naming what remains, for a database
	// whose idempotency_keys_schema was dropped or emptied but that holds
	// the store's table or an index of it: neither creates, alters or
	// drops anything there.
	// It is returned too, naming both schemas, when the search_path
	// leads to the role's own schema ("$user") past the store in a later
	// one (see the package documentation).
	ErrSchema = errors.New("pgstore: database lacks part of the store's schema")

	// ErrNoSchema is returned by Open and New when current_schema() is
	// null on the connection that opens the store: no schema of its
	// search_path exists, so there is none to find the store's table in
	// or to create it in. The search_path follows it. Nothing is created.
	ErrNoSchema = errors.New("pgstore: no schema to hold the store")

	// ErrPrivilege is returned by Open and New when the role they connect
	// as may not create the store's tables (or upgrade them, for a
	// database at an older schema version): the statement failed with
	// SQLSTATE 42501, insufficient_privilege. The schema, what to do and
	// the server's error (a *pgconn.PgError) follow it. Open the store
	// once as a role that may create tables in that schema, such as its
	// owner; a store that exists at this package's version needs only the
	// privileges that Open lists. It is returned too, naming the function,
	// when the role may not execute pg_advisory_xact_lock(bigint) (EXECUTE
	// revoked from PUBLIC), the lock the migration takes even when the
	// schema is current; and, saying what to do, when no request could
	// claim a key: the connection's transactions are read-only (a hot
	// standby, default_transaction_read_only), or the role lacks one of
	// SELECT, INSERT, UPDATE and DELETE on idempotency_keys. Nothing is
	// created.
	// It is returned too when a schema of the search_path before
	// current_schema() holds the store and the role may not use it: GRANT
	// USAGE on it.
	ErrPrivilege = errors.New("pgstore: this role may not create or write the store's tables")

	// ErrMigrationTimeout is returned by Open and New when the upgrade of
	// a database of an older schema version, or the wait for another
	// process's, ran out of Options.MigrationTimeout (or the caller's
	// context ended first): the server canceled the statement (SQLSTATE
	// 57014), or the store stopped waiting for its answer. What was being
	// done (which version, which statement), the schema and the version
	// the database is at follow it, then what to do and the error, which
	// errors.As finds as a *pgconn.PgError or errors.Is as
	// context.DeadlineExceeded. The migration's transaction rolled back:
	// nothing was lost, and the store's table is as it was. Open it again
	// once the lock that kept it waiting is gone, or with a longer
	// MigrationTimeout for a large table.
	ErrMigrationTimeout = errors.New("pgstore: the store's migration ran out of time")
)

// schema is pgstore's tables, recorded in idempotency_keys_schema.
var schema = pgmigrate.Schema{
	Lock:       0x6964656d73746f72, // "idemstor"
	Table:      "idempotency_keys_schema",
	Migrations: migrations,
	TooNew:     ErrSchemaTooNew,
	Objects:    []string{"idempotency_keys", "idempotency_keys_pkey", "idempotency_keys_created"},
	Indexes:    map[string]string{"idempotency_keys_created": createdIndex},
	Incomplete: ErrSchema,
	NoSchema:   ErrNoSchema,
	Privilege:  ErrPrivilege,
	Writes:     "idempotency_keys",
	Timeout:    ErrMigrationTimeout,
}

// migrate brings the schema to len(migrations) (see pgmigrate), each
// statement that reads it within o.QueryTimeout and the migration (the wait
// for another's, each migration's statement) within o.MigrationTimeout,
// and returns the name of the schema that holds the store.
func migrate(ctx context.Context, pool *pgxpool.Pool, o Options) (string, error) {
	name, err := schema.Migrate(ctx, pool, pgmigrate.Timeouts{Query: o.QueryTimeout, Migration: o.MigrationTimeout})
	if c := pgmigrate.Unreachable(err); c != nil {
		return "", fmt.Errorf("pgstore: %w", c)
	}
	if err != nil && !errors.Is(err, ErrSchemaTooNew) && !errors.Is(err, ErrSchema) && !errors.Is(err, ErrNoSchema) &&
		!errors.Is(err, ErrPrivilege) && !errors.Is(err, ErrMigrationTimeout) {
		return "", fmt.Errorf("pgstore: migrate: %w", pgmigrate.CacheHint(err))
	}
	return name, err
}

// statements are the store's SQL, its table qualified with the schema that
// Open or New found the store in: a statement that named it unqualified
// would find it through the search path of the connection it runs on,
// which may be another schema's, or a temporary table of the same name.
// They are built once per store.
type statements struct {
	claim, takeOver, save, release, exists, prune string
	taken, saved                                  string // see settle
}

// newStatements returns the statements on the store in schema name.
func newStatements(name string) statements {
	q := func(stmt string) string { return pgmigrate.Qualify(stmt, name) }
	return statements{
		claim:    q(claimSQL),
		takeOver: q(takeOverSQL),
		save:     q(saveSQL),
		release:  q(releaseSQL),
		exists:   q(existsSQL),
		taken:    q(takenSQL),
		saved:    q(savedSQL),
		prune:    q(pruneSQL),
	}
}

// createdIndex serves Prune: created by the first migration, and named to
// create it again when it is missing (see pgmigrate.Schema.Indexes).
const createdIndex = `CREATE INDEX idempotency_keys_created ON {schema}.idempotency_keys (created)`
