package keyjar

import (
	"context"
	"database/sql"
	"errors"
)

// A job is one write waiting for the committer: run executes its statements
// inside the batch's transaction and keeps its result in the closure. run
// gets the committer's context, never the caller's: interrupting a statement
// would roll back the whole batch. An
// error from run is a database failure; the job's statements are rolled back
// (to its savepoint) and the job fails, the others in the batch go on.
type job struct {
	ctx     context.Context
	durable bool // a key creation: the batch commits with synchronous=FULL
	run     func(ctx context.Context, tx *sql.Tx) error
	err     error
	done    chan error // buffered: the committer never blocks on it
}

// write queues run for the committer and waits until the transaction it
// ran in has committed (for a durable job, with synchronous=FULL). The
// caller's context only bounds the wait: a job whose context ended before
// the committer reached it is skipped, one already written stays written.
func (j *Jar) write(ctx context.Context, durable bool, run func(ctx context.Context, tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	jb := &job{ctx: ctx, durable: durable, run: run, done: make(chan error, 1)}
	j.mu.RLock()
	if j.closed {
		j.mu.RUnlock()
		return ErrClosed
	}
	select {
	case j.queue <- jb:
	case <-ctx.Done():
		j.mu.RUnlock()
		return ctx.Err()
	}
	j.mu.RUnlock()
	select {
	case err := <-jb.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// commitLoop is the single committer: it owns the writer connection, takes
// every job queued at the moment (up to maxBatch) into one transaction,
// commits once, and only then answers the callers. Jobs that arrive during
// a commit form the next batch, so concurrent callers share the fsync.
func (j *Jar) commitLoop() {
	defer close(j.done)
	batch := make([]*job, 0, j.maxBatch)
	syncMode := "" // the writer's current synchronous setting; "" is unknown
	for first := range j.queue {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < j.maxBatch {
			select {
			case jb, ok := <-j.queue:
				if !ok {
					break drain
				}
				batch = append(batch, jb)
			default:
				break drain
			}
		}
		syncMode = j.commit(batch, syncMode)
		for i, jb := range batch {
			jb.done <- jb.err
			batch[i] = nil
		}
	}
}

// commit runs batch in one IMMEDIATE transaction and sets each job's err.
// It returns the connection's synchronous setting afterwards.
func (j *Jar) commit(batch []*job, syncMode string) string {
	ctx := context.Background()
	fail := func(err error) {
		err = classify(err)
		for _, jb := range batch {
			if jb.err == nil {
				jb.err = err
			}
		}
	}
	durable := false
	for _, jb := range batch {
		durable = durable || jb.durable
	}
	want := "NORMAL"
	if durable {
		want = "FULL"
	}
	if want != syncMode {
		if _, err := j.wconn.ExecContext(ctx, "PRAGMA synchronous = "+want); err != nil {
			fail(err)
			return ""
		}
		syncMode = want
	}
	tx, err := j.wconn.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		fail(err)
		return syncMode
	}
	for _, jb := range batch {
		if err := jb.ctx.Err(); err != nil {
			jb.err = err
			continue
		}
		if _, err := tx.ExecContext(ctx, "SAVEPOINT job"); err != nil {
			tx.Rollback()
			fail(err)
			return syncMode
		}
		if err := jb.run(ctx, tx); err != nil {
			jb.err = classify(err)
			// SQLite rolls a whole transaction back on some errors (I/O,
			// disk full); then the savepoint is gone and so is the batch.
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO job"); rerr != nil {
				tx.Rollback()
				fail(errors.Join(err, rerr))
				return syncMode
			}
		}
		if _, err := tx.ExecContext(ctx, "RELEASE job"); err != nil {
			tx.Rollback()
			fail(err)
			return syncMode
		}
	}
	if h := j.hooks.beforeCommit; h != nil {
		h(tx, len(batch), durable)
	}
	if err := tx.Commit(); err != nil {
		fail(err)
	}
	return syncMode
}
