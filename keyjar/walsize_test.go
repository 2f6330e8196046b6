package keyjar_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// TestWALShrinksAfterABurst: a burst of writes while a reader holds a
// snapshot (idemctl list, a backup) grows the jar's -wal file; once the
// reader is gone and SQLite restarts the WAL, the file gives the excess
// back while the jar is open, not at Close only.
func TestWALShrinksAfterABurst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.db")
	ctx := context.Background()
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// Another process's reader, holding a read transaction.
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM operations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 2000))
	begin := func(prefix string, count int) {
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < count; i += 16 {
					now := time.Now()
					op := fmt.Sprintf("%s-%d", prefix, i)
					if _, _, err := j.Begin(ctx, idem.Record{Op: op, Key: op, State: idem.StateDone, Body: body, BodySize: 2000, Created: now, Updated: now}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	begin("burst", 4000)
	fi, _ := os.Stat(path + "-wal")
	peak := fi.Size()
	tx.Rollback()
	db.Close()
	begin("after", 2000) // enough for SQLite's auto-checkpoints, which now complete
	fi, _ = os.Stat(path + "-wal")
	t.Logf("-wal: %d bytes after the burst, %d bytes later", peak, fi.Size())
	if peak <= keyjar.WALSizeLimit {
		t.Fatalf("the burst grew the WAL to %d bytes only: the reader did not hold it", peak)
	}
	if fi.Size() > keyjar.WALSizeLimit {
		t.Errorf("-wal file still %d bytes (peak %d, limit %d) after the reader left and the WAL restarted", fi.Size(), peak, keyjar.WALSizeLimit)
	}
}
