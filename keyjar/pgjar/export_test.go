package pgjar

import "github.com/jackc/pgx/v5/pgxpool"

// PoolOf returns j's connection pool.
func PoolOf(j *Jar) *pgxpool.Pool { return j.pool }

// HoldApplier makes j's applier call hook with the size of each batch
// before it sends it.
func HoldApplier(j *Jar, hook func(n int)) { j.beforeApply.Store(&hook) }

// MigrateLock is the advisory lock that serialises migrations.
var MigrateLock = schema.Lock
