// Package sqlitestore is a testserver.Store on SQLite (modernc.org/sqlite,
// no cgo): the reference server's embedded default. Several server
// processes on one machine may share the file; for many machines use
// testserver/pgstore.
//
// Leave the file, and its -wal and -shm files, in place while a store has
// it open: SQLite writes on to the file it opened, wherever it went, and
// the store does not notice it removed or replaced (unlike the client's
// jar, package keyjar, which fails with ErrMoved). Its keys then live only
// as long as the processes that hold it open; a store opened at the path
// afterwards creates a new, empty database, where every retry of a key
// answered before runs its handler again.
//
// The database runs in WAL mode with synchronous=FULL, and fullfsync and
// checkpoint_fullfsync (which on macOS sync with F_FULLFSYNC: its fsync
// leaves the write in the disk's cache), so a saved answer survives power
// loss; every transaction begins IMMEDIATE (it takes the write lock at
// once, so two writers never deadlock upgrading), waits up to BusyTimeout
// for another process's lock (then fails with ErrLocked), and goes through
// one connection. A Save, TakeOver or Release whose context ends as SQLite
// commits its statement reports the write made (the store reads the entry
// back), not the context's error, which the driver returns for an
// interrupted statement and a committed one alike. Open refuses
// a negative BusyTimeout with ErrOptions, creating nothing; zero is the
// default.
//
// The file is marked with PRAGMA application_id (ApplicationID) and its
// schema versioned with PRAGMA user_version. Open refuses a file that is
// not a SQLite database, and a database of another program, a client's key
// jar (package keyjar) among them, with ErrNotStore, and leaves it as it
// was; an application's own tables beside the store's (see Store.DB) are no
// obstacle.
//
// Version 2 of the schema keeps each claim's ID (testserver.Fence.ClaimID)
// beside its token. Open adds the column to a file of version 1, whose
// claims in flight keep the empty ID; a store of an earlier version of
// this package then refuses the file with ErrSchemaTooNew. One that has
// it open already keeps working, its writes fenced by the token alone: a
// claim of a newer one at the same token is not safe from its releases
// until it stops.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	cutoffpkg "github.com/idemkit/idem/internal/cutoff"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/sqliteopt"
	"github.com/idemkit/idem/testserver"
	"modernc.org/sqlite" // also the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// schemaVersion is PRAGMA user_version once the schema below is in place.
// Version 1 lacked claim_id; Open adds it (addClaimID).
const schemaVersion = 2

// ApplicationID is the PRAGMA application_id of a database of this package
// ("idms"), set when Open creates the schema. A database of an earlier
// version, which set only user_version, is marked the first time Open opens
// it; those versions ignore the mark. (The client's key jar, package keyjar,
// marks its files 0x69646d6a, "idmj".)
const ApplicationID = 0x69646d73

// keyJarID is keyjar's application_id, named in the error for its files.
const keyJarID = 0x69646d6a

const schema = `
CREATE TABLE idempotency_keys (
	scope           TEXT    NOT NULL,
	key             TEXT    NOT NULL,
	fingerprint     TEXT    NOT NULL,
	status          TEXT    NOT NULL CHECK (status IN ('in_flight', 'done')),
	response_status INTEGER,
	response_header TEXT,    -- JSON object: header name to values
	response_body   BLOB,
	locked_at       INTEGER NOT NULL, -- the claim's token (testserver.Fence.Token), Unix nanoseconds of its clock
	created         INTEGER NOT NULL, -- Unix nanoseconds
	claim_id        TEXT    NOT NULL DEFAULT '', -- the claim's ID (testserver.Fence.ClaimID)
	PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created);
`

// addClaimID brings a version 1 schema to version 2: its claims in flight
// keep the empty ID, which their fences name.
const addClaimID = `ALTER TABLE idempotency_keys ADD COLUMN claim_id TEXT NOT NULL DEFAULT ''`

// DefaultBusyTimeout is how long a statement waits for another
// connection's write lock when Options.BusyTimeout is zero.
const DefaultBusyTimeout = 5 * time.Second

// Options configure Open. A nil *Options means the defaults, and every
// zero field its documented default; a field out of range makes Open fail
// with ErrOptions, creating nothing.
type Options struct {
	// BusyTimeout is how long a statement waits for another process's
	// write lock before failing with ErrLocked. Zero means DefaultBusyTimeout; a negative
	// one is ErrOptions. SQLite waits at most 2^31-1 ms (about 24.8 days)
	// and at least 1 ms: a longer or shorter BusyTimeout is that. The caller's context does not
	// cut this wait short: a method that waits for the lock returns once
	// the lock is free or BusyTimeout has passed, even if its context
	// ended before.
	BusyTimeout time.Duration
}

// Store is a testserver.Store in one SQLite file. It is safe for concurrent
// use.
type Store struct {
	db     *sql.DB
	closed atomic.Bool
}

var _ testserver.Store = (*Store)(nil)

// Errors returned by Open and the Store's methods, wrapped with details:
// test with errors.Is.
var (
	// ErrSchemaTooNew is returned by Open when the file was written by a
	// newer version of this package.
	ErrSchemaTooNew = errors.New("sqlitestore: database schema is newer than this program")

	// ErrNotStore is returned by Open for a file that is not a SQLite
	// database, and for a SQLite database that is not this package's: one
	// marked with another application_id (a client's key jar, for one), or
	// an unmarked one that holds tables but not the store's. Open changes
	// nothing in it.
	ErrNotStore = errors.New("sqlitestore: not a sqlitestore database")

	// ErrClosed is returned by every method of a Store after Close, Close
	// included, and by a call that Close cut short.
	ErrClosed = errors.New("sqlitestore: store is closed")

	// ErrLocked is returned by a method that waited Options.BusyTimeout
	// for a write lock another connection held (another process's store
	// on the same file), wrapping SQLite's SQLITE_BUSY: the file is in
	// use, not broken, and the call may be tried again.
	ErrLocked = errors.New("sqlitestore: database is locked by another connection")

	// ErrOptions is returned by Open for an Options field out of range: a
	// negative BusyTimeout. It is wrapped with the field and its value.
	// Nothing is created.
	ErrOptions = errors.New("sqlitestore: invalid options")
)

// Open opens the database at path, creating it with mode 0600 when it does
// not exist (an existing file keeps its mode), and creates or checks the
// schema. A file removed while Open opens it is not created again: Open
// returns an error matching fs.ErrNotExist, as for an empty path, which
// names no file (as for os.Open and keyjar.Open). path is a file name, not
// a SQLite URI: "file:keys.db?mode=ro" names a file of that name in the
// working directory, as it does for package keyjar. ":memory:" alone opens
// a private in-memory database. It fails with ErrOptions for an option out
// of range, creating nothing, with ErrNotStore for a file that is not a
// SQLite database or is another program's database, with ErrSchemaTooNew
// for one of a newer version of this package, and with an error matching
// fs.ErrPermission, as os.OpenFile's does, for a file, or a directory
// (where the store keeps the file's -wal and -shm files), that this user
// may not write or that is on a read-only file system: it says which.
func Open(ctx context.Context, path string, opts *Options) (*Store, error) {
	return open(ctx, path, opts, nil, nil)
}

// open is Open; created, when not nil, runs once Open has created or
// found the file at path, before SQLite opens it, and beforeWAL once it
// has checked the schema, before it turns the file to WAL.
func open(ctx context.Context, path string, opts *Options, created func(path string), beforeWAL func()) (*Store, error) {
	if opts == nil {
		opts = &Options{}
	}
	if opts.BusyTimeout < 0 {
		return nil, fmt.Errorf("%w: BusyTimeout %v is negative", ErrOptions, opts.BusyTimeout)
	}
	if path == "" {
		// os.Open("") fails so too: the empty name is no file's.
		return nil, fmt.Errorf("sqlitestore: open: empty path: %w", syscall.ENOENT)
	}
	busy := opts.BusyTimeout
	if busy == 0 {
		busy = DefaultBusyTimeout
	}
	// journal_mode(WAL) waits until migrate has checked the file: it would
	// rewrite the header of another program's database.
	query := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=synchronous(FULL)&_pragma=fullfsync(1)&_pragma=checkpoint_fullfsync(1)&_txlock=immediate",
		sqliteopt.BusyTimeoutMillis(busy))
	dsn := ":memory:?" + query
	if path != ":memory:" {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			if werr := notWritable(path, err); werr != nil {
				return nil, werr
			}
			return nil, fmt.Errorf("sqlitestore: %w", err)
		}
		f.Close()
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: %w", err)
		}
		if created != nil {
			created(abs)
		}
		// mode=rw: a file removed since it was created is not created
		// again by SQLite, with the umask's mode.
		dsn = sqliteopt.URI(abs, "mode", "rw") + "&" + query
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	db.SetMaxOpenConns(1) // one writer; also keeps a :memory: database alive
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	s := &Store{db: db}
	if err := s.migrate(ctx, path); err != nil {
		keepWAL(db)
		db.Close()
		if werr := notWritable(path, err); werr != nil {
			return nil, werr
		}
		if se := (*sqlite.Error)(nil); errors.As(err, &se) {
			switch se.Code() & 0xff {
			case sqlite3.SQLITE_NOTADB:
				return nil, fmt.Errorf("%w: %s is not a SQLite database (%v)", ErrNotStore, path, se)
			case sqlite3.SQLITE_CANTOPEN:
				if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) {
					// Removed since Open created it: mode=rw does not
					// create it again.
					return nil, fmt.Errorf("%w: %w", err, serr)
				}
			}
		}
		return nil, err
	}
	// The mode stays in the file: a connection opened later finds it.
	if beforeWAL != nil {
		beforeWAL()
	}
	if _, err := sqliteopt.SetWAL(ctx, db, busy); err != nil {
		db.Close()
		if werr := notWritable(path, err); werr != nil {
			return nil, werr
		}
		return nil, s.fail(err) // ErrLocked, when another process holds the file
	}
	return s, nil
}

// keepWAL makes db's connection, about to close on a file Open refused,
// leave the file's -wal and -shm files where it found them: a client's key
// jar keeps them so that idemctl can read it without writing (keyjar's
// Options.ReadOnly), and closing the last connection to a WAL-mode file
// deletes them. (SQLite still checkpoints the WAL into the file: its
// pages, not what they hold, change.) A file not in WAL mode is left as
// it is.
func keepWAL(db *sql.DB) {
	conn, err := db.Conn(context.Background())
	if err != nil {
		return
	}
	defer conn.Close()
	_ = sqliteopt.KeepWAL(conn)
}

// notWritable returns Open's error for a store at path that this user may
// not write, err being what refused it (os.OpenFile's error or SQLite's):
// one matching fs.ErrPermission, as os.OpenFile's does, that says what
// cannot be written and what to do. It returns nil for an err of another
// kind.
func notWritable(path string, err error) error {
	dir := filepath.Dir(path)
	var (
		se *sqlite.Error
		pe *fs.PathError
	)
	errors.As(err, &se)
	cause := err
	switch {
	case se != nil && se.Code() == sqlite3.SQLITE_READONLY_DIRECTORY:
		// The file may be written, but not the -wal and -shm files that
		// SQLite creates beside it.
		return fmt.Errorf("sqlitestore: open %s: %w (%w): the directory %s cannot be written, and the store keeps the file's -wal and -shm files there: open it as a user who may write that directory, or give a path in another one",
			path, fs.ErrPermission, se, dir)
	case se != nil && se.Code()&0xff == sqlite3.SQLITE_READONLY:
		cause = se
	case errors.As(err, &pe) && (errors.Is(pe.Err, fs.ErrPermission) || errors.Is(pe.Err, syscall.EROFS)):
		cause = pe.Err // the path is said below
	default:
		return nil
	}
	if !errors.Is(cause, fs.ErrPermission) {
		// SQLite's, or a read-only file system's (EROFS), which does not
		// match it by itself.
		cause = fmt.Errorf("%w (%w)", fs.ErrPermission, cause)
	}
	return fmt.Errorf("sqlitestore: open %s: %w: the store writes the file, and its -wal and -shm files beside it in %s: open it as a user who may write them and the directory, or give another path",
		path, cause, dir)
}

// migrate checks that the database at path is the store's, or empty, and
// creates the schema in an empty one, adds claim_id to a version 1 one
// and marks an earlier version's with ApplicationID, all in one IMMEDIATE
// transaction: another process may be doing the same.
func (s *Store) migrate(ctx context.Context, path string) error {
	return s.update(ctx, func(tx *sql.Tx) error {
		var (
			app, version, objects int64
			hasKeys               bool
		)
		err := tx.QueryRowContext(ctx, `SELECT (SELECT application_id FROM pragma_application_id),
			(SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_schema),
			EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'idempotency_keys')`).
			Scan(&app, &version, &objects, &hasKeys)
		if err != nil {
			return err
		}
		switch {
		case app == 0 && version == 0 && objects == 0:
			if _, err := tx.ExecContext(ctx, schema); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d; PRAGMA user_version = %d", ApplicationID, schemaVersion))
			return err
		case app == keyJarID:
			return fmt.Errorf("%w: %s is a client's key jar (package keyjar, application_id %#x)", ErrNotStore, path, app)
		case app != 0 && app != ApplicationID:
			return fmt.Errorf("%w: %s is a database of another program (application_id %#x)", ErrNotStore, path, app)
		case app == 0 && (version == 0 || !hasKeys):
			// Earlier versions created the table and set user_version
			// together.
			return fmt.Errorf("%w: %s holds another program's tables (no application_id, user_version %d, %d schema objects)",
				ErrNotStore, path, version, objects)
		case version > schemaVersion:
			return fmt.Errorf("%w: version %d, this program knows %d", ErrSchemaTooNew, version, schemaVersion)
		case version < 1:
			return fmt.Errorf("%w: %s has application_id %#x but unknown schema version %d", ErrNotStore, path, app, version)
		}
		// The schema of its version: its table has every column used here,
		// but claim_id at version 1.
		columns := "scope, key, fingerprint, status, response_status, response_header, response_body, locked_at, created"
		if version > 1 {
			columns += ", claim_id"
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT `+columns+` FROM idempotency_keys LIMIT 0)`).Scan(&n); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrNotStore, path, err)
		}
		if version == 1 {
			if _, err := tx.ExecContext(ctx, addClaimID+fmt.Sprintf("; PRAGMA user_version = %d", schemaVersion)); err != nil {
				return err
			}
		}
		if app == 0 {
			_, err = tx.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d", ApplicationID))
		}
		return err
	})
}

// DB returns the underlying database, so that an application can keep its
// own tables in the same file (the reference server keeps its PayCo ledger
// there). It has one connection: do not hold a transaction open, or rows
// not yet closed, while calling the Store, and so while writing a
// handler's answer either: the Middleware saves an answer longer than
// MaxSavedResponse from inside the Write that goes past it, and that save
// would wait for the connection until it failed (its claim then stays in
// flight, and a retry after LockTimeout runs the handler again). Read
// rows into memory, close them, then write. Close closes it.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database. A call already running finishes, or fails
// with ErrClosed. Close returns ErrClosed when the store was already
// closed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	return s.db.Close()
}

// fail returns err with the package's prefix (ErrLocked's for a lock
// waited for in vain) or, once the store is closed, ErrClosed: a statement
// that Close cut short fails with whatever database/sql says of a closed
// database.
func (s *Store) fail(err error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if se := (*sqlite.Error)(nil); errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%w: %w", ErrLocked, err)
		}
	}
	return fmt.Errorf("sqlitestore: %w", err)
}

// update runs f in one IMMEDIATE transaction, committed when f returns nil.
func (s *Store) update(ctx context.Context, f func(*sql.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.fail(err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		if errors.Is(err, ErrSchemaTooNew) || errors.Is(err, ErrNotStore) {
			return err
		}
		return s.fail(err)
	}
	if err := tx.Commit(); err != nil {
		return s.fail(err)
	}
	return nil
}

// Claim implements testserver.Store.
func (s *Store) Claim(ctx context.Context, scope, key, fingerprint string, f testserver.Fence, now time.Time) (e testserver.Entry, claimed bool, err error) {
	err = s.update(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (scope, key, fingerprint, status, locked_at, claim_id, created)
			VALUES (?, ?, ?, 'in_flight', ?, ?, ?) ON CONFLICT (scope, key) DO NOTHING`,
			scope, key, fingerprint, f.Token, f.ClaimID, now.UnixNano())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 1 {
			claimed = true
			e = testserver.Entry{Scope: scope, Key: key, Fingerprint: fingerprint, Status: testserver.StatusInFlight,
				Fence: f, Created: time.Unix(0, now.UnixNano())}
			return nil
		}
		e, err = get(ctx, tx, scope, key)
		return err
	})
	if err != nil {
		// The commit may have failed after the insert: nothing was claimed.
		return testserver.Entry{}, false, err
	}
	return e, claimed, nil
}

func get(ctx context.Context, tx *sql.Tx, scope, key string) (testserver.Entry, error) {
	e := testserver.Entry{Scope: scope, Key: key}
	var (
		status  sql.NullInt64
		header  sql.NullString
		body    []byte
		created int64
	)
	err := tx.QueryRowContext(ctx, `SELECT fingerprint, status, response_status, response_header, response_body, locked_at, claim_id, created
		FROM idempotency_keys WHERE scope = ? AND key = ?`, scope, key).
		Scan(&e.Fingerprint, &e.Status, &status, &header, &body, &e.Token, &e.ClaimID, &created)
	if err != nil {
		return e, err
	}
	e.Created = time.Unix(0, created)
	if status.Valid {
		r := &testserver.Response{Status: int(status.Int64)}
		if len(body) > 0 { // an empty body is nil (see testserver.Response)
			r.Body = body
		}
		if header.Valid {
			if r.Header, err = hdrjson.Unmarshal([]byte(header.String)); err != nil {
				return e, fmt.Errorf("response header of key %q: %w", key, err)
			}
		}
		e.Response = r
	}
	return e, nil
}

// exec runs one statement and returns how many rows it changed.
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, s.fail(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.fail(err)
	}
	return n, nil
}

// entryState is what write reads of an entry after its statement failed
// with the end of its context.
type entryState struct {
	exists bool
	status testserver.Status
	fence  testserver.Fence
}

// write runs one statement that writes the entry of (scope, key) and
// returns how many rows it changed. modernc.org/sqlite returns the
// context's error for a statement during which ctx ended, whether SQLite
// interrupted it (nothing written) or had committed it already: the
// driver's watcher interrupts the connection as the context ends, and the
// statement's result is replaced by the context's error. Then write reads
// the entry, on the same connection and without that context, and
// returns 1 and nil when done says the statement took effect, so that a
// caller is not told a write failed that was made: the Middleware would
// log a saved answer as a failed save, counted among its store errors.
// When it cannot tell, or the read fails, the context's error stands.
func (s *Store) write(ctx context.Context, scope, key string, done func(entryState) bool, query string, args ...any) (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, s.fail(err)
	}
	defer conn.Close()
	res, err := conn.ExecContext(ctx, query, args...)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// A read, in WAL mode: it waits for no writer, but at most
			// BusyTimeout for a file being recovered. It also clears the
			// interruption, which would make the driver drop the
			// connection.
			var e entryState
			rerr := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT status, locked_at, claim_id
				FROM idempotency_keys WHERE scope = ? AND key = ?`, scope, key).Scan(&e.status, &e.fence.Token, &e.fence.ClaimID)
			e.exists = rerr == nil
			if (rerr == nil || errors.Is(rerr, sql.ErrNoRows)) && done(e) {
				return 1, nil
			}
		}
		return 0, s.fail(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.fail(err)
	}
	return n, nil
}

// TakeOver implements testserver.Store.
func (s *Store) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	n, err := s.write(ctx, scope, key, func(e entryState) bool {
		return e.exists && e.status == testserver.StatusInFlight && e.fence == new // new's ClaimID is the caller's alone
	}, `UPDATE idempotency_keys SET locked_at = ?, claim_id = ?
		WHERE scope = ? AND key = ? AND status = 'in_flight' AND locked_at = ? AND claim_id = ?`,
		new.Token, new.ClaimID, scope, key, old.Token, old.ClaimID)
	return n == 1, err
}

// Save implements testserver.Store.
func (s *Store) Save(ctx context.Context, scope, key string, f testserver.Fence, resp testserver.Response) error {
	header, err := hdrjson.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	n, err := s.write(ctx, scope, key, func(e entryState) bool {
		// Only the holder of f saves under it, once.
		return e.exists && e.status == testserver.StatusDone && e.fence == f
	}, `UPDATE idempotency_keys SET status = 'done', response_status = ?, response_header = ?, response_body = ?
		WHERE scope = ? AND key = ? AND status = 'in_flight' AND locked_at = ? AND claim_id = ?`,
		resp.Status, string(header), body, scope, key, f.Token, f.ClaimID)
	if err == nil && n == 0 {
		err = testserver.ErrFenced
	}
	return err
}

// Release implements testserver.Store.
func (s *Store) Release(ctx context.Context, scope, key string, f testserver.Fence) (bool, error) {
	n, err := s.write(ctx, scope, key, func(e entryState) bool {
		// Gone: deleted by this call, unless the claim was never made
		// (its Claim failed) or was taken over and ended meanwhile; either
		// way no claim of f is left in flight.
		return !e.exists
	}, `DELETE FROM idempotency_keys
		WHERE scope = ? AND key = ? AND status = 'in_flight' AND locked_at = ? AND claim_id = ?`, scope, key, f.Token, f.ClaimID)
	return n == 1, err
}

// Prune implements testserver.Store.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	// The last nanosecond before before, for "<= cutoff"; none before
	// 1678, where no entry is.
	cutoff, ok := cutoffpkg.Nanos(before)
	if limit <= 0 || !ok {
		return 0, nil
	}
	n, err := s.exec(ctx, `DELETE FROM idempotency_keys WHERE rowid IN
		(SELECT rowid FROM idempotency_keys WHERE created <= ?1 AND (status = 'done' OR locked_at <= ?1)
		ORDER BY created LIMIT ?2)`, cutoff, limit)
	return int(n), err
}
