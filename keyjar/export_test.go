package keyjar

import (
	"context"
	"database/sql"
)

// Commit describes one group commit, as the committer is about to COMMIT.
type Commit struct {
	Jobs        int  // writes in the transaction
	Durable     bool // holds a key creation
	Synchronous int  // the connection's PRAGMA synchronous: 1 NORMAL, 2 FULL
}

// OpenHooked is Open with test seams: beforeCommit (if not nil) runs in the
// committer before each COMMIT and may block it; pruneBatch (if > 0) is the
// number of rows Prune deletes per transaction.
func OpenHooked(ctx context.Context, path string, opts *Options, beforeCommit func(Commit), pruneBatch int) (*Jar, error) {
	h := hooks{pruneBatch: pruneBatch}
	if beforeCommit != nil {
		h.beforeCommit = func(tx *sql.Tx, jobs int, durable bool) {
			c := Commit{Jobs: jobs, Durable: durable}
			if err := tx.QueryRow("PRAGMA synchronous").Scan(&c.Synchronous); err != nil {
				panic(err)
			}
			beforeCommit(c)
		}
	}
	return open(ctx, path, opts, h)
}
