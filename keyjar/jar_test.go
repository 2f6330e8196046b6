package keyjar_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/keyjar/jartest"
)

// openPath opens the jar at path and closes it when the test ends.
func openPath(t *testing.T, path string, opts *keyjar.Options) *keyjar.Jar {
	t.Helper()
	j, err := keyjar.Open(t.Context(), path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := j.Close(); err != nil && err != keyjar.ErrClosed {
			t.Errorf("Close: %v", err)
		}
	})
	return j
}

// prefixOnce fails the test unless err's message says "keyjar:" once: a
// method that wraps a sentinel ("keyjar: jar is closed") does not repeat it.
func prefixOnce(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && strings.Count(err.Error(), "keyjar:") != 1 {
		t.Errorf("%s: %q; want \"keyjar:\" once", what, err)
	}
}

// openTemp opens a new jar in a temporary directory.
func openTemp(t *testing.T, opts *keyjar.Options) (*keyjar.Jar, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.db")
	return openPath(t, path, opts), path
}

func TestConformance(t *testing.T) {
	jartest.Run(t, func(t *testing.T) jartest.Jar {
		j, _ := openTemp(t, nil)
		return j
	})
}

func TestClosed(t *testing.T) {
	jartest.RunClosed(t, func(t *testing.T) jartest.Closer {
		j, _ := openTemp(t, nil)
		return j
	}, keyjar.ErrClosed)
}
