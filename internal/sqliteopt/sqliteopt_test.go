package sqliteopt

import (
	"context"
	"database/sql"
	"math"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

func TestBusyTimeoutMillis(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{5 * time.Second, 5000},
		{24 * 24 * time.Hour, 24 * 24 * 3600 * 1000},
		{30 * 24 * time.Hour, math.MaxInt32},
		{math.MaxInt64, math.MaxInt32},
	} {
		if got := BusyTimeoutMillis(tt.d); got != tt.want {
			t.Errorf("BusyTimeoutMillis(%v) = %d; want %d", tt.d, got, tt.want)
		}
	}
}

// TestSetWAL switches a file to WAL mode while another connection holds
// its write lock: SQLite refuses the switch with SQLITE_BUSY, and SetWAL
// tries again, here once the other connection has let go.
func TestSetWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(1)")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db
	}
	other := open()
	if _, err := other.Exec("CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin() // BEGIN IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	q := &releasing{db: open(), release: func() { tx.Rollback() }}
	mode, err := SetWAL(t.Context(), q, time.Minute)
	if err != nil || mode != "wal" || q.calls != 2 {
		t.Fatalf("SetWAL = %q, %v after %d tries; want wal after 2, the first refused while the other connection held the lock", mode, err, q.calls)
	}
}

// releasing counts the statements run through it and calls release before
// the second.
type releasing struct {
	db      *sql.DB
	release func()
	calls   int
}

func (r *releasing) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if r.calls++; r.calls == 2 {
		r.release()
	}
	return r.db.QueryRowContext(ctx, query, args...)
}
