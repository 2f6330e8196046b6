package keyjar

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemkit/idem/internal/errprefix"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Errors returned by Open and the Jar's methods, besides idem.ErrNotFound,
// idem.ErrLeased and idem.ErrLeaseLost, which the methods return as the
// idem.Jar contract says. Each is wrapped with details: test with errors.Is.
// A full disk is none of them: Open and the methods return an error wrapping
// syscall.ENOSPC, as an os.File write does (see Open). Nor is a jar file
// that cannot be written (its mode, its directory's, a read-only file
// system): Open, and a method whose write SQLite refuses for it, return an
// error wrapping fs.ErrPermission, as os.OpenFile does. ErrReadOnly is for
// a jar opened with Options.ReadOnly.
var (
	// ErrClosed is returned by every method of a Jar after Close, Close
	// included, whatever its other arguments (an invalid record included).
	ErrClosed = errors.New("keyjar: jar is closed")

	// ErrCorrupt is returned by Open for a file that is not a key jar (not a
	// SQLite database, or a database of some other program), and with
	// Options.MustExist or Options.ReadOnly for an empty file, and by any
	// method that finds the file damaged.
	ErrCorrupt = errors.New("keyjar: file is not a key jar or is corrupt")

	// ErrLocked is returned by Open and by any method when another
	// connection or process held a lock on the file for longer than
	// Options.BusyTimeout (for example a connection in
	// locking_mode=EXCLUSIVE).
	ErrLocked = errors.New("keyjar: jar file is locked by another connection")

	// ErrVersion is returned by Open for a jar written by a newer version of
	// this package (its schema version is higher than this package knows).
	ErrVersion = errors.New("keyjar: jar file has a newer schema version")

	// ErrInvalid is returned by Begin for a record without Op or Key, or
	// with a State that is not valid, by Update and Defer for a Change with
	// an invalid State, and by Begin, Acquire and Update for a time that
	// cannot be stored (outside the years 1678 to 2262). Nothing is
	// written.
	ErrInvalid = errors.New("keyjar: invalid record")

	// ErrReadOnly is returned by every method of a Jar opened with
	// Options.ReadOnly that would write (Begin, Acquire, Update, Defer,
	// Forget, ForgetKey, AbandonKey, Prune), whatever its other arguments (an invalid
	// record or a done context included; after Close, ErrClosed), which
	// then writes nothing, and by such an
	// Open for a jar it could read only by writing: one in WAL mode whose
	// -wal or -shm file is missing, which SQLite would create (as would
	// an Open without ReadOnly, which upgrades a jar of an older schema
	// version: ErrOldVersion then, which matches ErrReadOnly too).
	ErrReadOnly = errors.New("keyjar: jar is read-only")

	// ErrOldVersion is returned by Open with Options.MustExist for a jar
	// of an older schema version (1, before the index List with a State
	// reads), which MustExist does not upgrade, as pgjar's does not: a
	// program built with an earlier version of this package refuses the
	// jar once upgraded, and one that only opens a jar it did not create
	// (idemctl) must not do that to the program that did. And by Open with
	// Options.ReadOnly for such a jar whose -wal or -shm file is missing:
	// an Open without ReadOnly would create them and upgrade it, a write
	// (with them, Open reads the jar as it is); that one matches
	// ErrReadOnly too (errors.Is), as it did before it was told apart.
	// It is wrapped with the jar's version.
	ErrOldVersion error = oldVersion{}

	// ErrOptions is returned by Open for an Options field out of range: a
	// negative BusyTimeout or MaxBatch, or a MaxBatch above 65536. It is
	// wrapped with the field and its value. Nothing is created.
	ErrOptions = errors.New("keyjar: invalid options")

	// ErrMoved is returned by Begin and by Close when the jar's path no
	// longer names the file Open opened: the file was removed, renamed or
	// replaced by another while the jar had it open, or a symbolic link on
	// the path (to the file, or to a directory above it) now leads to
	// another file. SQLite writes on to
	// the file it opened, where no program that opens the path finds what
	// it wrote. Begin returns it too when the jar's -wal file was removed
	// or replaced, whose commits only Close writes into the jar file. A
	// Begin that returns it committed nothing: the check comes before the
	// commit. It is wrapped with the path, and with the error that found
	// it missing (fs.ErrNotExist) when nothing is there. A read (Get, List,
	// ByKey) that fails once the file moved returns it too, with SQLite's
	// error after it: one that needs a new connection to the file finds
	// nothing at the path to open (a read over a connection already open
	// reads on from the file that moved). Open returns it
	// for a path from which a jar this process still has open moved: its
	// -wal and -shm files are still there, which SQLite would take for the
	// files of a file opened at the path; close that jar first. So does
	// Open of a path where no jar file is, or an empty one, but a -wal
	// file with commits: another jar file's, moved away while open.
	ErrMoved = errors.New("keyjar: jar file was removed, renamed or replaced while open")
)

// oldVersion is ErrOldVersion's type. Its Is makes it ErrReadOnly too, as
// syscall.ENOENT's makes it fs.ErrNotExist: one error of its own, which a
// caller that asks for the more general one (ErrReadOnly, all an Open with
// ReadOnly could not do without writing) still matches, with "keyjar: "
// said once in its message, where wrapping both sentinels would say it
// twice.
// Only the read-only Open's matches ErrReadOnly: MustExist's is an Open
// that could write.
type oldVersion struct{ readOnly bool }

func (oldVersion) Error() string { return "keyjar: jar file has an older schema version" }

func (e oldVersion) Is(target error) bool {
	return target == ErrOldVersion || (e.readOnly && target == ErrReadOnly)
}

// wrapf returns err after "keyjar: " and what format says happened, with
// "keyjar: " said once (errprefix.Wrapf).
func wrapf(err error, format string, args ...any) error {
	return errprefix.Wrapf("keyjar", err, format, args...)
}

// classify turns a driver error into one of the sentinels above when it is
// one of them, keeping the original error in the chain.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("%w: %w", ErrLocked, err)
	case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_FORMAT:
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return fmt.Errorf("%w: %w", fs.ErrPermission, err)
	case sqlite3.SQLITE_FULL:
		// The disk or the file system is full (or the database reached
		// its max_page_count): the OS's ENOSPC, as an os.File write would
		// report it.
		return fmt.Errorf("%w: %w", syscall.ENOSPC, err)
	}
	return err
}

// damaged classifies err as classify does and, when SQLite ran out of
// memory, checks the file: a damaged record or page that claims a huge size
// makes SQLite fail an allocation (SQLITE_NOMEM) where it would otherwise
// report SQLITE_CORRUPT. A check that finds the file damaged makes the
// error ErrCorrupt, with the check's first finding.
func (j *Jar) damaged(err error) error {
	err = classify(err)
	if !isSQLiteCode(err, sqlite3.SQLITE_NOMEM) || j.reader == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	var finding string
	switch cerr := j.reader.QueryRowContext(ctx, "PRAGMA quick_check(1)").Scan(&finding); {
	case cerr != nil && isSQLiteCode(cerr, sqlite3.SQLITE_CORRUPT):
		return fmt.Errorf("%w: %w (%v)", ErrCorrupt, err, cerr)
	case cerr == nil && finding != "ok":
		return fmt.Errorf("%w: %w (%s)", ErrCorrupt, err, finding)
	}
	return err
}

// checkTimeout bounds the check damaged makes: a quick_check reads the
// whole file, seconds for a jar of millions of operations.
const checkTimeout = 30 * time.Second

// permission adds fs.ErrPermission to an error of a read-only file system
// (EROFS), which does not match it by itself: either way the jar cannot be
// written, and Open documents fs.ErrPermission for that.
func permission(err error) error {
	if errors.Is(err, syscall.EROFS) && !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: %w", fs.ErrPermission, err)
	}
	return err
}

func openError(path string, err error, readOnly bool) error {
	if isSQLiteCode(err, sqlite3.SQLITE_CANTOPEN) {
		if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) {
			// Removed since Open checked it: SQLite's mode=rw does not
			// create it again, nor does mode=ro.
			return fmt.Errorf("keyjar: open %s: %w: %w", path, err, serr)
		}
		if cause := cantOpen(path, readOnly); cause != nil {
			return fmt.Errorf("keyjar: open %s: %w: %w", path, err, permission(cause))
		}
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_READONLY_DIRECTORY {
		// The file may be written, but not the -wal and -shm files that
		// SQLite must create beside it.
		return fmt.Errorf("keyjar: open %s: %w: the directory %s cannot be written, and the jar keeps its -wal and -shm files there",
			path, classify(err), filepath.Dir(path))
	}
	return wrapf(classify(err), "open %s", path)
}

// cantOpen finds why SQLite could not open the files beside the database
// (the -wal and -shm files, which it creates in the same directory), so that
// a permission problem is reported as one (fs.ErrPermission). For a
// read-only jar, it opens them for reading, and creates no file.
func cantOpen(path string, readOnly bool) error {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		f, err := os.OpenFile(p, flag, 0)
		if err == nil {
			f.Close()
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if readOnly {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".keyjar-probe-*")
	if err != nil {
		return err
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// isSQLiteError reports whether err is, or wraps, an error of SQLite's.
func isSQLiteError(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se)
}

// isSQLiteCode reports whether err is a SQLite error with the primary result
// code code.
func isSQLiteCode(err error, code int) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == code
}
