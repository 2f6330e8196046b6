// Package sqliteopt turns the names and options of this module's SQLite
// files (keyjar, sqlitestore) into what SQLite accepts, and switches the
// files to WAL mode.
package sqliteopt

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"time"

	"modernc.org/sqlite"
)

// URI returns the modernc.org/sqlite data source name of the file at path,
// which must be absolute, with the query parameters params (name, value
// pairs): a file: URI whose path is escaped, so that SQLite opens the file
// of exactly that name, '?', '#' and '%' included, and reads no parameter
// from it.
func URI(path string, params ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(params); i += 2 {
		q.Add(params[i], params[i+1])
	}
	p := filepath.ToSlash(path)
	if p[0] != '/' {
		p = "/" + p // a Windows volume: file:///C:/...
	}
	u := url.URL{Scheme: "file", Path: p, RawQuery: q.Encode()}
	return u.String() // file:///path?query, with the path %-escaped
}

// BusyTimeoutMillis returns the busy_timeout pragma's value for a wait of d,
// which must be positive: SQLite reads it as a 32-bit count of
// milliseconds, where 0 (and so a wait under 1 ms, or one truncated to 32
// bits) means not to wait at all. A wait under 1 ms is 1 ms, and one above
// 2^31-1 ms (about 24.8 days), the longest SQLite can wait, is that.
func BusyTimeoutMillis(d time.Duration) int64 {
	return min(max(d.Milliseconds(), 1), math.MaxInt32)
}

// SetWAL switches the database to WAL mode and returns the journal mode it
// is in. Two connections switching a new file at once can each hold the
// shared lock the other needs to give up: SQLite then answers SQLITE_BUSY at
// once, without waiting, so SetWAL tries again until busyTimeout or ctx
// ends. q is a *sql.Conn or, with one connection, a *sql.DB.
func SetWAL(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, busyTimeout time.Duration) (mode string, err error) {
	deadline := time.Now().Add(busyTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err = q.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
		if err == nil || !isBusy(err) || time.Now().After(deadline) {
			return mode, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return mode, err
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY, from a driver whose
// errors tell their result code (modernc.org/sqlite's *Error).
func isBusy(err error) bool {
	const sqliteBusy = 5 // the primary result code, in the low byte
	var c interface{ Code() int }
	return errors.As(err, &c) && c.Code()&0xff == sqliteBusy
}

// KeepWAL makes conn, when it is the last connection to its file to close,
// leave the file's -wal and -shm files in place (SQLITE_FCNTL_PERSIST_WAL):
// a WAL-mode file can be read without writing anything only when they
// exist, and a reader that may not write the directory cannot create them.
// On a file not in WAL mode it changes nothing.
func KeepWAL(conn *sql.Conn) error {
	return conn.Raw(func(dc any) error {
		fc, ok := dc.(sqlite.FileControl)
		if !ok {
			return fmt.Errorf("the driver's connection (%T) has no file controls", dc)
		}
		_, err := fc.FileControlPersistWAL("main", 1)
		return err
	})
}
