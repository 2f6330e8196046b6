package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(t.Context(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func TestDBServerSettings(t *testing.T) {
	conn := Connect(t, DB(t))
	for setting, want := range map[string]string{
		"listen_addresses":   "127.0.0.1",
		"fsync":              "on",
		"synchronous_commit": "on",
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("%s = %q; want %q", setting, got, want)
		}
	}
	var addr string
	if err := conn.QueryRow(t.Context(), "SELECT host(inet_server_addr())").Scan(&addr); err != nil {
		t.Fatal(err)
	}
	if addr != "127.0.0.1" {
		t.Errorf("connected to server address %q; want 127.0.0.1", addr)
	}
}

// AppRole's role logs in, uses what it was granted and nothing else, and
// may not create a table in public.
func TestAppRole(t *testing.T) {
	dsn := DB(t)
	if _, err := Connect(t, dsn).Exec(t.Context(), `CREATE TABLE granted (n int); CREATE TABLE kept (n int)`); err != nil {
		t.Fatal(err)
	}
	app := Connect(t, AppRole(t, dsn, `GRANT SELECT, INSERT ON granted`))
	if user := app.Config().User; user == "postgres" {
		t.Fatalf("AppRole's DSN logs in as %s", user)
	}
	if _, err := app.Exec(t.Context(), `INSERT INTO granted VALUES (1)`); err != nil {
		t.Errorf("INSERT into a table granted: %v", err)
	}
	for _, q := range []string{`SELECT * FROM kept`, `CREATE TABLE made (n int)`} {
		if _, err := app.Exec(t.Context(), q); err == nil || !strings.Contains(err.Error(), "42501") {
			t.Errorf("%s as the role = %v; want SQLSTATE 42501", q, err)
		}
	}
}

func TestDBIsFreshAndIsolated(t *testing.T) {
	dsn1, dsn2 := DB(t), DB(t)
	if dsn1 == dsn2 {
		t.Fatalf("two DB calls returned the same DSN %q", dsn1)
	}
	c1, c2 := Connect(t, dsn1), Connect(t, dsn2)
	var n int
	if err := c1.QueryRow(t.Context(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("fresh database has %d tables; want 0", n)
	}
	if _, err := c1.Exec(t.Context(), "CREATE TABLE only_in_one (x int)"); err != nil {
		t.Fatal(err)
	}
	var name *string
	if err := c2.QueryRow(t.Context(), "SELECT to_regclass('only_in_one')::text").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != nil {
		t.Errorf("table created in %s is visible in %s", dsn1, dsn2)
	}
}

func TestDBSharesOneCluster(t *testing.T) {
	dsn1, dsn2 := DB(t), DB(t)
	p1 := Connect(t, dsn1).Config().Port
	p2 := Connect(t, dsn2).Config().Port
	if p1 != p2 {
		t.Errorf("databases on ports %d and %d; want one shared cluster", p1, p2)
	}
}

func TestStopShutsDownAndRemoves(t *testing.T) {
	bin, err := FindBinaries(DebianRoot)
	if err != nil {
		unavailable(t, err, os.Getenv(EnvRequire) == "1")
	}
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	c, err := Start(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := c.CreateDB(ctx, "stop")
	if err != nil {
		c.Stop()
		t.Fatal(err)
	}
	conn := Connect(t, dsn)
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(c.Dir(), "data", "PG_VERSION")); err != nil || fi.IsDir() {
		t.Fatalf("data directory not initialised: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory still there after Stop: %v", err)
	}
	if err := kill(c.pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postgres pid %d still exists after Stop: %v", c.pid, err)
	}
	if nc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port()))); err == nil {
		nc.Close()
		t.Errorf("port %d still accepts connections after Stop", c.Port())
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("connection still works after Stop")
	}
}

// TestRestart restarts a cluster of the test's own: its sessions end, it
// refuses connections while down, and it comes back on the same port with
// its data.
func TestRestart(t *testing.T) {
	c, dsn := Own(t)
	conn := Connect(t, dsn)
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	err := c.Restart(t.Context(), func() {
		if down, err := pgx.Connect(t.Context(), dsn); err == nil {
			down.Close(context.Background())
			t.Error("connected while the server was down")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(t.Context()); err == nil {
		t.Error("a session from before the restart still works")
	}
	if c.Port() != port {
		t.Errorf("port after the restart = %d; want %d", c.Port(), port)
	}
	var x int
	if err := Connect(t, dsn).QueryRow(t.Context(), "SELECT x FROM kept").Scan(&x); err != nil || x != 42 {
		t.Errorf("after the restart: x = %d, %v; want 42", x, err)
	}
}

// TestCrash kills a cluster of the test's own while its walwriter is held:
// it comes back on the same port, after crash recovery, with the commits
// that were flushed (synchronous_commit=on) and without the one whose WAL
// was still in its buffers (off).
func TestCrash(t *testing.T) {
	c, dsn := Own(t)
	conn := Connect(t, dsn)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	c.HoldWALWriter(t, dsn)
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off; INSERT INTO t VALUES (3)"); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	if err := c.Crash(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if c.Port() != port {
		t.Errorf("port after the crash = %d; want %d", c.Port(), port)
	}
	rows, err := Connect(t, dsn).Query(ctx, "SELECT x FROM t ORDER BY x")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || !slices.Equal(got, []int{1, 2}) {
		t.Errorf("after the crash: %v, %v; want [1 2], the flushed commits alone", got, err)
	}
}

// TestRelayLosesAnswer: through a Relay, an UPDATE whose answer it loses
// fails on the client although the server applied it; the statements
// before and after it pass.
func TestRelayLosesAnswer(t *testing.T) {
	dsn := DB(t)
	relay, rdsn := NewRelay(t, dsn)
	conn := Connect(t, rdsn)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	lost := relay.LoseNext("UPDATE")
	if _, err := conn.Exec(ctx, "UPDATE t SET x = 2"); err == nil {
		t.Error("UPDATE whose answer was lost succeeded")
	}
	select {
	case <-lost:
	default:
		t.Error("the channel LoseNext returned is open after the answer was lost")
	}
	var x int
	if err := Connect(t, rdsn).QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 2 {
		t.Errorf("after the lost answer: x = %d, %v; want 2, the UPDATE applied", x, err)
	}
}

// TestRelayRefused: a client of a Relay to a server that is down fails to
// connect, and Refused tells.
func TestRelayRefused(t *testing.T) {
	c, dsn := Own(t)
	relay, rdsn := NewRelay(t, dsn)
	err := c.Restart(t.Context(), func() {
		if conn, err := pgx.Connect(t.Context(), rdsn); err == nil {
			conn.Close(context.Background())
			t.Error("connected through the relay while the server was down")
		}
		select {
		case <-relay.Refused():
		default:
			t.Error("Refused did not receive")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	Connect(t, rdsn)
}

// TestCallDuringRestartWaitsForItsCall: a refusal still pending from an
// earlier call (a retry refused after its restart had received the first)
// does not start the server again: the restart waits for a refusal during
// the call it runs. Before, the restart began before the call had reached
// the relay, and the call could run against a server that was back.
func TestCallDuringRestartWaitsForItsCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &Relay{refused: make(chan struct{}, 1)}
		r.refuse() // the earlier call's
		var began atomic.Bool
		restart := func(_ context.Context, down func()) error {
			down()
			began.Store(true)
			return nil
		}
		err := callDuringRestart(t, restart, r, func() error {
			synctest.Wait() // the restart waits for the refusal, or it began
			if began.Load() {
				return errors.New("the restart began before the call was refused")
			}
			r.refuse()
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		if !began.Load() {
			t.Error("the restart never began")
		}
	})
}

func TestCommandHandsDSNToChild(t *testing.T) {
	if dsn, ok := ChildDSN(); ok {
		conn := Connect(t, dsn)
		if _, err := conn.Exec(t.Context(), "CREATE TABLE made_by_child (pid int)"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(t.Context(), "INSERT INTO made_by_child VALUES ($1)", os.Getpid()); err != nil {
			t.Fatal(err)
		}
		return
	}
	dsn := DB(t)
	out, err := Command(t, dsn).CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var pid int
	if err := Connect(t, dsn).QueryRow(t.Context(), "SELECT pid FROM made_by_child").Scan(&pid); err != nil {
		t.Fatalf("the child's row: %v\nchild output:\n%s", err, out)
	}
	if pid == os.Getpid() || pid == 0 {
		t.Errorf("row written by pid %d; want another process than %d", pid, os.Getpid())
	}
}

// TestServerDiesWithTestProcess kills a test process that started a cluster
// and did not stop it: the server must shut down by itself.
func TestServerDiesWithTestProcess(t *testing.T) {
	if role, ok := ChildDSN(); ok {
		if role != "orphan" {
			t.Fatalf("unexpected child role %q", role)
		}
		bin, err := FindBinaries(DebianRoot)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Start(t.Context(), bin)
		if err != nil {
			t.Fatal(err)
		}
		dsn, err := c.CreateDB(t.Context(), "orphan")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("\ncluster %s %s\n", c.Dir(), dsn)
		io.Copy(io.Discard, os.Stdin) // until the parent kills us
		return
	}
	DB(t) // skips or fails like every test here when PostgreSQL is absent
	cmd := Command(t, "orphan")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, dsn string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "cluster" {
			dir, dsn = f[1], f[2]
			break
		}
	}
	if dsn == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child reported no cluster (%v)", sc.Err())
	}
	t.Cleanup(func() { os.RemoveAll(dir) }) // a killed process leaves its directory
	conn := Connect(t, dsn)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	// The backend serving conn ends when the server shuts down: waiting for
	// a notification then fails with a closed connection, not the deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = conn.WaitForNotification(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("server still serving after its test process was killed: %v", err)
	}
}

func TestRunPattern(t *testing.T) {
	for name, want := range map[string]string{
		"TestA":           "^TestA$",
		"TestA/sub_1":     "^TestA$/^sub_1$",
		"TestA/x.y(z)":    `^TestA$/^x\.y\(z\)$`,
		"TestA/b/deep#01": "^TestA$/^b$/^deep#01$",
	} {
		if got := RunPattern(name); got != want {
			t.Errorf("RunPattern(%q) = %q; want %q", name, got, want)
		}
	}
}

func TestDBName(t *testing.T) {
	for in, want := range map[string]string{
		"TestClaim":             "t_testclaim",
		"TestA/Sub Test#01":     "t_testa_sub_test_01",
		strings.Repeat("x", 90): "t_" + strings.Repeat("x", 38),
	} {
		if got := dbName(in); got != want {
			t.Errorf("dbName(%q) = %q; want %q", in, got, want)
		}
	}
}

// fakeInstall creates dir with executable files named for the given programs.
func fakeInstall(t *testing.T, dir string, programs ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range programs {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFindBinariesPicksHighestCompleteVersion(t *testing.T) {
	root := t.TempDir()
	all := []string{"initdb", "postgres", "createdb"}
	fakeInstall(t, filepath.Join(root, "9.6", "bin"), all...)
	fakeInstall(t, filepath.Join(root, "10", "bin"), all...)
	fakeInstall(t, filepath.Join(root, "16", "bin"), "initdb", "postgres") // no createdb
	fakeInstall(t, filepath.Join(root, "latest", "bin"), all...)           // not a version
	t.Setenv("PATH", "")
	b, err := FindBinaries(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "10", "bin", "initdb"); b.Initdb != want {
		t.Errorf("Initdb = %q; want %q", b.Initdb, want)
	}
	if want := filepath.Join(root, "10", "bin", "postgres"); b.Postgres != want {
		t.Errorf("Postgres = %q; want %q", b.Postgres, want)
	}
}

func TestFindBinariesFallsBackToPath(t *testing.T) {
	dir := t.TempDir()
	fakeInstall(t, dir, "initdb", "postgres", "createdb")
	t.Setenv("PATH", dir)
	b, err := FindBinaries(filepath.Join(t.TempDir(), "absent"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "createdb"); b.Createdb != want {
		t.Errorf("Createdb = %q; want %q", b.Createdb, want)
	}
}

func TestFindBinariesAbsent(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := FindBinaries(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("err = %v; want ErrNoBinaries", err)
	}
	if !strings.Contains(err.Error(), "package postgresql") {
		t.Errorf("message %q does not name the package to install", err)
	}
}

// recordTB records how unavailable ended a test instead of ending it.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper()                           {}
func (r *recordTB) Skipf(format string, args ...any)  { r.skipped = format }
func (r *recordTB) Fatalf(format string, args ...any) { r.failed = format }
func (r *recordTB) Fatal(args ...any)                 { r.failed = "fatal" }

func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		require bool
		skip    bool
	}{
		{"absent skips", ErrNoBinaries, false, true},
		{"absent but required fails", ErrNoBinaries, true, false},
		{"broken install fails", errors.New("pgtest: initdb: exit status 1"), false, false},
		{"broken install required fails", errors.New("pgtest: initdb: exit status 1"), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recordTB{TB: t}
			unavailable(r, tc.err, tc.require)
			if got := r.skipped != ""; got != tc.skip {
				t.Errorf("skipped = %v; want %v", got, tc.skip)
			}
			if got := r.failed != ""; got == tc.skip {
				t.Errorf("failed = %v; want %v", got, !tc.skip)
			}
		})
	}
}

// Layout names each column's type, collation and nullability, and each
// index's definition and collations, in the order of the tables given.
func TestLayout(t *testing.T) {
	conn := Connect(t, DB(t))
	if _, err := conn.Exec(t.Context(), `CREATE TABLE b (k text COLLATE "C" PRIMARY KEY, n bigint);
		CREATE TABLE a (s text NOT NULL, t text); CREATE INDEX a_s_t ON a (s, t COLLATE "C")`); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"b.k text collate C not null",
		"b.n bigint collate -",
		"a.s text collate default not null",
		"a.t text collate default",
		`index CREATE INDEX a_s_t ON public.a USING btree (s, t COLLATE "C") collate default,C`,
		"index CREATE UNIQUE INDEX b_pkey ON public.b USING btree (k) collate C",
	}
	if got := Layout(t, conn, "b", "a"); !slices.Equal(got, want) {
		t.Errorf("Layout = %q; want %q", got, want)
	}
}
