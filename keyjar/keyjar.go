// Package keyjar is the default durable idem.Jar: operations and their
// idempotency keys in one SQLite file (modernc.org/sqlite, pure Go).
//
//	jar, err := keyjar.Open(ctx, "keys.db", nil)
//	if err != nil { ... }
//	defer jar.Close()
//	hc := &http.Client{Transport: &idem.Transport{Jar: jar}}
//
// # Durability
//
// Begin returns only after the transaction holding the new key committed with
// synchronous=FULL: the key is on stable storage before the first byte of the
// request can be sent, and survives a crash or a power loss. Concurrent Begin
// calls share one transaction and one fsync (group commit): a single
// goroutine owns the only writer connection, drains the queue of pending
// writes into one IMMEDIATE transaction, commits, and only then answers each
// caller.
//
// A batch whose COMMIT fails fails every caller in it, and the jar holds
// none of its writes, then or after a crash: SQLite may have written the
// batch's frames to the -wal file before it failed (to grow the -shm file
// on a full disk, or to sync), where a recovery of the WAL would find them
// whole, so the committer then commits one page over them (the
// user_version it reads) before it answers.
//
// Acquire, Update, Forget, ForgetKey and Prune go through the same queue but
// do not ask for an fsync of their own: a transaction that holds no key
// creation commits with synchronous=NORMAL. They are visible to every reader
// and every process as soon as they return, and they survive a crash of the
// process; a power loss may lose the last of them (which only causes a
// re-send that the server replays). In WAL mode a later FULL commit, a
// checkpoint or Close makes them durable too, in order.
//
// Defer (idem.Deferrer) queues the change Update would make and returns
// without waiting for its commit: the Transport defers the outcome of each
// call (done, failed, the lease's release), which then joins the next
// batch. Get and List first wait for what was deferred before them, so a
// goroutine reads back what it deferred; other processes see it once
// committed, within the next batch.
//
// # File
//
// The file is created with mode 0600 if it does not exist, unless
// Options.MustExist is set (an existing file keeps its mode); SQLite gives
// its -wal and -shm files the database file's mode when it creates them.
// Close checkpoints the WAL into the file and leaves the -wal file, empty,
// and the -shm file in place: SQLite can read a WAL-mode file without
// writing only when they exist. On a full disk the checkpoint may not
// complete, and Close still returns nil: the -wal file then keeps what it
// holds, synced, and the next Open reads it. A path that is a
// symbolic link opens the file it points to, or creates it there when
// nothing is there yet, and the -wal and -shm files are
// beside that file; a link on the path pointed elsewhere while the jar is
// open is a file moved (ErrMoved). Each connection sets busy_timeout (Options.BusyTimeout;
// the writer's is at most 100 ms, a slice of the committer's wait for the
// write lock, which lasts BusyTimeout all the same); the writer also uses journal_mode=WAL, synchronous=FULL (NORMAL for
// batches without a key creation), fullfsync and checkpoint_fullfsync (on
// macOS an fsync leaves the write in the disk's cache, and SQLite then
// syncs with F_FULLFSYNC, as Go's File.Sync does; elsewhere they change
// nothing), secure_delete=FAST and BEGIN IMMEDIATE
// transactions (_txlock=immediate); the readers (Get, List) are query_only
// and never block the writer. The schema is versioned with PRAGMA
// user_version and the file is marked with PRAGMA application_id; Open
// refuses a newer version with ErrVersion and a file that is not a jar with
// ErrCorrupt, and upgrades an older one in one transaction: of several
// processes that open it at once, one upgrades it and the others wait for
// the write lock (up to Options.BusyTimeout, or fail with ErrLocked) and
// find it upgraded. Version 2 adds
// the index on (state, created, op) that List with a State reads (the walk
// of the pending operations: client.Pending, idemctl list --status and
// resume --all); a jar of version 1 gets it at its first Open without
// ReadOnly or MustExist (which refuses it with ErrOldVersion, as pgjar's
// does), after which a program built with an earlier version of this
// package refuses the jar with ErrVersion. Times are stored as Unix nanoseconds, so a Record's times must
// lie between the years 1678 and 2262 (or be zero); headers are stored as
// JSON, byte for byte: a name or value that is not UTF-8 is kept in base64.
//
// The jar writes to the file Open opened. Removed, renamed or replaced by
// another file while the jar is open, that file is no longer at the jar's
// path, and SQLite writes on to it without a word: a key committed there is
// lost to the next program that opens the path. So is one committed to a
// -wal file that was removed, until Close writes it into the jar file: a
// crash before loses it. So before it commits a key creation, the jar
// checks, with one stat of the path and one of its -wal file, that they
// still name the files SQLite writes, and otherwise commits nothing: Begin
// fails with ErrMoved, and so does every Begin after it. It checks on its
// first key creation and then at most every tenth of a second, as two
// stats on every Begin cost it 15 %: a key begun in the tenth of a second
// after a move may still be committed to the file that moved, and sent.
// A read (Get, List) that fails once the file moved, as one that opens a
// new connection does when nothing is at the path, returns ErrMoved too.
// Close returns ErrMoved too when the jar file moved, once it has written
// what the jar committed into the file it opened and emptied the -wal file
// at the path. An abandon (an Update to StateAbandoned, AbandonKey), synced as a key
// creation is, is checked as one; the other writes (Acquire, Update,
// Defer, Forget, Prune) are not, but fail with the commit they share with
// one that is. A -shm file removed while the jar is
// open is not found: SQLite keeps its locks there, and a program that
// opens the jar afterwards shares none with this one, so that a commit of
// one may overwrite the other's.
//
// Damage that leaves the file in place (truncated, overwritten) is found
// only when SQLite reads what was damaged, which its writer, holding the
// pages it wrote in its cache, may not do before Close.
//
// Credentials never reach the file: Begin keeps every header that
// idem.SecretHeader names by its name alone, without its values, even when
// the caller forgot to take them out (idem.Record.Withheld lists them).
//
// The file keeps every operation, done ones and unnamed ones included, until
// Prune (or idemctl prune) deletes it: nothing is pruned on its own, and
// a program that sends for long calls Prune now and then. Prune only what no
// call will name again: a name whose record is gone gets a new key.
//
// # Reading only
//
// Options.ReadOnly opens a jar for a program that only reads it, such as
// idemctl's list, show and export: it writes nothing, to the file or
// beside it, and needs read permission alone, on the file and on its -wal
// and -shm files; none on the directory. It reads what every writer
// commits, as the others do, and its methods that write return
// ErrReadOnly. SQLite reads a WAL-mode file without writing only when the
// -wal and -shm files exist: Close keeps them, and a read-only Open
// refuses a jar without them with ErrReadOnly. It reads a jar of an older
// schema version (1) as it is, without the index that only a write adds:
// List with a State reads it from another index, or the whole table.
// Without its -wal and -shm files, such a jar is ErrOldVersion, which
// matches ErrReadOnly too: the Open for writing that would create them
// would upgrade it.
//
// Several processes may open the same file: Begin is an atomic get-or-create
// across all of them (one INSERT … ON CONFLICT DO UPDATE … WHERE state =
// 'abandoned', and a read back of the existing row when it changed none, in
// one IMMEDIATE transaction), Acquire is a read-check-write in
// the same kind of transaction, and Update is one UPDATE fenced by its WHERE
// clause. A caller's
// context bounds its own wait for the committer, never the statements of a
// batch that other callers share: when it ends before the committer takes
// the caller's write, the write is withdrawn and the method returns the
// context's error; once taken, the method waits for that batch's commit and
// returns what it wrote. The committer takes another process's write lock
// before it takes a batch's writes, and stops waiting for it once none of
// them has a caller still waiting (a deferred change always has): a Close
// after a write withdrawn so does not wait out BusyTimeout.
package keyjar

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dropped"
	"github.com/idemkit/idem/internal/sqliteopt"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Options configures Open. A nil *Options means the zero value, and every
// zero field means its documented default; a negative field makes Open
// fail with ErrOptions.
type Options struct {
	// BusyTimeout is how long a statement waits for a lock held by another
	// connection or process before failing with ErrLocked. Zero means 5s.
	// SQLite waits at most 2^31-1 ms (about 24.8 days) and at least 1 ms:
	// a longer or shorter BusyTimeout is that.
	BusyTimeout time.Duration

	// MaxBatch is the most writes (Begin, Acquire, Update, Forget, ForgetKey,
	// one Prune batch) that share one transaction and one commit. Zero means
	// 128; 1 turns group commit off. At most 65536.
	MaxBatch int

	// MustExist makes Open open only an existing jar: it creates no file
	// and no schema, and does not upgrade one. It returns an error
	// matching fs.ErrNotExist for a missing file (one removed while Open
	// ran included), ErrCorrupt for an empty one, which it leaves empty,
	// and ErrOldVersion for a jar of an older schema version, which it
	// leaves as it is. A program that only
	// inspects or resumes the operations of a jar (as idemctl does) sets
	// it, so that a wrong path fails instead of showing a new, empty jar.
	// False means Open creates the file and its schema when they do not
	// exist.
	MustExist bool

	// ReadOnly makes Open open an existing jar for reading alone, as a
	// program that only inspects a jar should (idemctl's list, show and
	// export do). It implies MustExist, with its errors, and Open refuses
	// a jar of a newer version with ErrVersion, one of another program
	// with ErrCorrupt. It writes nothing, neither to the file nor beside
	// it: no schema, no migration, no change of journal mode, no -wal or
	// -shm file created. So it needs no write permission, neither on the
	// file, on its -wal and -shm files nor on their directory, only read
	// permission on all three. Get, List and ByKey read what is committed,
	// also what another connection or process commits while the jar is
	// open, without waiting for a write in progress; every method that
	// writes (Begin, Acquire, Update, Defer, Forget, ForgetKey, AbandonKey, Prune)
	// returns ErrReadOnly, whatever its arguments. MaxBatch is checked,
	// and not used.
	//
	// SQLite reads a file in WAL mode, as every jar is, only when its -wal
	// and -shm files exist or it may create them: Open refuses one whose
	// -wal or -shm file is missing with ErrReadOnly. Close leaves them in
	// place, and a program that has the jar open keeps them, so they are
	// missing only after a program removed them (another SQLite program,
	// or this package before it kept them): opening the jar once without
	// ReadOnly brings them back. A jar of an older schema version (1,
	// before the index List with a State reads) is read as it is, not
	// upgraded (a write): its queries need no index, and List with a
	// State reads another. Without its -wal and -shm files, Open refuses
	// it with ErrOldVersion (which matches ErrReadOnly too), saying its
	// version: an Open without ReadOnly, which creates them, upgrades it.
	// A version below 1 is ErrCorrupt.
	ReadOnly bool

	// Logger receives one record (Warn) for each change taken by Defer
	// that the jar drops because its transaction failed (a database
	// error: a full disk, an I/O error, the file moved away), with the
	// operation's name (op) and the error (err, the passwords it quotes
	// masked): the record stays as it was, at worst pending, which a
	// resume settles with the server's replay, and nothing else reports
	// it. A change fenced off (another holder took the lease) is not a
	// failure and is not logged. The jar's writer calls it, between two
	// transactions: a slow handler delays the jar's writes. Nil means
	// silent.
	Logger *slog.Logger
}

const (
	defaultBusyTimeout = 5 * time.Second
	defaultMaxBatch    = 128
	maxBatchLimit      = 1 << 16 // the queue and each batch hold that many jobs
	readConns          = 4       // size of the read-only pool used by Get and List
	pruneBatch         = 1000    // rows Prune deletes per transaction
)

// Jar is an idem.Jar stored in a SQLite file. It is safe for concurrent use
// by many goroutines, and several processes may open the same file.
type Jar struct {
	path     string
	readOnly bool      // Options.ReadOnly: no writer, no committer
	writer   *sql.DB   // exactly one connection; nil when read-only
	wconn    *sql.Conn // that connection, pinned to the committer
	stmts    stmts     // prepared on it
	reader   *sql.DB   // query_only pool for Get and List

	given     string      // the path as Open was given it, when a symbolic link made it another than path
	file      os.FileInfo // the file at path once SQLite opened it (see moved)
	wal       os.FileInfo // and its -wal file
	checkedAt time.Time   // when the committer last checked them (checkMoved)
	movedErr  error       // what it found: ErrMoved, from then on

	queue    chan *job
	maxBatch int
	// busyTimeout is Options.BusyTimeout, which the committer's BEGIN
	// waits in slices of busySlice (begin); busySlice is the writer's
	// busy_timeout in milliseconds once it is open.
	busyTimeout time.Duration
	busySlice   string
	done        chan struct{} // closed when the committer has exited
	hooks       hooks
	logger      *slog.Logger  // Options.Logger: deferred changes dropped
	drops       dropped.Count // the deferred changes dropped, for Close

	mu     sync.RWMutex // guards closed and sends on queue
	closed bool

	// Deferred changes queued and written so far (see settle).
	deferQueued, deferDone atomic.Uint64
}

var _ idem.Jar = (*Jar)(nil)

// hooks are test seams (see export_test.go); the zero value does nothing.
type hooks struct {
	// beforeCommit runs in the committer after a batch's statements and
	// before its COMMIT.
	beforeCommit func(tx *sql.Tx, jobs int, durable bool)
	// jobError, when it returns an error, fails the job about to run as if
	// its statements had.
	jobError   func() error
	pruneBatch int // 0 means pruneBatch
	// syncFile runs when Close is about to fsync the file at path.
	syncFile func(path string)
	// checked runs once Open has checked or created the file at path,
	// before SQLite opens it.
	checked func(path string)
	// abandoned runs once an opening that Open gave up on (its caller's
	// context ended) has ended, and the jar it opened, if any, is closed.
	abandoned func()
}

// Open opens the jar file at path, creating it (mode 0600) and its schema if
// it does not exist, unless Options.MustExist or Options.ReadOnly is set
// (ReadOnly: for reading alone). opts may be nil. The
// context bounds the opening only.
//
// path is a file name, not a SQLite URI: "file:keys.db?mode=ro" and
// ":memory:" name files of those names in the working directory. A jar in
// memory, for tests, is idem.MemoryJar. Open creates the file, not its
// directory. As for os.Open, an empty path names no file and one that
// ends in a separator ("keys.db/") names a directory: Open refuses them,
// creating nothing, with os.Open's error (one matching fs.ErrNotExist for
// the empty path or nothing there, syscall.ENOTDIR for a file), or
// ErrCorrupt for a directory.
//
// Open does not wait for another process's write transaction on a jar
// whose schema is current: it reads the schema in a read transaction, and
// Get and List then read what is committed. It waits for the write lock,
// up to Options.BusyTimeout, only to create or upgrade the schema (see the
// package doc) or to switch the file to WAL mode; writes wait for it as
// always. An upgrade reads the whole table once, to build an index.
//
// Open returns ErrOptions, wrapped, for an option out of range (creating
// nothing), an error wrapping fs.ErrPermission when the file or its
// directory cannot be written (with Options.ReadOnly: when the file or its
// -wal or -shm file cannot be read), ErrCorrupt when the file is not a key jar,
// ErrVersion when it was written by a newer version of this package, and
// ErrLocked when another process holds a lock it needs (the write lock
// above, or any lock in locking_mode=EXCLUSIVE) longer than
// Options.BusyTimeout. Open and the Jar's methods return an error wrapping
// syscall.ENOSPC when the disk is full (or a disk I/O error, when SQLite
// could write the -wal file but not grow the -shm file); what the jar held
// before stays, and a write that failed is not found in it later (see
// Durability in the package doc).
func Open(ctx context.Context, path string, opts *Options) (*Jar, error) {
	return open(ctx, path, opts, hooks{})
}

func open(ctx context.Context, path string, opts *Options, h hooks) (*Jar, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.BusyTimeout < 0:
		return nil, fmt.Errorf("%w: BusyTimeout %v is negative", ErrOptions, o.BusyTimeout)
	case o.MaxBatch < 0:
		return nil, fmt.Errorf("%w: MaxBatch %d is negative", ErrOptions, o.MaxBatch)
	case o.MaxBatch > maxBatchLimit:
		return nil, fmt.Errorf("%w: MaxBatch %d is above %d", ErrOptions, o.MaxBatch, maxBatchLimit)
	}
	if o.BusyTimeout == 0 {
		o.BusyTimeout = defaultBusyTimeout
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if path == "" {
		// os.Open("") fails so too: the empty name is no file's.
		return nil, fmt.Errorf("keyjar: open: empty path: %w", syscall.ENOENT)
	}

	// SQLite's busy handler does not watch the context, so the opening runs
	// aside and a caller whose context ends gets its answer at once; the jar,
	// if it opens after all, is closed.
	type result struct {
		j   *Jar
		err error
	}
	ch := make(chan result, 1)
	go func() {
		j, err := openFile(path, o, h)
		ch <- result{j, err}
	}()
	select {
	case r := <-ch:
		return r.j, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.j != nil {
				r.j.Close()
			}
			if h.abandoned != nil {
				h.abandoned()
			}
		}()
		return nil, ctx.Err()
	}
}

// openFile opens the jar at path; with o.MustExist, only an existing file
// that holds a jar.
func openFile(path string, o Options, h hooks) (_ *Jar, err error) {
	if err := dirPath(path); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, wrapf(err, "open %s", path)
	}
	if err := refuseMovedFrom(abs); err != nil {
		return nil, err
	}
	if err := orphanWAL(abs); err != nil {
		return nil, err
	}
	if o.ReadOnly {
		return openReadOnly(abs, o, h)
	}
	created, err := createFile(abs, !o.MustExist)
	if err != nil {
		return nil, err
	}
	// SQLite follows symbolic links to the database file and keeps its
	// -wal and -shm files beside it: so does the jar, which syncs the WAL.
	given := abs
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, wrapf(err, "open %s", path)
	}
	if h.checked != nil {
		h.checked(abs)
	}
	// A jar this Open refuses keeps its -wal and -shm files if it had them
	// (see below), and gets none if it had none.
	hadSides := false
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Lstat(abs + suffix); err == nil {
			hadSides = true
		}
	}
	// SQLite opens the file with mode=rw: a file removed since it was
	// checked is not created again, empty.
	busy := strconv.FormatInt(sqliteopt.BusyTimeoutMillis(o.BusyTimeout), 10)
	writer, err := sql.Open("sqlite", sqliteopt.URI(abs,
		"mode", "rw",
		"_txlock", "immediate",
		"_pragma", "busy_timeout("+busy+")",
		"_pragma", "synchronous(FULL)",
		"_pragma", "fullfsync(1)",
		"_pragma", "checkpoint_fullfsync(1)",
		"_pragma", "secure_delete(FAST)",
		// A burst of writes while a reader holds a snapshot (idemctl,
		// a backup) grows the -wal file past what a checkpoint needs;
		// SQLite gives the excess back when it next restarts the WAL,
		// not at Close only.
		"_pragma", "journal_size_limit("+strconv.Itoa(walSizeLimit)+")",
	))
	if err != nil {
		return nil, wrapf(err, "open %s", abs)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	j := &Jar{path: abs, writer: writer, maxBatch: o.MaxBatch, hooks: h, logger: o.Logger}
	if given != abs {
		j.given = given
	}
	defer func() {
		if err != nil {
			// A file this Open refuses (a jar of an older version with
			// MustExist, of a newer version, locked) keeps the -wal and
			// -shm files it had, as Close leaves them: without them a
			// read-only Open of a jar fails. One that had none (another
			// program's database, closed) is left without.
			if j.wconn != nil && hadSides {
				j.keepWAL()
			}
			j.closeDBs()
		}
	}()
	bg := context.Background()
	// Connect and look before changing anything: a database of another
	// program or of a newer version is left as it is. A plain SQL error
	// here (such as "unsupported file format") means SQLite cannot read
	// the schema of an existing file. A current schema is only read:
	// Open then neither waits for another process's write transaction
	// nor holds one up.
	var version int
	j.wconn, err = writer.Conn(bg)
	if err == nil {
		version, err = look(bg, j.wconn)
	}
	if err != nil {
		if !created && isSQLiteCode(err, sqlite3.SQLITE_ERROR) {
			err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil, openError(abs, err, false)
	}
	// The file SQLite now has open, which a key-creating commit checks is
	// still the jar's path.
	if j.file, err = os.Stat(abs); err != nil {
		return nil, wrapf(err, "open %s", abs)
	}
	if version == 0 && o.MustExist {
		return nil, errEmpty(abs)
	}
	if version < schemaVersion && o.MustExist {
		return nil, wrapf(notUpgraded(version), "open %s", abs)
	}
	// On a file already in WAL mode, which the look found, this changes
	// nothing and takes no lock; switching another file to WAL mode does.
	mode, err := sqliteopt.SetWAL(bg, j.wconn, o.BusyTimeout)
	if err != nil {
		return nil, openError(abs, err, false)
	}
	if mode != "wal" {
		return nil, fmt.Errorf("keyjar: open %s: cannot use WAL mode (journal_mode is %q)", abs, mode)
	}
	if version < schemaVersion { // new (0), or older: created or upgraded
		err = j.migrate(bg)
	} else {
		err = canWrite(bg, j.wconn, busy)
	}
	if err != nil {
		return nil, openError(abs, err, false)
	}
	// The -wal file the writer now has open, which it keeps until Close.
	if j.wal, err = os.Stat(abs + "-wal"); err != nil {
		return nil, wrapf(err, "open %s", abs)
	}
	// The statements are prepared on the writer's one connection: give it
	// back to the pool, prepare, and pin it again.
	err = j.wconn.Close()
	j.wconn = nil
	if err == nil {
		err = j.stmts.prepare(bg, writer)
	}
	if err == nil {
		j.wconn, err = writer.Conn(bg)
	}
	if err != nil {
		return nil, openError(abs, err, false)
	}
	if created {
		// The new file's directory entry, so that the file itself survives a
		// power loss; SQLite syncs the directory for its -wal file.
		if err := syncDir(filepath.Dir(abs)); err != nil {
			return nil, wrapf(err, "open %s", abs)
		}
	}
	if j.reader, err = openReaders(abs, "rw", busy); err != nil {
		return nil, err
	}
	// The committer waits for another process's write lock in slices
	// (begin), between which it looks whether anyone still waits for its
	// batch.
	j.busyTimeout = o.BusyTimeout
	j.busySlice = strconv.FormatInt(sqliteopt.BusyTimeoutMillis(min(o.BusyTimeout, busySlice)), 10)
	if _, err = j.wconn.ExecContext(bg, "PRAGMA busy_timeout = "+j.busySlice); err != nil {
		return nil, openError(abs, err, false)
	}
	j.queue = make(chan *job, o.MaxBatch)
	j.done = make(chan struct{})
	go j.commitLoop()
	openJars.add(j)
	return j, nil
}

// openJars is every jar this process has open for writing, by its path,
// for refuseMovedFrom.
var openJars = jarSet{m: make(map[string]map[*Jar]struct{})}

type jarSet struct {
	mu sync.Mutex
	m  map[string]map[*Jar]struct{}
}

func (s *jarSet) add(j *Jar) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[j.path] == nil {
		s.m[j.path] = make(map[*Jar]struct{})
	}
	s.m[j.path][j] = struct{}{}
}

func (s *jarSet) remove(j *Jar) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m[j.path], j)
	if len(s.m[j.path]) == 0 {
		delete(s.m, j.path)
	}
}

// orphanWAL returns ErrMoved when no jar file is at path, or an empty one,
// but a -wal file with commits is: the WAL of a jar file that was removed
// or moved away while open (in another process, or one that ended
// without closing it; a Close empties the WAL). SQLite would take it for
// the WAL of the file that Open creates, and read that jar's pages as the
// new file's, or fail with a disk I/O error while its process holds its
// locks. Nothing is created.
func orphanWAL(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 || err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil // a jar file, whose own WAL it may be; or checked by createFile
	}
	wal, err := os.Stat(path + "-wal")
	if err != nil || wal.Size() == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: no jar file there, but its -wal file holds %d bytes of commits of a jar file that was removed or moved away while open: put that file back, or remove the -wal and -shm files to begin a new jar",
		ErrMoved, path, wal.Size())
}

// refuseMovedFrom returns ErrMoved when this process has a jar open for
// writing whose path is abs's (after symbolic links) and whose file is no
// longer there: removed, renamed or replaced while open. Its -wal and -shm
// files are still at the path, holding what it committed since its last
// checkpoint, and SQLite would take them for the files of whatever file
// it opens there, reading the jar's pages for that file's and writing
// over them. Its Close writes them into its file, wherever that went, and
// leaves nothing at the path. (Another process's such jar is not known
// here: SQLite's locks on the -shm file then fail the Open.)
func refuseMovedFrom(abs string) error {
	path := abs
	if p, err := filepath.EvalSymlinks(abs); err == nil {
		path = p
	} else if d, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		path = filepath.Join(d, filepath.Base(abs))
	}
	openJars.mu.Lock()
	defer openJars.mu.Unlock()
	for j := range openJars.m[path] {
		if sameFile(j.path, j.file) != nil {
			return fmt.Errorf("%w: %s: a jar this process opened there is still open, its -wal and -shm files still at the path: close it first", ErrMoved, path)
		}
	}
	return nil
}

// openReaders opens the pool of readConns query_only connections to the
// file at path, in SQLite's mode ("rw" or "ro"), with busy_timeout busy.
func openReaders(path, mode, busy string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", sqliteopt.URI(path,
		"mode", mode,
		"_pragma", "busy_timeout("+busy+")",
		"_pragma", "query_only(1)",
	))
	if err != nil {
		return nil, wrapf(err, "open %s", path)
	}
	db.SetMaxOpenConns(readConns)
	db.SetMaxIdleConns(readConns)
	return db, nil
}

// openReadOnly opens the jar at abs for reading alone (Options.ReadOnly):
// the pool of readers in SQLite's mode=ro, which opens the file, its -wal
// and -shm files for reading where it may not write them; no writer, no
// committer. Nothing is written: the schema is only read, and a file that
// SQLite could read only by creating its -wal or -shm file is refused.
func openReadOnly(abs string, o Options, h hooks) (_ *Jar, err error) {
	head, err := checkFile(abs, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	if len(head) == 0 {
		return nil, errEmpty(abs)
	}
	target, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, wrapf(err, "open %s", abs)
	}
	abs = target
	if err := walFiles(abs, head); err != nil {
		return nil, err
	}
	if h.checked != nil {
		h.checked(abs)
	}
	busy := strconv.FormatInt(sqliteopt.BusyTimeoutMillis(o.BusyTimeout), 10)
	j := &Jar{path: abs, readOnly: true, maxBatch: o.MaxBatch, hooks: h}
	if j.reader, err = openReaders(abs, "ro", busy); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			j.closeDBs()
		}
	}()
	bg := context.Background()
	conn, err := j.reader.Conn(bg)
	var version int
	if err == nil {
		version, err = look(bg, conn)
		conn.Close()
	}
	if err != nil {
		if isSQLiteCode(err, sqlite3.SQLITE_ERROR) {
			err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil, openError(abs, err, true)
	}
	if version == 0 {
		return nil, errEmpty(abs)
	}
	// A jar of an older version is read as it is: Get, List and ByKey
	// need none of the indexes an upgrade adds.
	return j, nil
}

// walFiles checks, for a read-only Open, that SQLite can read the file at
// path, whose first bytes are head, without creating a file beside it: a
// file in WAL mode (its header's read version, byte 19, is 2), or one with
// a -wal file, needs its -wal and -shm files. When either is missing, no
// WAL holds a commit the file lacks, or none that SQLite could read:
// walFiles then checks the header's application_id and user_version as
// Open checks the schema's (ErrCorrupt, ErrVersion, and ErrOldVersion for
// a jar of an older version), and refuses a jar with ErrReadOnly.
func walFiles(path string, head []byte) error {
	walMode := len(head) > 19 && head[19] == 2
	var missing []string
	for _, suffix := range []string{"-wal", "-shm"} {
		_, err := os.Stat(path + suffix)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = append(missing, suffix)
		case err != nil:
			return wrapf(permission(err), "open %s", path)
		case suffix == "-wal":
			walMode = true
		}
	}
	if !walMode || len(missing) == 0 {
		return nil
	}
	if len(head) >= sqliteHeader {
		app, version := binary.BigEndian.Uint32(head[68:]), binary.BigEndian.Uint32(head[60:])
		if err := checkIDs(int32(app), int32(version), ""); err != nil {
			return wrapf(err, "open %s", path)
		}
		if version < schemaVersion {
			// Opened for writing, to create the two files, it would be
			// upgraded too: ErrOldVersion says so, where ErrReadOnly
			// alone would say that the files are all it lacks.
			return wrapf(older(int(version)), "open %s", path)
		}
	}
	files := strings.Join(missing, " and ") + " file is"
	if len(missing) > 1 {
		files = strings.Join(missing, " and ") + " files are"
	}
	return wrapf(fmt.Errorf("%w: the file is in WAL mode and its %s missing, which SQLite would create to read it (a program that has the jar open keeps them; opening the jar once without ReadOnly creates them, and its Close keeps them)",
		ErrReadOnly, files), "open %s", path)
}

// canWrite checks that conn may write to the jar whose schema Open only
// read: SQLite answers SQLITE_READONLY when the file, its -wal or its -shm
// file is read-only to this process. It tries BEGIN IMMEDIATE without
// waiting (busy_timeout 0) and rolls back at once. When another connection
// holds the write lock, SQLite answers SQLITE_BUSY, which it does only
// after those read-only checks passed: that is a yes, and Open does not
// wait for that writer. busyMillis is the busy_timeout to restore.
func canWrite(ctx context.Context, conn *sql.Conn, busyMillis string) error {
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		return err
	}
	tx, err := conn.BeginTx(ctx, nil) // IMMEDIATE: the writer's _txlock
	if err == nil {
		err = tx.Rollback()
	} else if isSQLiteCode(err, sqlite3.SQLITE_BUSY) {
		err = nil
	}
	if _, rerr := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+busyMillis); err == nil {
		err = rerr
	}
	return err
}

// dirPath refuses a path that ends in a separator ("keys.db/"), which
// filepath.Abs would clean into the file's name: for the OS it names a
// directory, and os.Open fails on it with ENOTDIR when it is a file, with
// ENOENT when it does not exist. dirPath returns the same, nothing
// created; a directory is refused later, as one.
func dirPath(path string) error {
	if !os.IsPathSeparator(path[len(path)-1]) {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		err = syscall.ENOTDIR // a system that found the file all the same
	default:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
	}
	return fmt.Errorf("keyjar: open %s: %w (a path that ends in a separator names a directory; a jar is a file)", path, err)
}

// sqliteMagic starts every SQLite database file.
var sqliteMagic = []byte("SQLite format 3\x00")

// sqliteHeader is the size of a SQLite database file's header.
const sqliteHeader = 100

// createFile creates the jar file with mode 0600 unless it exists or create
// is false, and checks that an existing, non-empty file is a SQLite
// database. It reports whether it created the file. A symbolic link to a
// file that does not exist yet names that file, which it creates.
func createFile(path string, create bool) (created bool, err error) {
	for name, i := path, 0; create && i < maxLinks; i++ {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			return true, f.Close()
		}
		if errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("keyjar: %w (Open creates the jar file, not its directory)", err)
		}
		if !errors.Is(err, os.ErrExist) {
			return false, fmt.Errorf("keyjar: %w", permission(err)) // err names the path
		}
		// O_EXCL does not follow a symbolic link: one that points to
		// nothing yet is created through, as SQLite would open it.
		var dangling bool
		if name, dangling = danglingLink(name); !dangling {
			break
		}
	}
	_, err = checkFile(path, os.O_RDWR)
	return false, err
}

// maxLinks bounds the symbolic links createFile follows, as Linux's
// MAXSYMLINKS does a path's.
const maxLinks = 40

// danglingLink returns the path that the symbolic link name points to, and
// true, when nothing is there.
func danglingLink(name string) (string, bool) {
	if _, err := os.Stat(name); !errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	target, err := os.Readlink(name)
	if err != nil {
		return "", false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(name), target)
	}
	return target, true
}

// checkFile opens the existing file at path with flag (os.O_RDWR or
// os.O_RDONLY), checks that it is a regular file and, unless it is empty,
// a SQLite database, and returns its first bytes: its header, or as much
// of it as the file holds (none when empty).
func checkFile(path string, flag int) (head []byte, err error) {
	// O_NONBLOCK: opened for reading alone, a FIFO would wait for a writer.
	f, err := os.OpenFile(path, flag|syscall.O_NONBLOCK, 0)
	if err != nil {
		if fi, serr := os.Stat(path); serr == nil && fi.IsDir() {
			return nil, fmt.Errorf("%w: %s is a directory", ErrCorrupt, path)
		} else if serr == nil && fi.Mode()&fs.ModeSocket != 0 {
			// A socket, which no open takes (ENXIO).
			return nil, fmt.Errorf("%w: %s is not a regular file (%v)", ErrCorrupt, path, fi.Mode().Type())
		}
		return nil, fmt.Errorf("keyjar: %w", permission(err))
	}
	defer f.Close()
	// A FIFO or a device is no jar, and reading one may never end. A
	// directory opens for reading alone.
	if fi, err := f.Stat(); err != nil {
		return nil, wrapf(err, "open %s", path)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is a directory", ErrCorrupt, path)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%v)", ErrCorrupt, path, fi.Mode().Type())
	}
	head = make([]byte, sqliteHeader)
	n, err := io.ReadFull(f, head)
	switch {
	case n == 0 && err == io.EOF:
		return nil, nil // empty: a new database
	case err != nil && err != io.ErrUnexpectedEOF:
		return nil, wrapf(err, "open %s", path)
	case !bytes.HasPrefix(head[:n], sqliteMagic):
		return nil, fmt.Errorf("%w: %s is not a SQLite database", ErrCorrupt, path)
	}
	return head[:n], nil
}

func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil // directories cannot be opened for fsync there
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

// Close waits for the writes already accepted, stops the committer and
// closes the file. Everything committed before is then on stable storage.
// The -wal and -shm files stay beside the jar file, the -wal file emptied
// when no other connection has the file open. Close returns ErrClosed when
// the jar was already closed, and ErrMoved when the jar's path no longer
// names its file (see File in the package doc): what was committed is not
// there. It is in the file the jar opened, wherever that went, and the
// -wal file at the path is emptied, so that a file put in the jar's place
// is not read with the jar's pages. When deferred changes were dropped on
// an error since the jar was opened, those Close wrote included, Close
// returns an error matching idem.ErrDropped that counts them, after
// closing the jar.
//
// Close does not wait for the calls of an idem.Transport over the jar: one
// still running when it closes records nothing more, its outcome included
// (an answer that came still reaches its caller). Its operation stays
// pending, leased until the lease ends, and a resume gets the server's
// replay. Close the jar once the calls through it have returned, as
// package client's Close does.
func (j *Jar) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrClosed
	}
	j.closed = true
	if j.readOnly { // nothing to write, nothing to sync
		j.mu.Unlock()
		if err := j.closeDBs(); err != nil {
			return wrapf(err, "close %s", j.path)
		}
		return nil
	}
	close(j.queue)
	j.mu.Unlock()
	<-j.done
	// Changes committed with synchronous=NORMAL are in the WAL, not yet
	// synced. SQLite syncs them when the last connection to the file
	// closes, with a checkpoint; while another process has the file open,
	// it does not. The WAL is synced here either way.
	err := j.syncWAL()
	if merr := j.moved(false); merr != nil {
		err = errors.Join(err, merr, j.checkpointMoved(merr))
	}
	if kerr := j.keepWAL(); kerr != nil {
		err = errors.Join(err, kerr)
	}
	if cerr := j.closeDBs(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	openJars.remove(j)
	if derr := j.drops.Err(); derr != nil {
		err = errors.Join(err, derr)
	}
	if err != nil {
		return wrapf(err, "close %s", j.path)
	}
	return nil
}

// moved returns ErrMoved when the jar's path no longer names the file
// that SQLite opened: it was removed, renamed or replaced by another file,
// or, for a path through a symbolic link, the link (of the file, or of a
// directory above it: a deploy's "current") now leads to another one,
// which is what the next program that opens the path opens; and, with
// wal, when the path's -wal file is not the one SQLite writes. SQLite
// writes on to the files it has open, and in WAL mode reports none of
// this. It costs one stat of each path, and one more through a link.
func (j *Jar) moved(wal bool) error {
	err := sameFile(j.path, j.file)
	if err == nil && j.given != "" {
		err = sameFile(j.given, j.file)
	}
	if err == nil && wal {
		if err = sameFile(j.path+"-wal", j.wal); err != nil {
			err = fmt.Errorf("%w (Close writes what the jar committed into the jar file)", err)
		}
	}
	return err
}

// sameFile returns ErrMoved when path no longer names the file was.
func sameFile(path string, was os.FileInfo) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrMoved, err)
	case err != nil:
		return permission(err)
	case !os.SameFile(fi, was):
		return fmt.Errorf("%w: %s is another file now", ErrMoved, path)
	}
	return nil
}

// checkpointMoved writes the WAL into the file the jar opened and empties
// it, when moved, the error of moved, is ErrMoved. SQLite does not do so as
// it closes a file that moved, and would leave its WAL at the jar's path,
// where the next program that opens a file there takes it for that file's
// own and reads the jar's pages in place of its.
func (j *Jar) checkpointMoved(moved error) error {
	if !errors.Is(moved, ErrMoved) {
		return nil
	}
	var busy, frames, done int
	// It waits for the other connections up to BusyTimeout, not a slice.
	ctx := context.Background()
	full := strconv.FormatInt(sqliteopt.BusyTimeoutMillis(j.busyTimeout), 10)
	if _, err := j.wconn.ExecContext(ctx, "PRAGMA busy_timeout = "+full); err != nil {
		return classify(err)
	}
	defer j.wconn.ExecContext(ctx, "PRAGMA busy_timeout = "+j.busySlice)
	err := j.wconn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &done)
	if err == nil && busy != 0 {
		err = fmt.Errorf("%w: the -wal file could not be emptied (%d of its %d frames written into the jar file)", ErrLocked, done, frames)
	}
	return classify(err)
}

// syncWAL fsyncs the jar's WAL file, when it has one.
func (j *Jar) syncWAL() error {
	path := j.path + "-wal"
	if j.hooks.syncFile != nil {
		j.hooks.syncFile(path)
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// walSizeLimit is the size, in bytes, down to which SQLite truncates the
// -wal file when it restarts it after a checkpoint: a little more than the
// 1000 pages at which it checkpoints on its own.
const walSizeLimit = 8 << 20

// keepWAL makes the writer's connection, the last one to close, leave the
// -wal and -shm files in place when it closes the file: SQLite then still
// checkpoints the WAL into the jar file, and truncates it to nothing
// (journal_size_limit 0), but does not delete the two files. A WAL-mode
// file can be read without writing anything only when they exist, and a
// reader that may not write the directory cannot create them
// (Options.ReadOnly).
func (j *Jar) keepWAL() error {
	ctx := context.Background()
	if _, err := j.wconn.ExecContext(ctx, "PRAGMA journal_size_limit = 0"); err != nil {
		return err
	}
	return sqliteopt.KeepWAL(j.wconn)
}

// closeDBs closes the readers first, so that the writer is the last
// connection: SQLite then checkpoints the WAL into the database file.
func (j *Jar) closeDBs() error {
	var errs []error
	if j.reader != nil {
		errs = append(errs, j.reader.Close())
	}
	errs = append(errs, j.stmts.close())
	if j.wconn != nil {
		errs = append(errs, j.wconn.Close())
	}
	if j.writer != nil {
		errs = append(errs, j.writer.Close())
	}
	return errors.Join(errs...)
}

// errEmpty is the error of an open that needs a jar and finds an empty
// file at abs, or a SQLite file without the jar's tables: what a program
// killed while it created its jar leaves, and its next Open that may
// create one makes a jar.
func errEmpty(abs string) error {
	return fmt.Errorf("%w: %s is empty: it holds no operation (a program stopped while it created its jar leaves such a file, which the program makes a jar when it next opens it)", ErrCorrupt, abs)
}
