// Package pgtest starts throwaway PostgreSQL clusters for tests, from the
// server binaries of the Debian packages (postgresql-NN).
//
// A cluster lives in a temporary directory: initdb with trust
// authentication, a server listening on 127.0.0.1 only, at a port the
// operating system chose, with its unix socket in the same directory. Stop
// shuts it down immediately (as pg_ctl stop -m immediate) and removes the
// directory. The server keeps fsync and synchronous_commit on, so
// benchmarks measure realistic durability; tests keep them on too, since
// a test's cost is its database's creation (tens of milliseconds), not its
// commits.
//
// Tests use one cluster per test binary: TestMain calls Main, and each test
// calls DB for a fresh database of its own. A test that restarts the server
// (Cluster.Restart, or Cluster.Crash, an immediate shutdown, which loses
// the commits HoldWALWriter kept from being written) calls Own for a
// cluster of its own instead. When the binaries are absent, DB and Own
// skip the test, unless IDEM_REQUIRE_POSTGRES=1 (CI sets it), when they
// fail it. A Relay in front of a cluster loses the answer to a statement
// the server applied, and tells when the server refused a connection.
//
// The package runs the PostgreSQL binaries (initdb, postgres, createdb); of
// its functions only StartTogether, HoldLock and HoldWALWriter speak SQL,
// through pgx.
package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ErrNoBinaries is returned by Start when no PostgreSQL server binaries
// (initdb, postgres) are installed.
var ErrNoBinaries = errors.New("pgtest: PostgreSQL server binaries not found (install the Debian package postgresql)")

// DebianRoot is where the Debian packages install one directory per major
// version, each with a bin directory.
const DebianRoot = "/usr/lib/postgresql"

// readyLine is what the postmaster logs once it accepts connections
// (lc_messages is set to C, so it is never translated).
const readyLine = "database system is ready to accept connections"

// startAttempts bounds the retries when the chosen port was taken between
// asking the OS for it and the server binding it.
const startAttempts = 3

// Binaries are the PostgreSQL programs a Cluster runs.
type Binaries struct {
	Initdb   string
	Postgres string
	Createdb string
}

// FindBinaries returns the programs of the highest PostgreSQL version
// installed under root (DebianRoot in practice: root/NN/bin), falling back
// to the directories of PATH. It returns ErrNoBinaries when none is found.
func FindBinaries(root string) (Binaries, error) {
	if dirs, err := os.ReadDir(root); err == nil {
		var versions []string
		for _, d := range dirs {
			if _, err := versionKey(d.Name()); err == nil {
				versions = append(versions, d.Name())
			}
		}
		slices.SortFunc(versions, func(a, b string) int {
			ka, _ := versionKey(a)
			kb, _ := versionKey(b)
			return slices.Compare(ka, kb)
		})
		for _, v := range slices.Backward(versions) {
			if b, ok := binariesIn(filepath.Join(root, v, "bin")); ok {
				return b, nil
			}
		}
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return Binaries{}, ErrNoBinaries
	}
	// /usr/local/bin/initdb may be a link into a version's bin directory,
	// next to which the other programs are.
	if real, err := filepath.EvalSymlinks(initdb); err == nil {
		if b, ok := binariesIn(filepath.Dir(real)); ok {
			return b, nil
		}
	}
	if b, ok := binariesIn(filepath.Dir(initdb)); ok {
		return b, nil
	}
	return Binaries{}, ErrNoBinaries
}

// versionKey parses a version directory name such as "15" or "9.6".
func versionKey(name string) ([]int, error) {
	var key []int
	for part := range strings.SplitSeq(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("pgtest: not a version: %q", name)
		}
		key = append(key, n)
	}
	return key, nil
}

func binariesIn(dir string) (Binaries, bool) {
	b := Binaries{
		Initdb:   filepath.Join(dir, "initdb"),
		Postgres: filepath.Join(dir, "postgres"),
		Createdb: filepath.Join(dir, "createdb"),
	}
	for _, p := range []string{b.Initdb, b.Postgres, b.Createdb} {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return Binaries{}, false
		}
	}
	return b, true
}

// A Cluster is a running PostgreSQL server in a temporary directory. Its
// methods are safe for concurrent use.
type Cluster struct {
	bin  Binaries
	dir  string // temporary directory: data/, the socket, postgres.log
	port int
	cred *credential // nil when not running as root

	mu     sync.Mutex // guards pid and exited, which Restart replaces, and held
	pid    int
	exited chan struct{} // closed when the server process has exited
	held   []int         // the walwriters HoldWALWriter stopped
	seq    atomic.Int64  // names databases uniquely

	stopOnce sync.Once
	stopErr  error
}

// Start creates and starts a cluster from bin. When the process runs as
// root (initdb and postgres refuse to), the cluster's files and processes
// belong to the postgres user. If the test process dies without calling
// Stop, the server gets SIGQUIT (on Linux) and shuts down immediately, but
// the temporary directory stays.
func Start(ctx context.Context, bin Binaries) (_ *Cluster, err error) {
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs a postgres user to run the server as: %w", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("pgtest: postgres user: %w", err)
		}
		c.cred = &credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	c.dir, err = os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(c.dir)
		}
	}()
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}

	initdb := c.command(ctx, bin.Initdb, "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	for attempt := 1; ; attempt++ {
		port, perr := freePort()
		if perr != nil {
			return nil, perr
		}
		err = c.startServer(ctx, port)
		if err == nil {
			c.port = port
			return c, nil
		}
		if attempt == startAttempts || ctx.Err() != nil {
			return nil, err
		}
	}
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// command prepares one of the cluster's programs, run as the postgres user
// when we are root, with an environment free of PG* variables that could
// point it elsewhere.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = procAttr(c.cred)
	return cmd
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C")
}

// startServer runs the postmaster on port and waits until it accepts
// connections, it exits, or ctx ends.
func (c *Cluster) startServer(ctx context.Context, port int) error {
	logFile, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := c.command(context.Background(), c.bin.Postgres, "-D", c.dataDir(),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+c.dir,
		"-c", "fsync=on",
		"-c", "synchronous_commit=on",
		"-c", "lc_messages=C",
		"-c", "logging_collector=off")
	cmd.Stdout, cmd.Stderr = w, w
	// SIGQUIT is PostgreSQL's immediate shutdown: sent to the server (on
	// Linux) if this process dies without stopping it. Its own process
	// group keeps a terminal's ^C away from it.
	serverProcAttr(cmd.SysProcAttr)

	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started the child exits, not
		// the process: keep this goroutine on its thread while the server
		// runs. The thread ends with the goroutine, after the server.
		runtime.LockOSThread()
		err := cmd.Start()
		w.Close()
		started <- err
		if err == nil {
			cmd.Wait()
		}
		close(exited)
	}()
	if err := <-started; err != nil {
		r.Close()
		logFile.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}

	ready := make(chan struct{})
	var tail lastLines
	go func() {
		defer logFile.Close()
		defer r.Close()
		sc := bufio.NewScanner(r)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if !seen {
				tail.add(line)
				if strings.Contains(line, readyLine) {
					seen = true
					close(ready)
				}
			}
		}
		io.Copy(logFile, r) // a line longer than the scanner's buffer
	}()

	select {
	case <-ready:
		c.mu.Lock()
		c.pid, c.exited = cmd.Process.Pid, exited
		c.mu.Unlock()
		return nil
	case <-exited:
		return fmt.Errorf("pgtest: postgres exited before accepting connections:\n%s", tail.String())
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGQUIT)
		<-exited
		return fmt.Errorf("pgtest: waiting for postgres to accept connections: %w\n%s", ctx.Err(), tail.String())
	}
}

// lastLines keeps the last lines of the server's log before it was ready,
// for error messages.
type lastLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lastLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 20 {
		l.lines = l.lines[1:]
	}
	l.lines = append(l.lines, s)
}

func (l *lastLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// freePort asks the OS for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir returns the cluster's temporary directory: the data directory
// (data/), the unix socket and the server's log (postgres.log).
func (c *Cluster) Dir() string { return c.dir }

// DSN returns a URL that connects to database db as the superuser
// postgres, over TCP, without a password (trust authentication).
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// CreateDB creates a new empty database whose name starts with prefix
// (reduced to lowercase letters, digits and underscores) and returns its DSN.
func (c *Cluster) CreateDB(ctx context.Context, prefix string) (string, error) {
	name := fmt.Sprintf("%s_%d", dbName(prefix), c.seq.Add(1))
	conn := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", c.port)
	cmd := exec.CommandContext(ctx, c.bin.Createdb, "--no-password", "--maintenance-db="+conn, name)
	cmd.Env = cleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("pgtest: createdb %s: %w\n%s", name, err, out)
	}
	return c.DSN(name), nil
}

// dbName reduces s to a database name prefix: lowercase letters, digits
// and underscores, starting with a letter, at most 40 bytes (the limit is 63).
func dbName(s string) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(s) {
		if b.Len() >= 40 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Restart shuts the server down as pg_ctl stop -m fast does (SIGINT: every
// session is ended, its transaction rolled back, and a checkpoint written),
// calls down, if not nil, while the server is down, and starts the server
// again on the same port and data, waiting until it accepts connections.
func (c *Cluster) Restart(ctx context.Context, down func()) error {
	return c.restart(ctx, syscall.SIGINT, down)
}

// Crash stops the server as pg_ctl stop -m immediate does (SIGQUIT: every
// process exits at once, writing nothing more, without a checkpoint),
// calls down, if not nil, while it is down, and starts it again on the
// same port and data, waiting until it accepts connections, after crash
// recovery. A commit that was flushed is recovered; one whose WAL was
// still in the server's buffers (synchronous_commit=off, see
// HoldWALWriter) is lost.
func (c *Cluster) Crash(ctx context.Context, down func()) error {
	return c.restart(ctx, syscall.SIGQUIT, down)
}

// restart stops the server with sig, SIGINT or SIGQUIT, calls down while
// it is down and starts it again. After a SIGQUIT it kills the walwriters
// HoldWALWriter stopped: stopped, they would not act on it; killed, they
// write nothing.
func (c *Cluster) restart(ctx context.Context, sig syscall.Signal, down func()) error {
	c.mu.Lock()
	pid, exited := c.pid, c.exited
	var held []int
	if sig == syscall.SIGQUIT {
		held, c.held = c.held, nil
	}
	c.mu.Unlock()
	if err := kill(pid, sig); err != nil {
		return fmt.Errorf("pgtest: restart postgres: %w", err)
	}
	for _, p := range held {
		if err := kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgtest: restart postgres: killing the walwriter: %w", err)
		}
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return fmt.Errorf("pgtest: restart postgres: waiting for the shutdown: %w", ctx.Err())
	}
	if down != nil {
		down()
	}
	return c.startServer(ctx, c.port)
}

// HoldWALWriter stops the server's walwriter process (SIGSTOP) until t
// ends or Crash kills it: a commit made with synchronous_commit=off then
// stays in the server's WAL buffers, which Crash loses, instead of being
// written within wal_writer_delay. A commit with synchronous_commit=on
// still writes and flushes the WAL, that of earlier commits included. dsn
// names one of c's databases.
func (c *Cluster) HoldWALWriter(t testing.TB, dsn string) {
	t.Helper()
	var pid int
	err := Connect(t, dsn).QueryRow(t.Context(),
		`SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid)
	if err != nil {
		t.Fatalf("pgtest: the walwriter's pid: %v", err)
	}
	if err := stop(pid); err != nil {
		t.Fatalf("pgtest: stopping the walwriter: %v", err)
	}
	c.mu.Lock()
	c.held = append(c.held, pid)
	c.mu.Unlock()
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(c.held, pid); i >= 0 { // not killed by Crash
			_ = resume(pid)
			c.held = slices.Delete(c.held, i, i+1)
		}
	})
}

// Stop shuts the server down immediately (SIGQUIT, as pg_ctl stop -m
// immediate: no checkpoint, the data is thrown away) and removes the
// cluster's directory. Later calls return the first call's result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		pid, exited := c.pid, c.exited
		c.mu.Unlock()
		if err := kill(pid, syscall.SIGQUIT); err != nil && !errors.Is(err, syscall.ESRCH) {
			c.stopErr = fmt.Errorf("pgtest: stop postgres: %w", err)
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			kill(pid, syscall.SIGKILL)
			<-exited
		}
		if err := os.RemoveAll(c.dir); err != nil {
			c.stopErr = errors.Join(c.stopErr, fmt.Errorf("pgtest: %w", err))
		}
	})
	return c.stopErr
}
