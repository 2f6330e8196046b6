package keyjar_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// TestReopenKeepsRecords closes the jar and opens the file again, as a
// restarted program does: the operation and its key are still there.
func TestReopenKeepsRecords(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := j.Begin(ctx, newRecord("charge:order-42"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 3, 1, 12, 0, 1, 5, time.UTC)
	want, err := j.Update(ctx, "charge:order-42", "", idem.Change{Now: now, Attempts: 1, LastStatus: 503})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	j = openPath(t, path, nil)
	again := newRecord("charge:order-42")
	again.Key = "a-new-key"
	got, created, err := j.Begin(ctx, again)
	if err != nil || created || got.Key != first.Key {
		t.Fatalf("Begin after reopen = key %q, created %v, %v; want %q, false", got.Key, created, err, first.Key)
	}
	if got.Attempts != 1 || got.LastStatus != 503 || !got.Updated.Equal(want.Updated) {
		t.Errorf("after reopen: attempts %d, status %d, updated %v; want 1, 503, %v",
			got.Attempts, got.LastStatus, got.Updated, want.Updated)
	}
}

// TestCloseSyncsWAL: Close fsyncs the WAL after the jar's last write, so
// that changes committed with synchronous=NORMAL are on stable storage even
// while another connection (another process) keeps the file open, and
// SQLite does not checkpoint it at Close.
func TestCloseSyncsWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	other := openPath(t, path, nil)
	if _, err := other.Get(t.Context(), "op"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatal(err)
	}
	var synced []string
	j, err := keyjar.OpenHooked(t.Context(), path, nil, keyjar.Hooks{SyncFile: func(p string) {
		if _, err := os.Stat(p); err == nil {
			synced = append(synced, p)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := newRecord("op")
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(t.Context(), "op", "", idem.Change{Now: r.Created, State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 0 {
		t.Fatalf("synced %q before Close", synced)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != path+"-wal" {
		t.Fatalf("Close synced %q; want the WAL, %s", synced, path+"-wal")
	}
	if got, err := other.Get(t.Context(), "op"); err != nil || got.State != idem.StateDone {
		t.Fatalf("the other connection reads %v, %v; want the done record", got.State, err)
	}
}

// TestCloseSyncsWALThroughSymlink opens the jar through a symbolic link in
// another directory: SQLite keeps the -wal file beside the file the link
// points to, and Close fsyncs that one.
func TestCloseSyncsWALThroughSymlink(t *testing.T) {
	target := filepath.Join(t.TempDir(), "keys.db")
	newJarFile(t, target)
	link := filepath.Join(t.TempDir(), "link.db")
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	other := openPath(t, target, nil) // keeps the WAL from a checkpoint at Close
	if _, err := other.Get(t.Context(), "op"); err != nil {
		t.Fatal(err)
	}
	var synced []string
	j, err := keyjar.OpenHooked(t.Context(), link, nil, keyjar.Hooks{SyncFile: func(p string) { synced = append(synced, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(t.Context(), "op", "", idem.Change{Now: time.Now(), State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target + "-wal"); err != nil {
		t.Fatalf("no WAL beside the link's target: %v", err)
	}
	if len(synced) != 1 || synced[0] != target+"-wal" {
		t.Fatalf("Close synced %q; want the WAL beside the link's target, %s", synced, target+"-wal")
	}
}

// TestOpenCreatesThroughDanglingSymlink: a symbolic link to a file that
// does not exist yet (a jar kept on a volume, linked from the program's
// directory) is a path to that file: Open creates it there, mode 0600, as
// it creates a missing file, and the -wal and -shm files beside it. With
// MustExist, the same link is a missing jar.
func TestOpenCreatesThroughDanglingSymlink(t *testing.T) {
	target := filepath.Join(t.TempDir(), "keys.db")
	link := filepath.Join(t.TempDir(), "link.db")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := keyjar.Open(t.Context(), link, &keyjar.Options{MustExist: true}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open with MustExist through a link to nothing: %v; want fs.ErrNotExist", err)
	}
	j, err := keyjar.Open(t.Context(), link, nil)
	if err != nil {
		t.Fatalf("Open through a link to a file not yet created: %v", err)
	}
	if _, _, err := j.Begin(t.Context(), newRecord("op")); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(target)
	if err != nil {
		t.Fatalf("no jar file at the link's target: %v", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the link's target is %v; want a regular file of mode 0600", fi.Mode())
	}
	if _, err := os.Stat(target + "-wal"); err != nil {
		t.Fatalf("no WAL beside the link's target: %v", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("the link became %v, %v; want it left a symbolic link", fi, err)
	}
	again := openPath(t, link, &keyjar.Options{MustExist: true})
	if _, err := again.Get(t.Context(), "op"); err != nil {
		t.Fatalf("the jar reopened through the link: %v", err)
	}
}

// TestCloseKeepsWALFiles: Close checkpoints the WAL into the jar file and
// leaves the -wal file, emptied, and the -shm file where they are: SQLite
// reads a WAL-mode file without writing only when they exist, and a reader
// that may not write the directory cannot create them. The jar file alone
// holds every record.
func TestCloseKeepsWALFiles(t *testing.T) {
	j, path := openTemp(t, nil)
	r := newRecord("op")
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(t.Context(), "op", "", idem.Change{Now: r.Created, State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("after Close: %v; want the file kept", err)
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			t.Errorf("%s has mode %v after Close; want 0600", filepath.Base(p), m)
		}
		if strings.HasSuffix(p, "-wal") && fi.Size() != 0 {
			t.Errorf("the -wal file holds %d bytes after Close; want it checkpointed and emptied", fi.Size())
		}
	}
	// The jar file without its -wal and -shm files reads as the jar.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	alone := filepath.Join(t.TempDir(), "alone.db")
	if err := os.WriteFile(alone, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := openPath(t, alone, nil).Get(t.Context(), "op"); err != nil || got.State != idem.StateDone {
		t.Fatalf("the jar file alone: %v, %v; want the done record", got.State, err)
	}
}

// TestFileModes checks that the jar file and SQLite's -wal and -shm files
// beside it are readable by their owner only.
func TestFileModes(t *testing.T) {
	j, path := openTemp(t, nil)
	if _, _, err := j.Begin(t.Context(), newRecord("op")); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Get(t.Context(), "op"); err != nil { // a reader maps the -shm file too
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(p), err)
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			t.Errorf("%s has mode %v; want no access for group and others (0600)", filepath.Base(p), m)
		}
	}
}

// TestNoSecretInFile scans every byte of the jar's files for credentials
// that a caller forgot to strip. A header that is not a secret is found, so
// the scan looks where the headers are.
func TestNoSecretInFile(t *testing.T) {
	const (
		secret  = "Bearer sk_live_7f3a9c1e0b5d"
		cookie  = "session=5c4d3e2f1a0b"
		apiKey  = "ak_9e8d7c6b5a49"
		visible = "visible-marker-3b1f"
	)
	j, path := openTemp(t, nil)
	r := newRecord("op")
	r.Header = http.Header{
		"Authorization":       {secret},
		"Proxy-Authorization": {secret},
		"Cookie":              {cookie},
		"X-Api-Key":           {apiKey},
		"X-Trace":             {visible},
	}
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(t.Context(), "op", "", idem.Change{Now: time.Now(), State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	scan := func(when string) {
		t.Helper()
		var all []byte
		for _, p := range []string{path, path + "-wal"} {
			b, err := os.ReadFile(p)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			all = append(all, b...)
		}
		if !bytes.Contains(all, []byte(visible)) {
			t.Fatalf("%s: the scan does not find the visible header %q in the files", when, visible)
		}
		for _, s := range []string{secret, cookie, apiKey} {
			if bytes.Contains(all, []byte(s)) {
				t.Errorf("%s: the jar's files hold the credential %q", when, s)
			}
		}
	}
	scan("open")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	scan("closed")
}

// TestInvalidInput: bad records are refused with ErrInvalid, and nothing in
// the jar changes.
func TestInvalidInput(t *testing.T) {
	ctx := t.Context()
	j, _ := openTemp(t, nil)
	want, _, err := j.Begin(ctx, newRecord("op"))
	if err != nil {
		t.Fatal(err)
	}
	tooLate := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	tooEarly := time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	edit := func(f func(r *idem.Record)) idem.Record {
		r := newRecord("new")
		f(&r)
		return r
	}
	for name, r := range map[string]idem.Record{
		"empty op":        edit(func(r *idem.Record) { r.Op = "" }),
		"empty key":       edit(func(r *idem.Record) { r.Key = "" }),
		"unknown state":   edit(func(r *idem.Record) { r.State = "sent" }),
		"created in 2300": edit(func(r *idem.Record) { r.Created = tooLate }),
		"updated in 1600": edit(func(r *idem.Record) { r.Updated = tooEarly }),
		"lease in 2300":   edit(func(r *idem.Record) { r.LeaseUntil = tooLate }),
		"existing op":     func() idem.Record { r := newRecord("op"); r.Created = tooLate; return r }(),
	} {
		_, _, err := j.Begin(ctx, r)
		if !errors.Is(err, keyjar.ErrInvalid) {
			t.Errorf("Begin with %s: err = %v; want ErrInvalid", name, err)
		}
		prefixOnce(t, "Begin with "+name, err)
	}
	for name, c := range map[string]idem.Change{
		"unknown state":     {Now: time.Now(), State: "sent"},
		"now in 2300":       {Now: tooLate},
		"next attempt 1600": {Now: time.Now(), NextAttempt: tooEarly},
	} {
		_, err := j.Update(ctx, "op", "", c)
		if !errors.Is(err, keyjar.ErrInvalid) {
			t.Errorf("Update with %s: err = %v; want ErrInvalid", name, err)
		}
		prefixOnce(t, "Update with "+name, err)
	}
	_, err = j.Acquire(ctx, "op", "a", time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC), 365*24*time.Hour)
	if !errors.Is(err, keyjar.ErrInvalid) {
		t.Errorf("Acquire until past 2262: err = %v; want ErrInvalid", err)
	}
	prefixOnce(t, "Acquire until past 2262", err)
	all, err := j.List(ctx, idem.Filter{})
	if err != nil || len(all) != 1 {
		t.Fatalf("List = %d records, %v; want only op", len(all), err)
	}
	if got := all[0]; got.Key != want.Key || got.Holder != "" || !got.Updated.Equal(want.Updated) || got.State != want.State {
		t.Errorf("op changed by refused calls: %+v; want %+v", got, want)
	}
}

// TestEmptyStateIsPending: Begin stores a record without State as pending.
func TestEmptyStateIsPending(t *testing.T) {
	j, _ := openTemp(t, nil)
	r := newRecord("op")
	r.State = ""
	got, _, err := j.Begin(t.Context(), r)
	if err != nil || got.State != idem.StatePending {
		t.Fatalf("Begin without State = %q, %v; want pending", got.State, err)
	}
}

// TestPruneInBatches deletes more rows than one batch holds: every batch is
// its own transaction, and the limit bounds the total.
func TestPruneInBatches(t *testing.T) {
	ctx := t.Context()
	var commits []keyjar.Commit
	j, err := keyjar.OpenHooked(ctx, filepath.Join(t.TempDir(), "keys.db"), &keyjar.Options{MaxBatch: 1}, keyjar.Hooks{
		BeforeCommit: func(c keyjar.Commit) { commits = append(commits, c) },
		PruneBatch:   10,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 45 {
		op := "op-" + string(rune('A'+i))
		if _, _, err := j.Begin(ctx, newRecord(op)); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Update(ctx, op, "", idem.Change{Now: now, State: idem.StateDone}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ limit, deleted, commits int }{
		{12, 12, 2}, // 10 + 2
		{0, 33, 4},  // 10 + 10 + 10 + 3
		{0, 0, 1},
	} {
		commits = nil
		n, err := j.Prune(ctx, now.Add(time.Second), c.limit)
		if err != nil || n != c.deleted || len(commits) != c.commits {
			t.Errorf("Prune(limit %d) = %d, %v in %d commits; want %d in %d", c.limit, n, err, len(commits), c.deleted, c.commits)
		}
	}
}

// TestPruneBatchOf1000: without a batch size set, Prune deletes 1000 rows
// per transaction, as its doc says: 2500 prunable operations go in three
// commits of 1000, 1000 and 500 rows, and none is left.
func TestPruneBatchOf1000(t *testing.T) {
	ctx := t.Context()
	var mu sync.Mutex
	var commits []keyjar.Commit
	j, err := keyjar.OpenHooked(ctx, filepath.Join(t.TempDir(), "keys.db"), nil, keyjar.Hooks{
		BeforeCommit: func(c keyjar.Commit) {
			mu.Lock()
			defer mu.Unlock()
			commits = append(commits, c)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// Begun at once, in group commits.
	const n = 2500
	errs := make(chan error, n)
	for i := range n {
		go func() {
			r := newRecord(fmt.Sprint("op-", i))
			r.State = idem.StateDone
			_, _, err := j.Begin(ctx, r)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	commits = nil
	mu.Unlock()
	deleted, err := j.Prune(ctx, newRecord("op").Updated.Add(time.Second), 0)
	var rows []int
	mu.Lock()
	for _, c := range commits {
		rows = append(rows, c.Changes)
	}
	mu.Unlock()
	if err != nil || deleted != n || !slices.Equal(rows, []int{1000, 1000, 500}) {
		t.Errorf("Prune = %d, %v in commits of %v rows; want %d in commits of [1000 1000 500]", deleted, err, rows, n)
	}
	if left, err := j.List(ctx, idem.Filter{}); err != nil || len(left) != 0 {
		t.Errorf("after Prune, List = %d records, %v; want none", len(left), err)
	}
}

// TestLockedJar: another connection holds the file locked longer than the
// busy timeout: writes fail with ErrLocked, and the caller's deadline is
// kept even when the busy timeout is long.
func TestLockedJar(t *testing.T) {
	ctx := t.Context()
	j, path := openTemp(t, &keyjar.Options{BusyTimeout: 20 * time.Millisecond})
	if _, _, err := j.Begin(ctx, newRecord("op")); err != nil {
		t.Fatal(err)
	}
	unlock := lockFile(t, path, false)
	if _, _, err := j.Begin(ctx, newRecord("op2")); !errors.Is(err, keyjar.ErrLocked) {
		t.Errorf("Begin on a locked file: err = %v; want ErrLocked", err)
	}
	if _, err := j.Update(ctx, "op", "", idem.Change{Now: time.Now(), State: idem.StateDone}); !errors.Is(err, keyjar.ErrLocked) {
		t.Errorf("Update on a locked file: err = %v; want ErrLocked", err)
	}
	unlock()
	r, err := j.Get(ctx, "op")
	if err != nil || r.State != idem.StatePending {
		t.Errorf("after the lock: %q, %v; want op still pending", r.State, err)
	}
	if _, _, err := j.Begin(ctx, newRecord("op2")); err != nil {
		t.Errorf("Begin after the lock is released: %v", err)
	}
}

func TestLockedJarDeadline(t *testing.T) {
	j, path := openTemp(t, &keyjar.Options{BusyTimeout: time.Minute})
	unlock := lockFile(t, path, false)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := j.Begin(ctx, newRecord("op"))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 30*time.Second {
		t.Errorf("Begin on a locked file = %v after %v; want DeadlineExceeded at the deadline", err, time.Since(start))
	}
	unlock()
	// The committer reached the job after its deadline: nothing was written.
	// A later Begin returns after the committer is past the first one.
	if _, _, err := j.Begin(t.Context(), newRecord("later")); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Get(t.Context(), "op"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get after a Begin past its deadline: err = %v; want ErrNotFound", err)
	}
}

// TestFullIsENOSPC: a write SQLite refuses for want of space
// (SQLITE_FULL, here the connection's max_page_count reached) is the OS's
// ENOSPC, the error a caller tests for a full disk, and the jar goes on
// once there is room.
func TestFullIsENOSPC(t *testing.T) {
	ctx := t.Context()
	j := openPath(t, filepath.Join(t.TempDir(), "keys.db"), nil)
	if _, _, err := j.Begin(ctx, newRecord("first")); err != nil {
		t.Fatal(err)
	}
	var pages int
	if err := keyjar.PageCount(ctx, j, &pages); err != nil {
		t.Fatal(err)
	}
	if err := keyjar.SetMaxPageCount(ctx, j, pages); err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("b", 8000))
	var failed error
	for i := range 100 { // 800 kB at most; no page is left
		r := newRecord(fmt.Sprint("op-", i))
		r.Body, r.BodySize = body, int64(len(body))
		if _, _, failed = j.Begin(ctx, r); failed != nil {
			break
		}
	}
	if !errors.Is(failed, syscall.ENOSPC) {
		t.Fatalf("Begin past max_page_count: %v; want an error wrapping ENOSPC", failed)
	}
	if err := keyjar.SetMaxPageCount(ctx, j, 1<<30); err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Begin(ctx, newRecord("after")); err != nil {
		t.Fatalf("Begin once there is room again: %v", err)
	}
}
