//go:build unix

package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/nobody"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// openAsChild names the environment variable that makes the test binary
// open the store at its value, print what Open returned and exit: how a
// test run as root opens a store as the user nobody.
const openAsChild = "SQLITESTORE_TEST_OPEN"

func TestMain(m *testing.M) {
	if path := os.Getenv(openAsChild); path != "" {
		fmt.Print(openResult(path))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// openResult opens the store at path and returns "opened", or whether
// Open's error matches fs.ErrPermission and its message.
func openResult(path string) string {
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err == nil {
		s.Close()
		return "opened"
	}
	return fmt.Sprintf("%t %s", errors.Is(err, fs.ErrPermission), err)
}

// TestOpenWithoutWriteAccess: a store file, or its directory, that the
// user may not write (the store writes the file and keeps its -wal and
// -shm files beside it) is refused with an error matching fs.ErrPermission
// that names what cannot be written and says what to do, where SQLite's
// own error named neither the file nor the directory. Run as root, whom
// file modes do not stop, the Open runs in a child process as the user
// nobody, who owns the store's directory and file.
func TestOpenWithoutWriteAccess(t *testing.T) {
	for _, tc := range []struct {
		name         string
		exists       bool // the store's file exists, created by an Open before
		fileReadOnly bool // the file is read-only, else its directory
		namesTheDir  bool // the error names the directory as what cannot be written
	}{
		{"read-only file", true, true, false},
		{"read-only directory", true, false, true},
		{"new file in a read-only directory", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			dir := filepath.Join(top, "store")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "keys.db")
			if tc.exists {
				open(t, path).Close()
			}
			result := openResult
			if os.Geteuid() == 0 {
				bin := nobody.Binary(t, top, "sqlitestore.test")
				owned := []string{dir}
				if tc.exists {
					owned = append(owned, path)
				}
				for _, p := range owned {
					if err := os.Chown(p, nobody.ID, nobody.ID); err != nil {
						t.Fatal(err)
					}
				}
				result = func(path string) string {
					cmd := exec.Command(bin)
					cmd.Env = append(os.Environ(), openAsChild+"="+path)
					cmd.SysProcAttr = nobody.Attr()
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("the child as nobody: %v, output %q", err, out)
					}
					return string(out)
				}
			}
			readOnly, mode := dir, os.FileMode(0o500)
			if tc.fileReadOnly {
				readOnly, mode = path, 0o400
			}
			if err := os.Chmod(readOnly, mode); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(readOnly, 0o700) })
			got := result(path)
			want := "as a user who may write them"
			if tc.namesTheDir {
				want = "the directory " + dir + " cannot be written"
			}
			if !strings.HasPrefix(got, "true ") || !strings.Contains(got, path) || !strings.Contains(got, want) {
				t.Errorf("Open: %s; want an error matching fs.ErrPermission, naming %s and saying %q", got, path, want)
			}
		})
	}
}
