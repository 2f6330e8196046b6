package pgjar

import "github.com/jackc/pgx/v5/pgxpool"

// PoolOf returns j's connection pool.
func PoolOf(j *Jar) *pgxpool.Pool { return j.pool }
