package keyjar

import (
	"context"
	"database/sql"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/chanbatch"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/unwritten"
	sqlite3 "modernc.org/sqlite/lib"
)

// A job is one write waiting for the committer: run executes its statements
// inside the batch's transaction and keeps its result in the closure. An
// error from run is a database failure: the transaction is rolled back and
// the other jobs of the batch run again without the failed one, so run must
// set every result it keeps on each call. run gets the committer's context,
// never the caller's: interrupting a statement would roll back the whole
// batch.
type job struct {
	ctx      context.Context
	durable  bool                                        // a key creation: the batch commits with synchronous=FULL
	deferred bool                                        // queued by Defer: nobody waits for it
	op       string                                      // a deferred change's operation, for Options.Logger
	run      func(ctx context.Context, tx *sql.Tx) error // nil for a barrier
	err      error
	done     chan error   // buffered: the committer never blocks on it; nil when deferred
	state    atomic.Int32 // queued, taken or withdrawn: who decided the job's fate
}

// A job's states. A queued job is either taken by the committer, which then
// runs it and answers, or withdrawn, by its caller or by the committer,
// when the caller's context ended first: it is then never run.
const (
	queued int32 = iota
	taken
	withdrawn
)

// take reports whether the committer may run jb: it was taken already (a
// batch run again after a failed job), or its context is alive and its
// caller has not withdrawn it.
func (jb *job) take() bool {
	switch jb.state.Load() {
	case taken:
		return true
	case withdrawn:
		return false
	}
	if jb.ctx.Err() != nil {
		jb.state.CompareAndSwap(queued, withdrawn)
		return false
	}
	return jb.state.CompareAndSwap(queued, taken)
}

// write queues run for the committer and waits until the transaction it
// ran in has committed (for a durable job, with synchronous=FULL). When the
// caller's context ends first, a job the committer has not taken yet is
// withdrawn, never to run, and write returns the context's error; one it
// has taken is waited for, and write returns its result: what the caller is
// told is what the jar holds. That wait is for the batch's statements and
// its COMMIT, not for another process's lock, which the committer takes
// before it takes the jobs (but waits for again, up to Options.BusyTimeout,
// when a failed job makes it run the rest of the batch again), and stops
// waiting for once no job of the batch has a caller waiting (begin).
func (j *Jar) write(ctx context.Context, durable bool, run func(ctx context.Context, tx *sql.Tx) error) error {
	if err := j.writable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return unwritten.Mark(err)
	}
	jb := &job{ctx: ctx, durable: durable, run: run, done: make(chan error, 1)}
	if err := j.enqueue(ctx, jb); err != nil {
		if err == ctx.Err() {
			err = unwritten.Mark(err) // never queued
		}
		return err
	}
	select {
	case err := <-jb.done:
		return err
	case <-ctx.Done():
		if jb.state.CompareAndSwap(queued, withdrawn) || jb.state.Load() == withdrawn {
			// Withdrawn, by this call or by the committer: never run,
			// which the Transport reads to give back no lease that an
			// Acquire withdrawn would have taken.
			return unwritten.Mark(ctx.Err())
		}
		return <-jb.done // taken: its answer
	}
}

// enqueue hands jb to the committer. A deferred job is counted before it is
// queued, so that a read that follows its Defer knows to wait for it.
func (j *Jar) enqueue(ctx context.Context, jb *job) error {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.closed {
		return ErrClosed
	}
	if jb.deferred {
		j.deferQueued.Add(1)
	}
	select {
	case j.queue <- jb:
		return nil
	case <-ctx.Done():
		if jb.deferred {
			j.deferQueued.Add(^uint64(0))
		}
		return ctx.Err()
	}
}

// settle waits until every change deferred before it was called is
// written: the reads (Get, List) see what the calling goroutine deferred.
// It queues an empty job behind them, when any is still queued.
func (j *Jar) settle(ctx context.Context) error {
	if j.deferDone.Load() >= j.deferQueued.Load() {
		return nil
	}
	return j.write(ctx, false, nil)
}

// commitLoop is the single committer: it owns the writer connection, takes
// every job queued at the moment (up to maxBatch) into one transaction,
// commits once, and only then answers the callers. Jobs that arrive during
// a commit form the next batch, so concurrent callers share the fsync.
//
// A batch of deferred changes alone, which nobody waits for, waits up to
// deferWait for another job and rides in its transaction: a caller that
// defers its outcome and then begins its next operation pays for one
// transaction, not two.
func (j *Jar) commitLoop() {
	defer close(j.done)
	batch := make([]*job, 0, j.maxBatch)
	syncMode := "" // the writer's current synchronous setting; "" is unknown
	for first := range j.queue {
		batch = chanbatch.Drain(j.queue, append(batch[:0], first), j.maxBatch)
		if len(batch) < j.maxBatch && allDeferred(batch) {
			timer := time.NewTimer(deferWait)
			select {
			case jb, ok := <-j.queue:
				if ok {
					batch = chanbatch.Drain(j.queue, append(batch, jb), j.maxBatch)
				}
			case <-timer.C:
			}
			timer.Stop()
		}
		syncMode = j.commit(batch, syncMode)
		for i, jb := range batch {
			if jb.deferred {
				j.dropped(jb)
				j.deferDone.Add(1)
			}
			if jb.done != nil { // nil for a deferred change: nobody waits
				jb.done <- jb.err
			}
			batch[i] = nil
		}
	}
}

// dropped logs jb, a deferred change, to Options.Logger when its
// transaction failed: nobody else learns that it was not written.
func (j *Jar) dropped(jb *job) {
	if jb.err == nil {
		return
	}
	j.drops.Add(jb.err)
	if j.logger == nil {
		return
	}
	j.logger.LogAttrs(context.Background(), slog.LevelWarn, "keyjar: a deferred change was not written; the operation stays as it was",
		slog.String("op", jb.op), slog.String("err", dsn.MaskPasswords(jb.err.Error())))
}

// movedEvery is how often at most the committer checks that the jar's
// files are still at its path (checkMoved). Each check, two stats, made
// for every key creation, took a Begin 60 µs longer at 1 caller (+15 %:
// the stats themselves 14 µs, beside SQLite's syscalls), where a Begin in
// the tenth of a second after a move is all that is left unchecked.
const movedEvery = 100 * time.Millisecond

// checkMoved returns ErrMoved, from then on, once the jar's file or its
// -wal file is no longer at its path (moved), which it checks on the
// jar's first key creation and then at most every movedEvery. Only the
// committer calls it.
func (j *Jar) checkMoved() error {
	if j.movedErr == nil && (j.checkedAt.IsZero() || time.Since(j.checkedAt) >= movedEvery) {
		j.movedErr = j.moved(true)
		j.checkedAt = time.Now()
	}
	return j.movedErr
}

// deferWait is how long deferred changes wait for company before they
// commit alone: what another process sees of them lags by at most this.
const deferWait = 2 * time.Millisecond

func allDeferred(batch []*job) bool {
	for _, jb := range batch {
		if !jb.deferred {
			return false
		}
	}
	return true
}

// commit runs batch in one IMMEDIATE transaction and sets each job's err.
// It returns the connection's synchronous setting afterwards.
func (j *Jar) commit(batch []*job, syncMode string) string {
	ctx := context.Background()
	fail := func(err error) {
		err = j.damaged(err)
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
	live := append([]*job(nil), batch...)
	// Each round either commits or drops the job that failed: at most
	// len(batch) rounds.
	for len(live) > 0 {
		tx, err := j.begin(ctx, live)
		if err != nil {
			fail(err)
			return syncMode
		}
		failed := -1
		for i, jb := range live {
			if jb.err != nil {
				continue // withdrawn, or failed in an earlier round
			}
			if !jb.take() {
				jb.err = unwritten.Mark(jb.ctx.Err()) // its caller's context ended: skipped, never run
				continue
			}
			if err := j.runJob(ctx, tx, jb); err != nil {
				jb.err = j.damaged(err)
				failed = i
				break
			}
		}
		if failed >= 0 {
			tx.Rollback()
			live = append(live[:failed], live[failed+1:]...)
			continue
		}
		if h := j.hooks.beforeCommit; h != nil {
			n := 0
			for _, jb := range live {
				if jb.err == nil {
					n++
				}
			}
			h(tx, n, durable)
		}
		if durable {
			// A key is durable only in the files at the jar's path: one
			// committed to a file that moved would go where no restart
			// finds it.
			if err := j.checkMoved(); err != nil {
				tx.Rollback()
				fail(err)
				return syncMode
			}
		}
		if err := tx.Commit(); err != nil {
			fail(err)
			j.overwriteFailed(ctx)
		}
		return syncMode
	}
	return syncMode
}

// busySlice is the longest one BEGIN IMMEDIATE of the committer waits for
// another process's write lock (the writer's busy_timeout) before begin
// looks whether anyone still waits for the batch: SQLite's busy handler
// watches no context.
const busySlice = 100 * time.Millisecond

// begin begins the IMMEDIATE transaction (_txlock) of the jobs live. While
// another process holds the write lock, it waits for it up to
// Options.BusyTimeout, as SQLite's busy handler would, but in slices of
// busySlice, and gives up between two, with SQLite's SQLITE_BUSY
// (ErrLocked), once none of live has a caller waiting for it: each was
// withdrawn, or its caller's context ended (a deferred change's never
// does). A Close that follows a write whose context ended (a command
// interrupted) then does not wait out BusyTimeout for a lock that nothing
// needs.
func (j *Jar) begin(ctx context.Context, live []*job) (*sql.Tx, error) {
	deadline := time.Now().Add(j.busyTimeout)
	for {
		tx, err := j.wconn.BeginTx(ctx, nil)
		if err == nil || !isSQLiteCode(err, sqlite3.SQLITE_BUSY) || !time.Now().Before(deadline) || !awaited(live) {
			return tx, err
		}
	}
}

// awaited reports whether a job of live may still be run: not failed,
// withdrawn, or of a caller whose context ended.
func awaited(live []*job) bool {
	for _, jb := range live {
		if jb.err == nil && jb.state.Load() != withdrawn && jb.ctx.Err() == nil {
			return true
		}
	}
	return false
}

// overwriteFailed commits one page after a COMMIT that failed. SQLite may
// have written that transaction's frames to the -wal file, its commit
// frame included, before failing to index them in the -shm file (which
// must grow, on a full disk) or to sync them. It then rolls back in
// memory, but the frames stay, after the last frame committed: the next
// program to open the jar after a crash, or after a Close that cannot
// empty the WAL (a full disk), recovers them whole, and would hold keys
// whose Begin failed, which a resume would send. The next commit writes
// its frames over them, and so breaks the chain of checksums that a
// recovery follows: overwriteFailed commits at once, under the write lock,
// the user_version it reads. Its error is of no use: where it failed,
// the WAL's next commit overwrites them.
func (j *Jar) overwriteFailed(ctx context.Context) {
	tx, err := j.wconn.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer tx.Rollback()
	var version int64
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return
	}
	if _, err := tx.ExecContext(ctx, "PRAGMA user_version = "+strconv.FormatInt(version, 10)); err != nil {
		return
	}
	tx.Commit()
}

func (j *Jar) runJob(ctx context.Context, tx *sql.Tx, jb *job) error {
	if jb.run == nil {
		return nil // a barrier
	}
	if h := j.hooks.jobError; h != nil {
		if err := h(); err != nil {
			return err
		}
	}
	return jb.run(ctx, tx)
}
