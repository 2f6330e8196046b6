package keyjar

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/hdrjson"
	"modernc.org/sqlite"
)

const (
	// schemaVersion is the PRAGMA user_version this package writes and
	// reads: 1 for schema, plus one for each of upgrades.
	schemaVersion = 2
	// applicationID marks a SQLite file as a key jar ("idmj").
	applicationID = 0x69646d6a
	// serverApplicationID marks the reference server's database ("idms",
	// package testserver/sqlitestore), named in the error for its files.
	serverApplicationID = 0x69646d73
)

const schema = `
CREATE TABLE operations (
	op           TEXT PRIMARY KEY,
	key          TEXT NOT NULL,
	fingerprint  TEXT NOT NULL,
	state        TEXT NOT NULL,
	method       TEXT NOT NULL,
	url          TEXT NOT NULL,
	header       TEXT,              -- JSON object; NULL for a nil header
	body         BLOB,              -- NULL for a nil body
	body_size    INTEGER NOT NULL,
	created      INTEGER,           -- Unix nanoseconds; NULL for the zero time
	updated      INTEGER,
	attempts     INTEGER NOT NULL,
	last_status  INTEGER NOT NULL,
	last_error   TEXT NOT NULL,
	next_attempt INTEGER,
	note         TEXT NOT NULL,
	holder       TEXT NOT NULL,
	lease_until  INTEGER
) STRICT;
CREATE INDEX operations_by_created ON operations (created, op);
CREATE INDEX operations_by_state ON operations (state, updated);
`

// upgrades[v-1] brings a jar from schema version v to v+1; a new jar gets
// schema (version 1) and then each of them, so that it holds what an
// upgraded one does. Versions are only ever appended: a released upgrade
// is never edited.
var upgrades = []string{
	// 2: List with a State (client.Pending, idemctl list --status and
	// resume --all) reads the records of that state alone, in List's
	// order, instead of every record from operations_by_created.
	`CREATE INDEX operations_by_state_created ON operations (state, created, op)`,
}

// inspect returns the schema version of the jar, 0 when the database is
// new (empty), and fails with ErrCorrupt for a database of another program
// and with ErrVersion for a jar of a newer version.
func inspect(ctx context.Context, q querier) (version int, err error) {
	// One statement reads one snapshot, even outside a transaction: another
	// process may be creating the schema at this moment.
	var app, tables int
	err = q.QueryRowContext(ctx, `SELECT (SELECT application_id FROM pragma_application_id),
		(SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_schema)`).Scan(&app, &version, &tables)
	if err != nil {
		return 0, err
	}
	if app == 0 && version == 0 && tables == 0 {
		return 0, nil
	}
	if err := checkIDs(int32(app), int32(version), fmt.Sprintf(", %d tables", tables)); err != nil {
		return 0, err
	}
	// A jar of a version this package reads: its table has every column
	// this package reads (no upgrade has added one so far).
	var n int
	if err := q.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT "+columns+" FROM operations LIMIT 0)").Scan(&n); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return version, nil
}

// checkIDs refuses, by its PRAGMA application_id and user_version, a
// database that is not a jar of a schema version this package reads or
// upgrades: ErrCorrupt for another program's (about says more of it, for
// the message) and ErrVersion for a jar of a newer version. SQLite stores
// both as signed 32-bit integers.
func checkIDs(app, version int32, about string) error {
	switch {
	case app == serverApplicationID:
		return fmt.Errorf("%w: the reference server's database (idemserver, package testserver/sqlitestore, application_id %#x), not a client's key jar", ErrCorrupt, app)
	case app != applicationID:
		return fmt.Errorf("%w: a SQLite database of another program (application_id %#x%s)", ErrCorrupt, app, about)
	case version > schemaVersion:
		return fmt.Errorf("%w: version %d, this package reads up to %d", ErrVersion, version, schemaVersion)
	case version < 1:
		return fmt.Errorf("%w: unknown schema version %d (version 1 is the first)", ErrCorrupt, version)
	}
	// An older version is upgraded by a writable Open (migrate); a
	// read-only one reads it as it is, unless it lacks its -wal and -shm
	// files (see older).
	return nil
}

// older returns, for a read-only Open of a jar of an older schema version
// whose -wal or -shm file is missing, ErrOldVersion (which is ErrReadOnly
// too): the Open without ReadOnly that creates them upgrades the jar, a
// write the read-only Open does not make.
func older(version int) error {
	return fmt.Errorf("%w: the jar has schema version %d and its -wal or -shm file is missing: an Open without ReadOnly creates them and upgrades the jar to %d; open it once without ReadOnly to upgrade it",
		oldVersion{readOnly: true}, version, schemaVersion)
}

// notUpgraded returns, for an Open with MustExist of a jar of an older
// schema version, ErrOldVersion: MustExist does not upgrade it.
func notUpgraded(version int) error {
	return fmt.Errorf("%w: version %d, which an Open with MustExist does not upgrade to %d (after which a program built with an earlier version refuses the jar); open it without MustExist to upgrade it",
		ErrOldVersion, version, schemaVersion)
}

// look is inspect in a read (deferred) transaction, which takes no write
// lock: its statements read one snapshot, and another process's write
// transaction neither blocks it nor is blocked by it. (modernc.org/sqlite
// begins a ReadOnly transaction with a plain BEGIN, whatever _txlock says.)
func look(ctx context.Context, conn *sql.Conn) (version int, err error) {
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	return inspect(ctx, tx)
}

// migrate creates the schema in a new file, or upgrades that of a jar of an
// older version, in an IMMEDIATE transaction that looks again: another
// process may have created or upgraded it since look. The upgrade and the
// new version commit together, or neither does.
func (j *Jar) migrate(ctx context.Context) error {
	tx, err := j.wconn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	version, err := inspect(ctx, tx)
	if err != nil || version == schemaVersion {
		return err
	}
	if version == 0 {
		if _, err := tx.ExecContext(ctx, schema); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d", applicationID)); err != nil {
			return err
		}
		version = 1
	}
	for ; version < schemaVersion; version++ {
		if _, err := tx.ExecContext(ctx, upgrades[version-1]); err != nil {
			return fmt.Errorf("upgrade to schema version %d: %w", version+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return err
	}
	return tx.Commit()
}

// columns are the columns of operations in the order scanRecord reads them.
const columns = `op, key, fingerprint, state, method, url, header, body, body IS NOT NULL, body_size,
	created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until`

type scanner interface{ Scan(dest ...any) error }

func scanRecord(s scanner) (idem.Record, error) {
	var (
		r                                  idem.Record
		header                             sql.NullString
		hasBody                            bool
		created, updated, next, leaseUntil sql.NullInt64
	)
	err := s.Scan(&r.Op, &r.Key, &r.Fingerprint, &r.State, &r.Method, &r.URL, &header, &r.Body, &hasBody, &r.BodySize,
		&created, &updated, &r.Attempts, &r.LastStatus, &r.LastError, &next, &r.Note, &r.Holder, &leaseUntil)
	if err != nil && !readFailed(err) {
		// A value of another type than its column's: NULL in a NOT NULL
		// column, text in a number's. This package writes none.
		return idem.Record{}, fmt.Errorf("%w: a record does not read back: %w", ErrCorrupt, err)
	}
	if err != nil {
		return idem.Record{}, err
	}
	r.Created, r.Updated = fromNanos(created), fromNanos(updated)
	r.NextAttempt, r.LeaseUntil = fromNanos(next), fromNanos(leaseUntil)
	if !r.State.Valid() {
		// The table has no CHECK on state: another program may have
		// written one. What did decode, as for a header.
		r.Header, r.Body = nil, nil
		return idem.Record{}, &idem.RecordError{Record: r, Err: fmt.Errorf("%w: state of %q: %q is not an idem.State", ErrCorrupt, r.Op, r.State)}
	}
	if header.Valid {
		if r.Header, err = hdrjson.Unmarshal([]byte(header.String)); err != nil {
			// What did decode, for a tool to name it and read past it.
			r.Header, r.Body = nil, nil
			return idem.Record{}, &idem.RecordError{Record: r, Err: fmt.Errorf("%w: header of %q: %v", ErrCorrupt, r.Op, err)}
		}
		if r.Header == nil {
			r.Header = http.Header{}
		}
	}
	if hasBody && r.Body == nil {
		r.Body = []byte{} // the driver reads an empty blob as nil
	}
	return r, nil
}

// readFailed reports whether err, from a Scan, is the query's failure (no
// row, SQLite's error, the context, the connection) rather than a value
// that does not convert to its field, which database/sql reports as an
// error of no particular type.
func readFailed(err error) bool {
	var se *sqlite.Error
	return errors.Is(err, sql.ErrNoRows) || errors.As(err, &se) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn)
}

func fromNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// nanos encodes t as Unix nanoseconds, the zero time as NULL. A time that
// Unix nanoseconds cannot hold is an ErrInvalid.
func nanos(field string, t time.Time) (any, error) {
	if t.IsZero() {
		return nil, nil
	}
	n := t.UnixNano()
	if !time.Unix(0, n).Equal(t) {
		return nil, fmt.Errorf("%w: %s %v is outside the years 1678 to 2262", ErrInvalid, field, t)
	}
	return n, nil
}

// row is a record encoded for the operations table, in the order of
// columns without the computed "body IS NOT NULL".
type row struct {
	header                             any
	created, updated, next, leaseUntil any
}

func encode(r idem.Record) (row, error) {
	var w row
	var err error
	if r.Header != nil {
		b, err := hdrjson.Marshal(r.Header)
		if err != nil {
			return row{}, fmt.Errorf("%w: header: %v", ErrInvalid, err)
		}
		w.header = string(b)
	}
	if w.created, err = nanos("Created", r.Created); err != nil {
		return row{}, err
	}
	if w.updated, err = nanos("Updated", r.Updated); err != nil {
		return row{}, err
	}
	if w.next, err = nanos("NextAttempt", r.NextAttempt); err != nil {
		return row{}, err
	}
	if w.leaseUntil, err = nanos("LeaseUntil", r.LeaseUntil); err != nil {
		return row{}, err
	}
	return w, nil
}

// querier is what *sql.Conn, *sql.DB and *sql.Tx have in common.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// getRecord scans the record of a query for one op, or returns
// idem.ErrNotFound.
func getRecord(row *sql.Row) (idem.Record, error) {
	r, err := scanRecord(row)
	if err == sql.ErrNoRows {
		return idem.Record{}, idem.ErrNotFound
	}
	return r, err
}

// stmts are the writer's statements, prepared once.
type stmts struct {
	begin, get, save, update, deferred, forget, forgetKey, prune *sql.Stmt
}

// updateSQL applies an idem.Change as Change.Apply does, fenced by the
// holder when ?10 is not ”, in one statement that reads nothing back:
// ?1 state ("" keeps it), ?2 updated, ?3 attempts to add, ?4 last_status,
// ?5 last_error, ?6 next_attempt, ?7 note ("" keeps it), ?8 release,
// ?9 op, ?10 holder.
const updateSQL = `
	UPDATE operations SET state = CASE WHEN ?1 = '' THEN state ELSE ?1 END,
		updated = ?2, attempts = attempts + ?3, last_status = ?4, last_error = ?5, next_attempt = ?6,
		note = CASE WHEN ?7 = '' THEN note ELSE ?7 END,
		holder = CASE WHEN ?8 THEN '' ELSE holder END,
		lease_until = CASE WHEN ?8 THEN NULL ELSE lease_until END
	WHERE op = ?9 AND (?10 = '' OR holder = ?10)`

func (s *stmts) prepare(ctx context.Context, db *sql.DB) error {
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		// One statement claims the name: a new row, or the replacement of an
		// abandoned one, changes one row; any other existing row is left as
		// it is and none changes.
		{&s.begin, `
			INSERT INTO operations (op, key, fingerprint, state, method, url, header, body, body_size,
				created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (op) DO UPDATE SET key = excluded.key, fingerprint = excluded.fingerprint,
				state = excluded.state, method = excluded.method, url = excluded.url,
				header = excluded.header, body = excluded.body, body_size = excluded.body_size,
				created = excluded.created, updated = excluded.updated, attempts = excluded.attempts,
				last_status = excluded.last_status, last_error = excluded.last_error,
				next_attempt = excluded.next_attempt, note = excluded.note, holder = excluded.holder,
				lease_until = excluded.lease_until
			WHERE operations.state = ?`},
		{&s.get, "SELECT " + columns + " FROM operations WHERE op = ?"},
		{&s.save, `
			UPDATE operations SET state = ?, updated = ?, attempts = ?, last_status = ?, last_error = ?,
				next_attempt = ?, note = ?, holder = ?, lease_until = ?
			WHERE op = ?`},
		{&s.update, updateSQL + " RETURNING " + columns},
		{&s.deferred, updateSQL},
		{&s.forget, "DELETE FROM operations WHERE op = ?"},
		// ?3 is idem.StatePending.
		{&s.forgetKey, "DELETE FROM operations WHERE op = ?1 AND key = ?2 AND state <> ?3"},
		// The condition on updated: a zero Updated is stored as NULL; ?2 is
		// true when before is later than any time a row can hold.
		{&s.prune, `
			DELETE FROM operations WHERE rowid IN (
				SELECT rowid FROM operations
				WHERE state IN (SELECT value FROM json_each(?1))
					AND (?2 OR updated < ?3 OR (updated IS NULL AND ?4))
				LIMIT ?5)`},
	} {
		var err error
		if *p.stmt, err = db.PrepareContext(ctx, p.query); err != nil {
			return err
		}
	}
	return nil
}

func (s *stmts) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.begin, s.get, s.save, s.update, s.deferred, s.forget, s.forgetKey, s.prune} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}
