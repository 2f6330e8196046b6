package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables the package reads.
const (
	// EnvRequire, set to "1", turns missing PostgreSQL binaries from a
	// skipped test into a failed one. CI sets it, so that a broken install
	// cannot pass as green.
	EnvRequire = "IDEM_REQUIRE_POSTGRES"
	// EnvDSN hands a database from a test to the child processes Command
	// starts; ChildDSN reads it.
	EnvDSN = "IDEM_PGTEST_DSN"
)

// startTimeout bounds initdb plus the server's start (≈ 1.5 s measured).
const startTimeout = 2 * time.Minute

// shared is the test binary's cluster, started by the first DB call and
// stopped by Main. It is the package's only process-wide state, and it
// exists only in test binaries that call Main.
var shared struct {
	mu      sync.Mutex
	main    bool // Main is running the tests
	started bool // a start was tried; c and err hold its outcome
	c       *Cluster
	err     error
}

// Main runs the tests of m, stops the cluster they shared (if any test
// asked for a database) and exits. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	c := shared.c
	shared.mu.Unlock()
	if c != nil {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// DB creates a fresh, empty database for t and returns its DSN (a
// postgres:// URL). The cluster is started on the first call and shared by
// the test binary's tests when TestMain calls Main; without Main, each call
// starts a cluster of its own and stops it when t ends. Databases are not
// dropped: they go with the cluster.
//
// When PostgreSQL is not installed, DB skips t with a message naming the
// package to install, or fails it when IDEM_REQUIRE_POSTGRES=1.
func DB(t testing.TB) string {
	t.Helper()
	c, err := cluster(t)
	if err != nil {
		unavailable(t, err, os.Getenv(EnvRequire) == "1")
		return ""
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dsn, err := c.CreateDB(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Own starts a cluster for t alone, which t may restart (Cluster.Restart)
// without disturbing other tests, creates a database in it and returns the
// cluster and the database's DSN. The cluster is stopped when t ends. Like
// DB, it skips t when PostgreSQL is not installed, or fails it when
// IDEM_REQUIRE_POSTGRES=1.
func Own(t testing.TB) (*Cluster, string) {
	t.Helper()
	c, err := own(t)
	if err != nil {
		unavailable(t, err, os.Getenv(EnvRequire) == "1")
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dsn, err := c.CreateDB(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return c, dsn
}

// own starts a cluster that is stopped when t ends.
func own(t testing.TB) (*Cluster, error) {
	c, err := startCluster()
	if err == nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	return c, err
}

func cluster(t testing.TB) (*Cluster, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		return own(t)
	}
	if !shared.started {
		shared.started = true
		shared.c, shared.err = startCluster()
	}
	return shared.c, shared.err
}

func startCluster() (*Cluster, error) {
	bin, err := FindBinaries(DebianRoot)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return Start(ctx, bin)
}

// unavailable ends t for a cluster that could not start: a skip when the
// binaries are simply absent and require is false, a failure otherwise.
func unavailable(t testing.TB, err error, require bool) {
	t.Helper()
	if errors.Is(err, ErrNoBinaries) {
		if require {
			t.Fatalf("%v; %s=1 requires PostgreSQL", err, EnvRequire)
			return
		}
		t.Skipf("%v; set %s=1 to fail instead of skipping", err, EnvRequire)
		return
	}
	t.Fatal(err)
}

// Command returns a command that runs the current test binary again,
// running only the test t, with EnvDSN=dsn and env added to its
// environment. In the child, t's function finds the DSN with ChildDSN and
// takes the child's part. The command is killed when t ends.
//
//	func TestRace(t *testing.T) {
//		if dsn, ok := pgtest.ChildDSN(); ok {
//			child(t, dsn) // the child's part
//			return
//		}
//		dsn := pgtest.DB(t)
//		cmd := pgtest.Command(t, dsn)
//		...
//	}
func Command(t testing.TB, dsn string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run="+RunPattern(t.Name()), "-test.count=1")
	cmd.Env = append(append(os.Environ(), EnvDSN+"="+dsn), env...)
	return cmd
}

// ChildDSN returns the DSN handed over by Command, and whether this process
// is such a child.
func ChildDSN() (string, bool) {
	dsn := os.Getenv(EnvDSN)
	return dsn, dsn != ""
}

// RunPattern returns the -test.run pattern that selects exactly the test
// (or subtest) named name, as testing.T.Name returns it.
func RunPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
