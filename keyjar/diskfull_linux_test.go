package keyjar_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem"
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

// tmpfsEnv tells the child of TestFailedCommitCreatesNothing that it runs in
// a mount namespace of its own, where it may mount a file system.
const tmpfsEnv = "KEYJAR_TEST_TMPFS"

// TestFailedCommitCreatesNothing fills a small file system (a tmpfs) as
// the jar's WAL grows past the frames that the first 32 kB of its -shm
// file index: the COMMIT of the Begin that crosses it writes all of its
// frames to the -wal file, then fails to grow the -shm file for want of
// space. That Begin failed, and the jar must not hold its key later
// either: not once it is closed, on that full disk, and opened again.
// (SQLite rolls the transaction back in memory, but a recovery of the WAL
// finds its frames whole.) The WAL grows past that point only when no
// checkpoint empties it: a reader holds it here, as a long read of
// another process would. The test runs as a child in a user and mount
// namespace of its own, where it may mount the tmpfs.
func TestFailedCommitCreatesNothing(t *testing.T) {
	if os.Getenv(tmpfsEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFailedCommitCreatesNothing$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), tmpfsEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Skipf("cannot run the test in a user and mount namespace of its own, to mount a tmpfs there: %v", err)
		}
		t.Logf("child:\n%s", out)
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		return
	}
	ctx := t.Context()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a tmpfs in the child's mount namespace: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	path := filepath.Join(dir, "keys.db")
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, newRecord("first")); err != nil {
		t.Fatal(err)
	}
	reader := rawDB(t, path, "")
	tx, err := reader.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM operations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// The first 32 kB of the -shm file index 4062 frames; each Begin
	// here adds a few frames of 4 kB.
	const indexed = 4062
	body := []byte(strings.Repeat("b", 3000))
	acked := []string{"first"}
	i := 0
	for ; walFrames(t, path) < indexed-100; i++ {
		r := newRecord(fmt.Sprint("op-", i))
		r.Body, r.BodySize = body, int64(len(body))
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
		acked = append(acked, r.Op)
	}
	filler := filepath.Join(dir, "filler")
	var failed []string // the Begins that failed
	shm := false        // whether one failed to grow the -shm file
	for end := i + 200; i < end && !shm; i++ {
		// Room for a Begin's frames (most of the time), less than the
		// 32 kB the -shm file grows by.
		leave(t, dir, filler, 7)
		r := newRecord(fmt.Sprint("op-", i))
		before := walFrames(t, path)
		_, _, err := j.Begin(ctx, r)
		if err == nil {
			acked = append(acked, r.Op)
			continue
		}
		failed = append(failed, r.Op)
		t.Logf("Begin %s, the WAL at frame %d: %v", r.Op, before, err)
		// ENOSPC: no room for the frames; otherwise the frames went into
		// the WAL and the -shm file did not grow.
		shm = !errors.Is(err, syscall.ENOSPC) && walFrames(t, path) > indexed
	}
	if !shm {
		t.Fatalf("no Begin failed to grow the -shm file past frame %d of the WAL", indexed)
	}
	tx.Rollback()
	reader.Close()
	if err := j.Close(); err != nil {
		t.Logf("Close on the full file system: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	j = openPath(t, path, nil)
	for _, op := range failed {
		if r, err := j.Get(ctx, op); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("%s, whose Begin failed, after a reopen: state %q, key %q, %v; want ErrNotFound", op, r.State, r.Key, err)
		}
	}
	for _, op := range acked {
		if _, err := j.Get(ctx, op); err != nil {
			t.Errorf("%s, whose Begin succeeded, after a reopen: %v", op, err)
		}
	}
}

// walFrames returns how many frames of 4 kB pages the -wal file of the jar
// at path holds.
func walFrames(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	return (fi.Size() - 32) / (4096 + 24)
}

// leave makes filler, a file in dir, as large as leaves the file system
// pages of 4 kB free.
func leave(t *testing.T, dir, filler string, pages int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	var size int64
	if fi, err := os.Stat(filler); err == nil {
		size = fi.Size()
	}
	want := max(0, size+int64(st.Bavail)*int64(st.Bsize)-pages*4096)
	f, err := os.OpenFile(filler, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if want <= size {
		err = f.Truncate(want)
	} else {
		_, err = f.WriteAt(make([]byte, want-size), size)
	}
	if err != nil {
		t.Fatal(err)
	}
}
