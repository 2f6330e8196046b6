package pgjar

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chanbatch"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/reconnect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Bounds of the deferred changes.
const (
	// deferBatch is the most changes the applier sends in one round trip.
	deferBatch = 64
	// deferQueue is how many changes may wait for the applier before Defer
	// waits for room: a database that falls behind slows Defer down rather
	// than letting the queue grow without bound.
	deferQueue = 1024
)

// deferred is one change queued by Defer: the arguments of updateSQL, and
// whether the change is replayable.
type deferred struct {
	op         string
	args       []any
	replayable bool
}

// Defer implements idem.Deferrer: it queues the change Update(ctx, op,
// holder, c) would make and returns without waiting for it. The jar's
// applier sends the queued changes in the order they were deferred, up to
// 64 in one round trip, each as the fenced UPDATE that Update runs. A
// change that is fenced off (holder no longer holds the lease), whose op is
// unknown, or that a database error or timeout loses, is dropped: the record
// stays as it was (Options.Logger hears of one lost to an error, and Close
// counts it: see idem.ErrDropped). One whose connection to the server was lost is sent
// again first, for a bounded time (see the package documentation). Defer
// waits only when 1024 changes are already queued. Every batch commits as
// Update commits its changes, with synchronous_commit=off unless the DSN
// sets it, a change to StateAbandoned included: abandon with Update, which
// commits it as Begin does, what a crash of the server must not take back
// to pending.
//
// Begin, Get, Acquire, Update, Forget, ForgetKey and AbandonKey on op, and List and
// Prune, first wait (within their context) for the changes deferred on the
// same Jar before they were called, so that they observe them; methods on
// other operations do not wait. Close applies every change deferred before it.
//
// Defer returns ErrInvalid for the change Update would refuse as invalid
// (see ErrInvalid), and ErrClosed after Close.
func (j *Jar) Defer(op, holder string, c idem.Change) error {
	args, err := j.changeArgs(op, holder, c)
	if err == nil {
		err = j.enqueue(deferred{op: op, args: args, replayable: replayable(holder, c)})
	}
	if err != nil {
		return wrapf(err, "defer %q", op)
	}
	return nil
}

// replayable reports whether applying the change Update(ctx, op, holder,
// c) would make twice applies it once: it is fenced by a holder, and
// releases the lease (a second run is fenced off) or adds no attempts (a
// second run writes the same values).
func replayable(holder string, c idem.Change) bool {
	return holder != "" && (c.Release || c.Attempts == 0)
}

// enqueue hands d to the applier. It is counted, as pending on its op and
// in deferQueued, before it is queued, so that a method called after Defer
// returned knows to wait for it.
func (j *Jar) enqueue(d deferred) error {
	j.queueMu.RLock()
	defer j.queueMu.RUnlock()
	if j.closed.Load() {
		return ErrClosed
	}
	j.pendingMu.Lock()
	j.pending[d.op]++
	j.pendingMu.Unlock()
	j.deferQueued.Add(1)
	j.queue <- d // the applier runs until Close, which waits for queueMu
	return nil
}

// settle waits until the changes deferred before it was called are applied:
// those on op, or every one when op is "". It returns ctx's error when ctx
// ends first. With nothing queued it costs two atomic loads.
func (j *Jar) settle(ctx context.Context, op string) error {
	target := j.deferQueued.Load()
	done := j.deferDone.Load()
	if done >= target {
		return nil
	}
	// Every batch applies at least one change: after target-done batches
	// deferDone has reached target, and the last pass returns.
	for range target - done + 1 {
		j.pendingMu.Lock()
		wait := j.deferDone.Load() < target && (op == "" || j.pending[op] > 0)
		progress := j.progress
		j.pendingMu.Unlock()
		if !wait {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// applyLoop is the applier, the one goroutine that writes deferred changes.
// It takes what is queued at the moment, up to deferBatch changes, sends it
// in one round trip, and then counts it applied. It exits when Close has
// closed the queue and every change in it is applied.
func (j *Jar) applyLoop() {
	defer close(j.applied)
	batch := make([]deferred, 0, deferBatch)
	for first := range j.queue {
		batch = chanbatch.Drain(j.queue, append(batch[:0], first), deferBatch)
		j.apply(batch)
		j.pendingMu.Lock()
		for _, d := range batch {
			if j.pending[d.op]--; j.pending[d.op] == 0 {
				delete(j.pending, d.op)
			}
		}
		j.deferDone.Add(uint64(len(batch)))
		close(j.progress)
		j.progress = make(chan struct{})
		j.pendingMu.Unlock()
		clear(batch) // let the arguments go
	}
}

// apply sends batch as one pgx.Batch: one round trip and one implicit
// transaction, committed as Update commits. Its changes are sorted by op
// (stably: the changes to one op keep their order), so that the appliers of
// two processes lock rows in the same order and cannot deadlock. Its
// context is bounded as one statement's is (see Options.QueryTimeout). A
// lost connection is retried (see deliver). Another error loses the batch,
// which the Deferrer contract allows: the records stay as they were. But
// when the database refused one change for its data (an integer out of
// range, say), the others are sent again one by one, so that only that
// change is lost: a batch that holds such a change never commits, so none
// of its changes was applied, whatever an earlier attempt's fate.
func (j *Jar) apply(batch []deferred) {
	if hook := j.beforeApply.Load(); hook != nil {
		(*hook)(len(batch))
	}
	slices.SortStableFunc(batch, func(a, b deferred) int { return strings.Compare(a.op, b.op) })
	left, err := j.deliver(batch)
	if len(left) > 1 && refusedData(err) {
		for i := range left {
			if _, _, _, err := j.send(left[i : i+1]); err != nil {
				j.dropped(left[i], err) // dropped, as documented
			}
		}
		return
	}
	if err != nil {
		for _, d := range left {
			j.dropped(d, err)
		}
	}
}

// dropped logs d, a deferred change dropped on err (not applied, or, its
// answer lost, perhaps applied), to Options.Logger: nobody else learns of
// it.
func (j *Jar) dropped(d deferred, err error) {
	err = pgmigrate.CacheHint(pgmigrate.OneLine(err)) // one line, with a pooler's hint, as a call's error
	j.drops.Add(err)
	if j.logger != nil {
		j.logger.LogAttrs(context.Background(), slog.LevelWarn, "pgjar: a deferred change was dropped on an error; the operation may stay as it was",
			slog.String("op", d.op), slog.String("err", dsn.MaskPasswords(err.Error())))
	}
}

// deliver sends changes (see send) and, when the connection to the server
// was lost before the answer, sends them again on another connection, for
// up to twice the query timeout since the loss began (the first of the
// losses in a row: a server down for longer costs each later batch one
// attempt, until one gets through). A batch that was sent may have been
// applied: it is sent again with its replayable changes only, and the
// others are dropped (see dropped: they may have been applied, and sending
// them again could apply them twice). On an error it returns the changes it
// still held, none of them applied unless the error is a lost answer.
func (j *Jar) deliver(changes []deferred) (left []deferred, err error) {
	start := time.Now()
	lostConn, reset := false, false
	err = reconnect.Retry(context.Background(), j.outage.Until(start, 2*j.timeout), func() (bool, error) {
		sent, again, readOnly, err := j.send(changes)
		if readOnly && !reset {
			reset = true // the batch applied nothing: once more, on a new session
			return true, err
		}
		if lostConn = again; again && sent {
			kept := make([]deferred, 0, len(changes))
			for _, d := range changes {
				if d.replayable {
					kept = append(kept, d)
				} else {
					j.dropped(d, err)
				}
			}
			changes = kept
			again = len(changes) > 0
		}
		return again, err
	})
	j.outage.Note(start, lostConn)
	if err != nil {
		return changes, err
	}
	return nil, nil
}

// send sends changes as one pgx.Batch, under one statement's deadline. It
// reports whether the batch was sent (a connection was taken), whether an
// error is the loss of the connection (see reconnect.Lost), and whether it
// is its session refusing the batch as read-only (see reconnect.ReadOnly).
// The batch is one implicit transaction: refused, none of it was applied.
// Refused as a mix-up of pgx's prepared statements (see
// reconnect.Fallback), the changes are sent again at once on the same
// connection in pgx's exec mode, which a pgx.Batch takes from the pool's
// configuration alone: one statement each, in one transaction.
func (j *Jar) send(changes []deferred) (sent, lostConn, readOnly bool, err error) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(changes))}
	for _, d := range changes {
		b.Queue(j.sql.update, d.args...)
	}
	conn, ctx, done, err := j.conn(context.Background())
	if err != nil {
		return false, reconnect.Lost(context.Background(), nil, err), false, err
	}
	defer done()
	err = reconnect.Fallback(conn, func(c reconnect.Conn) error {
		if !c.Again() {
			return conn.SendBatch(ctx, b).Close()
		}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			for _, d := range changes {
				if _, err := tx.Exec(ctx, j.sql.update, c.Args(d.args...)...); err != nil {
					return err
				}
			}
			return nil
		})
	})
	lostConn = reconnect.Lost(ctx, conn, err)
	return true, lostConn, !lostConn && reconnect.ReadOnly(ctx, j.pool, conn, err), err
}

// refusedData reports whether err is the database refusing a statement for
// the data it was given (SQLSTATE class 22, data exception, or 23,
// integrity constraint violation), rather than failing to run it.
func refusedData(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}
