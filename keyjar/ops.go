package keyjar

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/secrethdr"
)

// Begin implements idem.Jar: it returns op's record, creating it from r
// (created=true) when the jar holds none or holds one in StateAbandoned. A
// created record is on stable storage before Begin returns. Headers that
// idem.SecretHeader names are kept by name alone, without their values
// (see idem.Record.Withheld); an empty State means StatePending.
//
// Begin returns ErrInvalid for a record without Op or Key, with an invalid
// State or with a time that cannot be stored, and ErrMoved, committing
// nothing, when the jar's file or its -wal file is no longer at its path
// (checked at most every tenth of a second: see File in the package doc).
// When ctx ends before the jar's committer takes the write, Begin returns
// ctx's error and creates nothing; once it has taken it, Begin waits for
// its commit and returns its result, as Acquire, Update, Forget, ForgetKey
// and Prune do.
func (j *Jar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	if err := j.writable(); err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	if r.Op == "" || r.Key == "" {
		return idem.Record{}, false, fmt.Errorf("%w: empty Op or Key (op %q)", ErrInvalid, r.Op)
	}
	if r.State == "" {
		r.State = idem.StatePending
	}
	if !r.State.Valid() {
		return idem.Record{}, false, fmt.Errorf("%w: op %q: state %q", ErrInvalid, r.Op, r.State)
	}
	r.Header = secrethdr.Withhold(r.Header)
	w, err := encode(r)
	if err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	var (
		rec     idem.Record
		created bool
	)
	err = j.write(ctx, true, func(ctx context.Context, tx *sql.Tx) (err error) {
		res, err := tx.StmtContext(ctx, j.stmts.begin).ExecContext(ctx,
			r.Op, r.Key, r.Fingerprint, string(r.State), r.Method, r.URL, w.header, r.Body, r.BodySize,
			w.created, w.updated, r.Attempts, r.LastStatus, r.LastError, w.next, r.Note, r.Holder, w.leaseUntil,
			string(idem.StateAbandoned))
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		created = err == nil && n == 1
		if err == nil && n == 0 { // an existing record, left as it is
			rec, err = getRecord(tx.StmtContext(ctx, j.stmts.get).QueryRowContext(ctx, r.Op))
		}
		return err
	})
	if err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	if created {
		// What was written, as Get reads it back, without reading it back.
		rec = r
		rec.Body = bytes.Clone(r.Body)
		rec.Created, rec.Updated = stored(r.Created), stored(r.Updated)
		rec.NextAttempt, rec.LeaseUntil = stored(r.NextAttempt), stored(r.LeaseUntil)
	}
	return rec, created, nil
}

// stored returns t as the jar reads it back: in UTC, without a monotonic
// clock reading.
func stored(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.Unix(0, t.UnixNano()).UTC()
}

// Get implements idem.Jar. It returns idem.ErrNotFound for an unknown op.
func (j *Jar) Get(ctx context.Context, op string) (idem.Record, error) {
	if err := j.readable(ctx); err != nil {
		return idem.Record{}, err
	}
	if err := j.settle(ctx); err != nil {
		return idem.Record{}, wrapf(err, "get %q", op)
	}
	r, err := getRecord(j.reader.QueryRowContext(ctx, "SELECT "+columns+" FROM operations WHERE op = ?", op))
	if err != nil {
		return idem.Record{}, j.readError("get", op, err)
	}
	return r, nil
}

// Acquire implements idem.Jar: it takes op's lease for holder until now+ttl
// when the lease is free, held by holder or expired at now. Otherwise it
// returns the record and idem.ErrLeased. It returns idem.ErrNotFound for an
// unknown op.
func (j *Jar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	until := now.Add(ttl)
	if err := j.writable(); err != nil {
		return idem.Record{}, wrapf(err, "acquire %q", op)
	}
	if _, err := nanos("lease end", until); err != nil {
		return idem.Record{}, wrapf(err, "acquire %q", op)
	}
	return j.modify(ctx, "acquire", op, func(r *idem.Record) error {
		if !r.CanLease(holder, now) {
			return idem.ErrLeased
		}
		r.Holder, r.LeaseUntil = holder, until
		return nil
	})
}

// Update implements idem.Jar: it applies c to op. When holder is not "" and
// op's lease is no longer held by holder, nothing changes and Update returns
// the current record and idem.ErrLeaseLost. It returns idem.ErrNotFound for
// an unknown op, and ErrInvalid for an invalid c.State or a time that
// cannot be stored. The change is visible to every reader when Update
// returns, and durable at the next key creation, checkpoint or Close; a
// change to StateAbandoned is durable when Update returns, as a key
// creation is: lost in a crash of the machine, it would leave pending an
// operation that its caller established did not happen, which a resume
// would send.
func (j *Jar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	if err := j.writable(); err != nil {
		return idem.Record{}, wrapf(err, "update %q", op)
	}
	args, err := changeArgs(op, holder, c)
	if err != nil {
		return idem.Record{}, wrapf(err, "update %q", op)
	}
	var (
		rec     idem.Record
		refusal error
	)
	err = j.write(ctx, c.State == idem.StateAbandoned, func(ctx context.Context, tx *sql.Tx) (err error) {
		refusal = nil
		rec, err = scanRecord(tx.StmtContext(ctx, j.stmts.update).QueryRowContext(ctx, args...))
		if err != sql.ErrNoRows {
			return err
		}
		// Unknown, or fenced off: tell which.
		rec, err = getRecord(tx.StmtContext(ctx, j.stmts.get).QueryRowContext(ctx, op))
		if err == idem.ErrNotFound {
			refusal, err = err, nil
		} else if err == nil {
			refusal = idem.ErrLeaseLost
		}
		return err
	})
	if err != nil {
		// rec is not read: it may hold what a job whose transaction
		// failed read.
		return idem.Record{}, wrapf(err, "update %q", op)
	}
	if refusal != nil {
		return rec, wrapf(refusal, "update %q", op)
	}
	return rec, nil
}

// Defer implements idem.Deferrer: it queues the change Update would make and
// returns without waiting for it. The change is written in the next
// transaction, in order with the jar's other writes; Get and List wait for
// the changes deferred before they were called, so what a goroutine deferred
// it reads back. A change that is fenced off, whose op is unknown, or whose
// transaction fails is dropped (Options.Logger hears of the last, and Close
// counts it: see idem.ErrDropped). Defer returns ErrInvalid for an invalid
// change and ErrClosed after Close; Close writes every change deferred
// before it. A deferred change is not synced of its own, a change to
// StateAbandoned included: abandon with Update, which syncs it.
func (j *Jar) Defer(op, holder string, c idem.Change) error {
	err := j.writable()
	var args []any
	if err == nil {
		args, err = changeArgs(op, holder, c)
	}
	if err == nil {
		err = j.enqueue(context.Background(), &job{ctx: context.Background(), deferred: true, op: op,
			run: func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.StmtContext(ctx, j.stmts.deferred).ExecContext(ctx, args...)
				return err
			}})
	}
	if err != nil {
		return wrapf(err, "defer %q", op)
	}
	return nil
}

// changeArgs checks c and returns the arguments of stmts.update and
// stmts.deferred, which apply it as idem.Change.Apply does.
func changeArgs(op, holder string, c idem.Change) ([]any, error) {
	if c.State != "" && !c.State.Valid() {
		return nil, fmt.Errorf("%w: state %q", ErrInvalid, c.State)
	}
	now, err := nanos("Now", c.Now)
	if err != nil {
		return nil, err
	}
	next, err := nanos("NextAttempt", c.NextAttempt)
	if err != nil {
		return nil, err
	}
	return []any{string(c.State), now, c.Attempts, c.LastStatus, c.LastError, next, c.Note, c.Release, op, holder}, nil
}

// modify reads op's record and applies change to it in one transaction.
// When change refuses (returns an error), nothing is written and modify
// returns the record as it is with that error.
func (j *Jar) modify(ctx context.Context, verb, op string, change func(r *idem.Record) error) (idem.Record, error) {
	var (
		rec     idem.Record
		refusal error
	)
	err := j.write(ctx, false, func(ctx context.Context, tx *sql.Tx) (err error) {
		rec, refusal = idem.Record{}, nil
		rec, err = getRecord(tx.StmtContext(ctx, j.stmts.get).QueryRowContext(ctx, op))
		if err == idem.ErrNotFound {
			refusal = err
			return nil
		}
		if err != nil {
			return err
		}
		if refusal = change(&rec); refusal != nil {
			return nil
		}
		return save(ctx, tx.StmtContext(ctx, j.stmts.save), rec)
	})
	if err != nil {
		// rec is not read: it may hold what a job whose transaction
		// failed read.
		return idem.Record{}, wrapf(err, "%s %q", verb, op)
	}
	if refusal != nil {
		return rec, wrapf(refusal, "%s %q", verb, op)
	}
	return rec, nil
}

// save writes the fields of r that Acquire and Update change, with the
// statement stmts.save.
func save(ctx context.Context, stmt *sql.Stmt, r idem.Record) error {
	w, err := encode(r)
	if err != nil {
		return err
	}
	_, err = stmt.ExecContext(ctx,
		string(r.State), w.updated, r.Attempts, r.LastStatus, r.LastError, w.next, r.Note, r.Holder, w.leaseUntil, r.Op)
	return err
}

// List returns the records that pass f, oldest Created first (the zero
// time first), then by Op, bytewise. A page after f.After reads from the
// index on (created, op), or with a State from the one on (state, created,
// op), where the cursor lies, and stops at f.Limit: its cost is the
// page's, not the jar's, and a State filter reads the records of that
// state alone; a cursor at the zero time also reads those created at the
// zero time before it.
func (j *Jar) List(ctx context.Context, f idem.Filter) ([]idem.Record, error) {
	if err := j.readable(ctx); err != nil {
		return nil, err
	}
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("%w: list: Filter.State %q is no state", ErrInvalid, f.State)
	}
	if err := j.settle(ctx); err != nil {
		return nil, wrapf(err, "list")
	}
	query, args, none := listQuery(f)
	if none {
		return nil, nil
	}
	return j.records(ctx, "list", query, args...)
}

// The statements of List: every record, the records after a position
// (?3 nanoseconds, ?4 name), and those after a position at the zero time,
// which is NULL and sorts first. ?1 is the state ("": all), ?2 the limit.
// Each has a twin for a State, "state = ?1", which List runs when f.State
// is set: SQLite plans a statement once, for every ?1, and the condition
// of the first three, true of every record when ?1 is empty, cannot use
// the index on (state, created, op), so that a walk of the few pending
// records among many done ones would read them all.
const (
	listSQL = "SELECT " + columns + ` FROM operations
		WHERE ?1 = '' OR state = ?1 ORDER BY created, op LIMIT ?2`
	listAfterSQL = "SELECT " + columns + ` FROM operations
		WHERE (created, op) > (?3, ?4) AND (?1 = '' OR state = ?1) ORDER BY created, op LIMIT ?2`
	listAfterZeroSQL = "SELECT " + columns + ` FROM operations
		WHERE (created IS NOT NULL OR op > ?4) AND (?1 = '' OR state = ?1) ORDER BY created, op LIMIT ?2`

	listStateSQL = "SELECT " + columns + ` FROM operations
		WHERE state = ?1 ORDER BY created, op LIMIT ?2`
	listStateAfterSQL = "SELECT " + columns + ` FROM operations
		WHERE state = ?1 AND (created, op) > (?3, ?4) ORDER BY created, op LIMIT ?2`
	listStateAfterZeroSQL = "SELECT " + columns + ` FROM operations
		WHERE state = ?1 AND (created IS NOT NULL OR op > ?4) ORDER BY created, op LIMIT ?2`
)

// listQuery returns List's statement for f and its arguments, or none when
// no record can be after f.After: one past the last time the jar stores.
// A cursor before the first time it stores (1677) is the same as one at
// that time without a name; one before the zero time (the year 1), which
// nothing is, the same as none.
func listQuery(f idem.Filter) (query string, args []any, none bool) {
	limit := f.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	args = []any{string(f.State), limit}
	list, listAfter, listAfterZero := listSQL, listAfterSQL, listAfterZeroSQL
	if f.State != "" {
		list, listAfter, listAfterZero = listStateSQL, listStateAfterSQL, listStateAfterZeroSQL
	}
	after := f.After
	switch {
	case after.IsZero() || after.Created.Before(time.Time{}):
		return list, args, false
	case after.Created.IsZero():
		return listAfterZero, append(args, nil, after.Op), false
	case after.Created.After(time.Unix(0, math.MaxInt64)):
		return "", nil, true
	case after.Created.Before(time.Unix(0, math.MinInt64)):
		return listAfter, append(args, int64(math.MinInt64), ""), false
	}
	return listAfter, append(args, after.Created.UnixNano(), after.Op), false
}

// ByKey returns the records whose Key is key, oldest Created first, then
// by Op: usually one, more when a caller sent the same Idempotency-Key
// under several names. No index leads from keys to records, so it reads
// the whole jar, on SQLite's side; it is for tools such as idemctl, which
// look up the key a server logged, not for a request's path.
func (j *Jar) ByKey(ctx context.Context, key string) ([]idem.Record, error) {
	if err := j.readable(ctx); err != nil {
		return nil, err
	}
	if err := j.settle(ctx); err != nil {
		return nil, wrapf(err, "by key")
	}
	return j.records(ctx, "by key", "SELECT "+columns+` FROM operations
		WHERE key = ? ORDER BY created, op`, key)
}

// records runs a query of whole records on a reader connection.
func (j *Jar) records(ctx context.Context, verb, query string, args ...any) ([]idem.Record, error) {
	rows, err := j.reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, j.readError(verb, "", err)
	}
	defer rows.Close()
	var out []idem.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, j.readError(verb, "", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, j.readError(verb, "", err)
	}
	return out, nil
}

// Forget deletes op, whatever its state. It returns idem.ErrNotFound for an
// unknown op.
func (j *Jar) Forget(ctx context.Context, op string) error {
	return j.forget(ctx, "forget", op, j.stmts.forget, op)
}

// ForgetKey deletes op only if its record has key and is not pending, in
// one statement, so that a record Begin put in place of an abandoned one,
// under a new key, is kept (client.KeyForgetter). It returns
// idem.ErrNotFound for an unknown op and idem.ErrNotForgotten, deleting
// nothing, for a record with another key or in StatePending. It goes
// through the committer's queue as Forget does, after the changes deferred
// before it.
func (j *Jar) ForgetKey(ctx context.Context, op, key string) error {
	return j.forget(ctx, "forget key", op, j.stmts.forgetKey, op, key, string(idem.StatePending))
}

// AbandonKey moves op to idem.StateAbandoned, with note as its Note and now
// as its Updated, its lease released and its next attempt cleared, only if
// its record has key, is pending or reconcile, and its lease is free,
// expired at now or held by holder; in one statement that reads no other
// column, so that it abandons a record that does not decode
// (idem.RecordError), which Acquire and Update, reading it whole, refuse.
// The record keeps its other fields. It is for a tool (idemctl) that
// established that the operation did not happen and is not running; holder
// is "" but for a lease whose process is gone (idem.HolderGone). It is
// synced before it returns, as an Update to StateAbandoned is. It returns
// ErrInvalid for an empty note or a now that is zero or cannot be stored,
// idem.ErrNotFound for an unknown op and idem.ErrNotAbandoned, changing
// nothing, when the record's key, state or lease keep it.
func (j *Jar) AbandonKey(ctx context.Context, op, key, holder, note string, now time.Time) error {
	if err := j.writable(); err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	at, err := nanos("now", now)
	if err == nil && (at == nil || note == "") {
		err = fmt.Errorf("%w: a zero now or an empty note", ErrInvalid)
	}
	if err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	var refusal error
	err = j.write(ctx, true, func(ctx context.Context, tx *sql.Tx) error {
		refusal = nil
		res, err := tx.ExecContext(ctx, abandonKeySQL, note, at, op, key, holder)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil || n > 0 {
			return err
		}
		refusal, err = why(ctx, tx, op, idem.ErrNotAbandoned)
		return err
	})
	if err == nil {
		err = refusal
	}
	if err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	return nil
}

// abandonKeySQL is AbandonKey's UPDATE: ?1 note, ?2 now, ?3 op, ?4 key,
// ?5 holder. The lease's condition is idem.Record.CanLease's.
const abandonKeySQL = `
	UPDATE operations SET state = 'abandoned', note = ?1, updated = ?2, next_attempt = NULL,
		holder = '', lease_until = NULL
	WHERE op = ?3 AND key = ?4 AND state IN ('pending', 'reconcile')
		AND (holder = '' OR holder = ?5 OR lease_until IS NULL OR lease_until <= ?2)`

// forget runs stmt, a DELETE of op's row, with args. When it deletes
// nothing, a read in the same transaction tells why: idem.ErrNotFound
// when op has no record, idem.ErrNotForgotten when stmt's condition kept
// it.
func (j *Jar) forget(ctx context.Context, verb, op string, stmt *sql.Stmt, args ...any) error {
	var refusal error
	err := j.write(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		refusal = nil
		res, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil || n > 0 {
			return err
		}
		refusal, err = why(ctx, tx, op, idem.ErrNotForgotten)
		return err
	})
	if err == nil {
		err = refusal
	}
	if err != nil {
		return wrapf(err, "%s %q", verb, op)
	}
	return nil
}

// why tells why a statement on op changed nothing: refusal is
// idem.ErrNotFound when op has no record, otherwise refused. It reads
// whether op exists and nothing else, so that a record that does not
// decode (idem.RecordError) is refused as any other.
func why(ctx context.Context, tx *sql.Tx, op string, refused error) (refusal, err error) {
	var n int64
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM operations WHERE op = ?", op).Scan(&n); err != nil {
		return nil, err
	}
	if n == 0 {
		return idem.ErrNotFound, nil
	}
	return refused, nil
}

// allStates lists every idem.State, for Prune to pick the prunable ones.
var allStates = [...]idem.State{idem.StatePending, idem.StateDone, idem.StateFailed, idem.StateReconcile, idem.StateAbandoned}

// Prune deletes at most limit records whose state is idem.Prunable and that
// were last updated before before, and returns how many it deleted; limit
// <= 0 means no limit. Which records go first under a limit is not the
// least recently updated (pgjar's order): they go by state, then by last
// update. It deletes in transactions of at most 1000 rows, so
// neither memory nor the time the write lock is held grows with the number
// of rows deleted. When it fails part way, the count says how many are gone.
func (j *Jar) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	var states []idem.State
	for _, s := range allStates {
		if idem.Prunable(s) {
			states = append(states, s)
		}
	}
	b, _ := json.Marshal(states) // a []string cannot fail to marshal
	prunable := string(b)
	// A before outside what Unix nanoseconds hold is earlier or later than
	// any row.
	bound, all := int64(0), false
	zeroToo := time.Time{}.Before(before)
	if n := before.UnixNano(); time.Unix(0, n).Equal(before) {
		bound = n
	} else if before.Before(time.Unix(0, 0)) {
		bound = math.MinInt64
	} else {
		all = true
	}
	batch := pruneBatch
	if j.hooks.pruneBatch > 0 {
		batch = j.hooks.pruneBatch
	}
	total := 0
	for {
		n := batch
		if limit > 0 && limit-total < n {
			n = limit - total
		}
		var deleted int64
		err := j.write(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.StmtContext(ctx, j.stmts.prune).ExecContext(ctx, prunable, all, bound, zeroToo, n)
			if err != nil {
				return err
			}
			deleted, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, wrapf(err, "prune")
		}
		total += int(deleted)
		if deleted < int64(n) || (limit > 0 && total >= limit) {
			return total, nil
		}
	}
}

// readable checks that the jar is open and then the context, for the
// methods that read through the read-only pool.
func (j *Jar) readable(ctx context.Context) error {
	if err := j.open(); err != nil {
		return err
	}
	return ctx.Err()
}

// open returns ErrClosed once Close began: the methods check it before
// their arguments, their context included, so that a closed jar says it is
// closed whatever they are given. (enqueue checks again, under the same
// lock, as it queues.)
func (j *Jar) open() error {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.closed {
		return ErrClosed
	}
	return nil
}

// writable is open for the methods that write: it returns ErrClosed once
// Close began and then ErrReadOnly for a jar opened with ReadOnly, before
// those methods look at their arguments, so that a read-only jar says it
// is read-only whatever they are given.
func (j *Jar) writable() error {
	if err := j.open(); err != nil {
		return err
	}
	if j.readOnly {
		return ErrReadOnly
	}
	return nil
}

// readError is the error of a read that failed with err. A read that
// opened a new connection after the jar file moved finds nothing at the
// path, or another file: SQLite's error then names no cause, and the
// read's is ErrMoved, with SQLite's error after it.
func (j *Jar) readError(verb, op string, err error) error {
	if j.readable(context.Background()) == ErrClosed {
		err = ErrClosed // closed while reading
	} else if j.file != nil && isSQLiteError(err) {
		if merr := j.moved(false); errors.Is(merr, ErrMoved) {
			err = fmt.Errorf("%w (%w)", merr, err) // classified below
		}
	}
	if op != "" {
		return wrapf(j.damaged(err), "%s %q", verb, op)
	}
	return wrapf(j.damaged(err), "%s", verb)
}
