package keyjar

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
)

// MovedEvery is how often at most a key creation checks that the jar's
// files are still at its path.
const MovedEvery = movedEvery
const WALSizeLimit = walSizeLimit

// Commit describes one group commit, as the committer is about to COMMIT.
type Commit struct {
	Jobs        int  // writes in the transaction
	Durable     bool // holds a key creation
	Synchronous int  // the connection's PRAGMA synchronous: 1 NORMAL, 2 FULL
	FullFsync   int  // the connection's PRAGMA fullfsync and checkpoint_fullfsync: 2 when both are on
	Changes     int  // rows the transaction's last statement changed: SQL changes()
}

// Hooks are the test seams of OpenHooked.
type Hooks struct {
	// BeforeCommit, if not nil, runs in the committer before each COMMIT
	// and may block it.
	BeforeCommit func(Commit)
	// JobError, if not nil, runs before each job; an error fails the job as
	// if its statements had failed.
	JobError func() error
	// PruneBatch, if > 0, is the number of rows Prune deletes per
	// transaction.
	PruneBatch int
	// SyncFile, if not nil, runs when Close is about to fsync the file at
	// path.
	SyncFile func(path string)
	// Checked, if not nil, runs once Open has checked or created the file
	// at path, before SQLite opens it.
	Checked func(path string)
	// Abandoned, if not nil, runs once an opening that Open gave up on
	// (its context ended) has ended, the jar it opened, if any, closed.
	Abandoned func()
}

// OpenHooked is Open with test seams.
func OpenHooked(ctx context.Context, path string, opts *Options, h Hooks) (*Jar, error) {
	in := hooks{pruneBatch: h.PruneBatch, jobError: h.JobError, syncFile: h.SyncFile, checked: h.Checked, abandoned: h.Abandoned}
	if h.BeforeCommit != nil {
		in.beforeCommit = func(tx *sql.Tx, jobs int, durable bool) {
			c := Commit{Jobs: jobs, Durable: durable}
			if err := tx.QueryRow("SELECT changes()").Scan(&c.Changes); err != nil {
				panic(err)
			}
			if err := tx.QueryRow("PRAGMA synchronous").Scan(&c.Synchronous); err != nil {
				panic(err)
			}
			var full, checkpoint int
			if err := tx.QueryRow("PRAGMA fullfsync").Scan(&full); err != nil {
				panic(err)
			}
			if err := tx.QueryRow("PRAGMA checkpoint_fullfsync").Scan(&checkpoint); err != nil {
				panic(err)
			}
			c.FullFsync = full + checkpoint
			h.BeforeCommit(c)
		}
	}
	return open(ctx, path, opts, in)
}

// SetMaxPageCount sets the writer connection's PRAGMA max_page_count: a
// write that needs more pages fails as on a full disk (SQLITE_FULL).
func SetMaxPageCount(ctx context.Context, j *Jar, pages int) error {
	_, err := j.wconn.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages))
	return err
}

// PageCount reads the writer connection's PRAGMA page_count into pages.
func PageCount(ctx context.Context, j *Jar, pages *int) error {
	return j.wconn.QueryRowContext(ctx, "PRAGMA page_count").Scan(pages)
}

// BusyTimeouts reads PRAGMA busy_timeout, in milliseconds, on the writer's
// connection and on one of the readers'.
func BusyTimeouts(ctx context.Context, j *Jar) (writer, reader int, err error) {
	err = j.wconn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&writer)
	if err == nil {
		err = j.reader.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&reader)
	}
	return writer, reader, err
}

// ListPlan returns SQLite's plan of the statement List runs for f (EXPLAIN
// QUERY PLAN), one line per step, or nil when List runs none.
func ListPlan(ctx context.Context, j *Jar, f idem.Filter) ([]string, error) {
	query, args, none := listQuery(f)
	if none {
		return nil, nil
	}
	rows, err := j.reader.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		plan = append(plan, detail)
	}
	return plan, rows.Err()
}

// SchemaV1 is the schema of a jar of version 1, which upgrades bring to
// the current one; ApplicationID marks a jar file.
const (
	SchemaV1      = schema
	ApplicationID = applicationID
)
