//go:build unix

package main

import (
	"os"
	"strings"
	"testing"
)

// TestReadWithOneWALFileMissing: list of a jar whose -shm file alone is
// missing, by a user who may not create it, says that one is missing, not
// both.
func TestReadWithOneWALFileMissing(t *testing.T) {
	top, dir, path := seedInDir(t)
	run := idemctlWithoutWriteAccess(t, top, path)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+"-shm", path+"-shm.away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run("--jar", path, "list")
	wantError(t, code, errOut, 1, path+": its -shm file is missing")
	if strings.Contains(errOut, "-wal and -shm files are missing") {
		t.Errorf("list of a jar without its -shm file: %q; want it to say the -shm file alone is missing", errOut)
	}
}

// TestReadOnlyJarFileWithoutWALFiles: list of a jar without its -wal and
// -shm files, whose file the user may not write, in a directory the user
// may write, says that the file is read-only to the user, which the open
// that would create them needs to write, not that the directory is.
func TestReadOnlyJarFileWithoutWALFiles(t *testing.T) {
	top, dir, path := seedInDir(t)
	run := idemctlWithoutWriteAccess(t, top, path)
	if err := os.Chmod(dir, 0o777); err != nil { // writable by nobody too
		t.Fatal(err)
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	before := dirFiles(t, dir)
	code, _, errOut := run("--jar", path, "list")
	wantError(t, code, errOut, 1, path+": its -wal and -shm files are missing")
	if strings.Contains(errOut, "directory") || !strings.Contains(errOut, "may not write the jar file") {
		t.Errorf("list of a read-only jar file without its -wal and -shm files: %q; want it to say that this user may not write the jar file, not its directory", errOut)
	}
	wantUnchanged(t, dir, before)
}
