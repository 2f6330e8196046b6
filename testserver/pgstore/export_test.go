package pgstore

import (
	"context"

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
	_, err := old.Migrate(ctx, pool)
	return err
}

// OnSchema returns a Store on pool that uses the store's table in schema
// name as it finds it, migrating nothing: the store of an earlier version,
// whose statements were this one's.
func OnSchema(pool *pgxpool.Pool, name string) *Store {
	return &Store{pool: pool, timeout: DefaultQueryTimeout, batch: DefaultPruneBatch, sql: newStatements(name)}
}
