package keyjar_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// FuzzOpen opens arbitrary file bytes: Open never panics, and fails, if it
// fails, with ErrCorrupt or ErrVersion. A jar that opens answers Begin and
// List, or fails with ErrCorrupt.
func FuzzOpen(f *testing.F) {
	jar := filepath.Join(f.TempDir(), "seed.db")
	newJarFile(f, jar)
	valid, err := os.ReadFile(jar)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add([]byte{})
	f.Add([]byte("SQLite format 3\x00"))
	f.Add(valid[:100])
	f.Add(valid[:len(valid)/2])
	f.Add([]byte("\x00\x00\x00\x00 not a database at all"))

	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "keys.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		j, err := keyjar.Open(ctx, path, &keyjar.Options{BusyTimeout: 10 * time.Millisecond})
		if err != nil {
			if !errors.Is(err, keyjar.ErrCorrupt) && !errors.Is(err, keyjar.ErrVersion) {
				t.Fatalf("Open: %v; want ErrCorrupt or ErrVersion", err)
			}
			return
		}
		defer j.Close()
		if _, _, err := j.Begin(ctx, newRecord("fuzz")); err != nil && !errors.Is(err, keyjar.ErrCorrupt) {
			t.Fatalf("Begin: %v; want nil or ErrCorrupt", err)
		}
		if _, err := j.List(ctx, idem.Filter{}); err != nil && !errors.Is(err, keyjar.ErrCorrupt) {
			t.Fatalf("List: %v; want nil or ErrCorrupt", err)
		}
	})
}
