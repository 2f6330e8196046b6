package pgjar

import "github.com/jackc/pgx/v5/pgxpool"

// PoolOf returns j's connection pool.
func PoolOf(j *Jar) *pgxpool.Pool { return j.pool }

// HoldApplier makes j's applier call hook with the size of each batch
// before it sends it.
func HoldApplier(j *Jar, hook func(n int)) { j.beforeApply.Store(&hook) }

// MigrateLock is the advisory lock that serialises migrations.
var MigrateLock = schema.Lock

// ListStatements returns the statements of List: from the start, after a
// position, and after a position at the zero time.
func ListStatements(j *Jar) (list, after, afterZero string) {
	return j.sql.list, j.sql.listAfter, j.sql.listAfterZero
}
