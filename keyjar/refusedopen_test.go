package keyjar_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/internal/sqliteopt"
	"github.com/idemkit/idem/keyjar"
)

// TestRefusedOpenKeepsWALFiles: an Open for writing that refuses a jar it
// may not write (one of an older schema version with MustExist, as idemctl's
// resume, abandon, forget and prune open it; one of a newer version) leaves
// its -wal and -shm files in place, as Close does: without them a read-only
// Open (idemctl's list, show and export) of that jar fails until a program
// opens it for writing. A jar that had none is left without.
func TestRefusedOpenKeepsWALFiles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  []string
		opts    *keyjar.Options
		want    error
		readsOK bool // a read-only Open reads the jar afterwards
		noSides bool // the jar has no -wal and -shm files before the Open
	}{
		{"version 1 with MustExist", []string{"DROP INDEX operations_by_state_created", "PRAGMA user_version = 1"},
			&keyjar.Options{MustExist: true}, keyjar.ErrOldVersion, true, false},
		{"newer version", []string{"PRAGMA user_version = 99"}, nil, keyjar.ErrVersion, false, false},
		{"version 1 without its files", []string{"DROP INDEX operations_by_state_created", "PRAGMA user_version = 1"},
			&keyjar.Options{MustExist: true}, keyjar.ErrOldVersion, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			j, err := keyjar.Open(t.Context(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			// Change the schema through a connection that, like the jar's,
			// leaves the -wal and -shm files when it closes.
			db := rawDB(t, path, "")
			conn, err := db.Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range tc.change {
				if _, err := conn.ExecContext(t.Context(), q); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.noSides {
				if err := sqliteopt.KeepWAL(conn); err != nil {
					t.Fatal(err)
				}
			}
			conn.Close()
			db.Close()
			for _, suffix := range []string{"-wal", "-shm"} {
				if _, err := os.Stat(path + suffix); (err == nil) == tc.noSides {
					t.Fatalf("before the Open: %s: %v; want it there: %v", suffix, err, !tc.noSides)
				}
			}
			if _, err := keyjar.Open(t.Context(), path, tc.opts); !errors.Is(err, tc.want) {
				t.Fatalf("Open = %v; want %v", err, tc.want)
			}
			for _, suffix := range []string{"-wal", "-shm"} {
				if _, err := os.Stat(path + suffix); (err == nil) == tc.noSides {
					t.Errorf("after the refused Open: %s: %v; want it there: %v", suffix, err, !tc.noSides)
				}
			}
			ro, err := keyjar.Open(t.Context(), path, readOnly)
			if tc.readsOK {
				if err != nil {
					t.Fatalf("read-only Open after the refused Open: %v", err)
				}
				ro.Close()
			} else if !errors.Is(err, tc.want) {
				t.Errorf("read-only Open after the refused Open: %v; want %v", err, tc.want)
			}
		})
	}
}
