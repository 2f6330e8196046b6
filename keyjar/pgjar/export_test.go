package pgjar

import (
	"context"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolOf returns j's connection pool.
func PoolOf(j *Jar) *pgxpool.Pool { return j.pool }

// HoldApplier makes j's applier call hook with the size of each batch
// before it sends it.
func HoldApplier(j *Jar, hook func(n int)) { j.beforeApply.Store(&hook) }

// MigrateLock is the advisory lock that serialises migrations.
var MigrateLock = schema.Lock

// ListQuery returns the statement List runs for f and its arguments, or
// none when it runs none.
func ListQuery(j *Jar, f idem.Filter) (query string, args []any, none bool) { return j.listQuery(f) }

// MigrateToV1 brings the database of pool to version 1 of the jar's
// schema, as the package did when 1 was its latest: migrations[:1], whose
// objects were those of version 2 but its index on (state, created, op).
func MigrateToV1(ctx context.Context, pool *pgxpool.Pool) error {
	old := schema
	old.Migrations = migrations[:1]
	old.Objects = []string{"idem_operations", "idem_operations_pkey", "idem_operations_by_created", "idem_operations_by_state"}
	_, err := old.Migrate(ctx, pool, pgmigrate.Timeouts{})
	return err
}
