package keyjar_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/keyjar"
)

// TestDiskFull writes to a jar until the file system refuses more, the
// limit on the size of the process's files (RLIMIT_FSIZE) standing in for
// a full disk: the Begin that cannot be written fails, nothing it
// returned before is lost, and once there is room again the same jar
// begins operations as before, in a file SQLite finds sound.
func TestDiskFull(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "keys.db")
	j := openPath(t, path, nil)
	if _, _, err := j.Begin(ctx, newRecord("first")); err != nil {
		t.Fatal(err)
	}
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &was); err != nil {
		t.Fatal(err)
	}
	var largest int64
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		largest = max(largest, fi.Size())
	}
	full := was
	full.Cur = uint64(largest) + 64<<10
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &was); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()

	body := []byte(strings.Repeat("b", 4000))
	var acked []string
	var failed error
	for i := range 1000 { // 4 MB at most; the limit is far lower
		r := newRecord(fmt.Sprint("op-", i))
		r.Body, r.BodySize = body, int64(len(body))
		if _, _, err := j.Begin(ctx, r); err != nil {
			failed = err
			break
		}
		acked = append(acked, r.Op)
	}
	restore()
	if failed == nil {
		t.Fatalf("1000 Begins of 4 kB each within a limit of %d bytes succeeded; want a failure", full.Cur)
	}
	if errors.Is(failed, keyjar.ErrCorrupt) || errors.Is(failed, keyjar.ErrLocked) {
		t.Errorf("Begin on a full disk: %v; want the write's failure, not a damaged or locked jar", failed)
	}
	t.Logf("after %d Begins: %v", len(acked), failed)

	if _, _, err := j.Begin(ctx, newRecord("after")); err != nil {
		t.Fatalf("Begin once there is room again: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if got := integrityCheck(t, path); got != "ok" {
		t.Fatalf("integrity_check after the full disk: %s", got)
	}
	j = openPath(t, path, nil)
	for _, op := range append(acked, "first", "after") {
		if r, err := j.Get(ctx, op); err != nil || r.Key != "key-"+op {
			t.Errorf("%s after the full disk: key %q, %v; want key-%s", op, r.Key, err, op)
		}
	}
}
