package keyjar_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// The test binary re-executes itself as a child process: with helperEnv set,
// TestMain runs the helper named by it instead of the tests.
const (
	helperEnv = "KEYJAR_TEST_HELPER" // race, hold, batch, open, upgrade, read or write
	pathEnv   = "KEYJAR_TEST_PATH"   // the jar file
	idEnv     = "KEYJAR_TEST_ID"     // the child's name, part of its keys
)

// raceOps is how many operations each child of TestTwoProcessesRace begins.
const raceOps = 50

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		if err := helper(h, os.Getenv(pathEnv), os.Getenv(idEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper is the child's side. It talks line by line on stdout and waits on
// stdin where told:
//
//	race: open, print "ready", wait for a line, Begin op-0 … op-49 with keys
//	      <id>-<i>, print "<op> <key> <created>" for each, close.
//	hold: open, Begin "op" with key <id>, print the key, then wait for a line
//	      without closing (the parent kills the process).
//	batch: open, then from 8 goroutines Begin ops <id>-<g>-<i> with keys
//	      key-<id>-<g>-<i>, print "<op> <key>" once each Begin returned, and
//	      defer each op's outcome and update the one before it, until
//	      killed (at most batchOps Begins per goroutine).
//	open: open (as an unprivileged user), print "permission" when the error
//	      wraps fs.ErrPermission, else the error or "ok".
//	upgrade: print "ready", wait for a line, open, close, print "ok" or
//	      the error.
//	read: open with ReadOnly (as an unprivileged user) and print the
//	      operations, as listing does, then again after each line read,
//	      until stdin ends.
//	write: without keyjar, hold a write transaction on the jar as
//	      writeInProgress does, print "writing", wait for a line, roll back.
func helper(mode, path, id string) error {
	ctx := context.Background()
	stdin := bufio.NewReader(os.Stdin)
	switch mode {
	case "open":
		j, err := keyjar.Open(ctx, path, nil)
		switch {
		case err == nil:
			fmt.Println("ok")
			return j.Close()
		case errors.Is(err, fs.ErrPermission):
			fmt.Println("permission:", err)
		default:
			fmt.Println("other:", err)
		}
		return nil
	case "upgrade":
		fmt.Println("ready")
		if _, err := stdin.ReadString('\n'); err != nil {
			return err
		}
		j, err := keyjar.Open(ctx, path, nil)
		if err == nil {
			err = j.Close()
		}
		if err != nil {
			fmt.Println("error:", err)
			return nil
		}
		fmt.Println("ok")
		return nil
	case "read":
		return readLines(ctx, path, stdin)
	case "write":
		db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
		if err != nil {
			return err
		}
		defer db.Close()
		tx, err := beginWrite(db)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		fmt.Println("writing")
		_, err = stdin.ReadString('\n')
		return err
	case "batch":
		return batch(ctx, path, id)
	case "race", "hold":
	default:
		return fmt.Errorf("unknown helper %q", mode)
	}
	j, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		return err
	}
	if mode == "hold" {
		r := newRecord("op")
		r.Key = id
		if _, _, err := j.Begin(ctx, r); err != nil {
			return err
		}
		fmt.Println(id)
		_, err := stdin.ReadString('\n') // killed here
		return err
	}
	defer j.Close()
	fmt.Println("ready")
	if _, err := stdin.ReadString('\n'); err != nil {
		return err
	}
	for i := range raceOps {
		r := newRecord(fmt.Sprint("op-", i))
		r.Key = fmt.Sprint(id, "-", i)
		rec, created, err := j.Begin(ctx, r)
		if err != nil {
			return err
		}
		fmt.Println(rec.Op, rec.Key, created)
	}
	return nil
}

// readLines is the read helper.
func readLines(ctx context.Context, path string, stdin *bufio.Reader) error {
	j, err := keyjar.Open(ctx, path, &keyjar.Options{ReadOnly: true})
	if err != nil {
		fmt.Println("error:", err)
		return nil
	}
	defer j.Close()
	for range 1000 {
		fmt.Println(listing(ctx, j))
		if _, err := stdin.ReadString('\n'); err != nil {
			return nil // stdin ended
		}
	}
	return nil
}

// listing returns the operations of j as "op=key" words, oldest first, or
// "error: " and List's error.
func listing(ctx context.Context, j *keyjar.Jar) string {
	recs, err := j.List(ctx, idem.Filter{})
	if err != nil {
		return "error: " + err.Error()
	}
	words := make([]string, len(recs))
	for i, r := range recs {
		words[i] = r.Op + "=" + r.Key
	}
	return strings.Join(words, " ")
}

// child is a helper process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
}

func startChild(t *testing.T, bin, mode, path, id string, attr *syscall.SysProcAttr) *child {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, pathEnv+"="+path, idEnv+"="+id)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &child{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout)}
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	if !c.stdout.Scan() {
		t.Fatalf("child %v ended early: %v", c.cmd.Env[len(c.cmd.Env)-3:], c.stdout.Err())
	}
	return c.stdout.Text()
}

func testBinary(t *testing.T) string {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// writeInProgressElsewhere is writeInProgress from a child process. The
// release returns once the child has rolled back and ended.
func writeInProgressElsewhere(t *testing.T, path string) (release func()) {
	t.Helper()
	c := startChild(t, testBinary(t), "write", path, "", nil)
	if got := c.line(t); got != "writing" {
		t.Fatalf("child says %q; want writing", got)
	}
	return func() {
		if _, err := io.WriteString(c.stdin, "done\n"); err != nil {
			t.Error(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("write child: %v", err)
		}
	}
}

// together starts two children, a and b, of a helper that prints "ready"
// and waits for a line, and once both are ready tells both to go.
func together(t *testing.T, bin, mode, path string) []*child {
	t.Helper()
	children := []*child{startChild(t, bin, mode, path, "a", nil), startChild(t, bin, mode, path, "b", nil)}
	for _, c := range children {
		if got := c.line(t); got != "ready" {
			t.Fatalf("child says %q; want ready", got)
		}
	}
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	return children
}

// TestTwoProcessesRace has two processes Begin the same operations at the
// same moment: each operation gets one key, created by exactly one of them.
func TestTwoProcessesRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	children := together(t, testBinary(t), "race", path)
	keys := map[string]map[string]bool{} // op → keys returned
	created := map[string]int{}
	for _, c := range children {
		for range raceOps {
			f := strings.Fields(c.line(t))
			if len(f) != 3 {
				t.Fatalf("child line %q", f)
			}
			if keys[f[0]] == nil {
				keys[f[0]] = map[string]bool{}
			}
			keys[f[0]][f[1]] = true
			if f[2] == "true" {
				created[f[0]]++
			}
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	j := openPath(t, path, nil)
	for i := range raceOps {
		op := fmt.Sprint("op-", i)
		r, err := j.Get(t.Context(), op)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys[op]) != 1 || !keys[op][r.Key] || created[op] != 1 {
			t.Errorf("%s: keys %v, created %d times, stored %q; want one key, created once", op, keys[op], created[op], r.Key)
		}
	}
}

// TestKilledProcessKeepsKey kills a process (SIGKILL, no Close) right after
// its Begin returned: the next process finds the key.
func TestKilledProcessKeepsKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	killedHolder(t, path, "the-key")
	j := openPath(t, path, nil)
	r, created, err := j.Begin(t.Context(), newRecord("op"))
	if err != nil || created || r.Key != "the-key" {
		t.Fatalf("Begin after the kill = key %q, created %v, %v; want the-key, false", r.Key, created, err)
	}
}

// killedHolder runs the hold helper on the jar at path, which begins "op"
// with key, and kills it (SIGKILL) once its Begin returned.
func killedHolder(t *testing.T, path, key string) {
	t.Helper()
	c := startChild(t, testBinary(t), "hold", path, key, nil)
	if got := c.line(t); got != key {
		t.Fatalf("child says %q; want %s", got, key)
	}
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
}

// batchOps bounds the Begins of each goroutine of the batch helper, which
// the test kills long before.
const batchOps = 100_000

// batch is the batch helper: concurrent Begins share commits, and the
// deferred and updated outcomes put commits without an fsync of their own
// between them.
func batch(ctx context.Context, path, id string) error {
	j, err := keyjar.Open(ctx, path, &keyjar.Options{MaxBatch: 16})
	if err != nil {
		return err
	}
	out := make(chan string, 64)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range batchOps {
				r := newRecord(fmt.Sprint(id, "-", g, "-", i))
				r.Key = "key-" + r.Op
				if _, _, err := j.Begin(ctx, r); err != nil {
					errs <- err
					return
				}
				out <- r.Op + " " + r.Key
				now := time.Now()
				if err := j.Defer(r.Op, "", idem.Change{Now: now, Attempts: 1, State: idem.StateDone}); err != nil {
					errs <- err
					return
				}
				if i > 0 {
					prev := fmt.Sprint(id, "-", g, "-", i-1)
					if _, err := j.Update(ctx, prev, "", idem.Change{Now: now, Note: "seen"}); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for running := 8; running > 0; {
		select {
		case line := <-out:
			fmt.Println(line)
		case err := <-errs:
			if err != nil {
				return err
			}
			running--
		}
	}
	return j.Close()
}

// TestKilledMidBatch kills a process with SIGKILL while it begins and
// updates operations from several goroutines, many times over on one
// file: after each kill, every operation whose Begin returned (a line the
// process printed) is in the jar with its key, and SQLite finds the file
// sound, WAL and all.
func TestKilledMidBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	bin := testBinary(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	acked := map[string]string{} // op → key
	for round := range 8 {
		c := startChild(t, bin, "batch", path, fmt.Sprint("r", round), nil)
		for range 1 + rnd.IntN(200) {
			c.ack(t, acked)
		}
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		for c.stdout.Scan() { // what it printed before it died
			c.ackLine(t, acked, c.stdout.Text())
		}
		c.cmd.Wait()
		for _, s := range []string{"-wal", "-shm"} {
			if _, err := os.Stat(path + s); err != nil {
				t.Fatalf("round %d: the killed process left no %s file: %v", round, s, err)
			}
		}
		if got := integrityCheck(t, path); got != "ok" {
			t.Fatalf("round %d: integrity_check after the kill: %s", round, got)
		}
		j, err := keyjar.Open(t.Context(), path, nil)
		if err != nil {
			t.Fatalf("round %d: Open after the kill: %v", round, err)
		}
		recs, err := j.List(t.Context(), idem.Filter{})
		if err != nil {
			t.Fatalf("round %d: List: %v", round, err)
		}
		stored := map[string]string{}
		for _, r := range recs {
			stored[r.Op] = r.Key
		}
		for op, key := range acked {
			if stored[op] != key {
				t.Errorf("round %d: %s: key %q in the jar; want %q, which Begin returned before the kill", round, op, stored[op], key)
			}
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(acked) < 8 {
		t.Fatalf("%d operations acknowledged in 8 rounds; the test killed too early to show anything", len(acked))
	}
}

// ack reads one line of the batch helper and records its operation.
func (c *child) ack(t *testing.T, acked map[string]string) {
	t.Helper()
	c.ackLine(t, acked, c.line(t))
}

func (c *child) ackLine(t *testing.T, acked map[string]string, line string) {
	t.Helper()
	op, key, ok := strings.Cut(line, " ")
	if !ok {
		t.Fatalf("batch child says %q; want <op> <key>", line)
	}
	acked[op] = key
}

// integrityCheck runs PRAGMA integrity_check on the jar at path, as another
// program would, and returns its first finding ("ok" for a sound file).
func integrityCheck(t *testing.T, path string) string {
	t.Helper()
	db := rawDB(t, path, "")
	defer db.Close()
	var got string
	if err := db.QueryRow("PRAGMA integrity_check(1)").Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

// upgradeRows is how many operations the jar of TestTwoProcessesUpgrade
// holds: enough that building the index of version 2 takes a while, the
// while in which the other process opens the jar too, and few enough that
// it takes well below the default BusyTimeout (5s), as long as the other
// waits for it at most, with the race detector on a busy machine too.
const upgradeRows = 10_000

// TestTwoProcessesUpgrade has two processes open the same jar of schema
// version 1 at the same moment, several times over: both opens succeed,
// and the file is at the current version with the schema of a new jar
// (the index of version 2 once), every row as it was, and sound.
func TestTwoProcessesUpgrade(t *testing.T) {
	_, fresh := openTemp(t, nil)
	_, want := dump(t, fresh)
	v1 := filepath.Join(t.TempDir(), "v1.db")
	jarV1(false)(t, v1)
	db := rawDB(t, v1, "")
	if _, err := db.Exec(`INSERT INTO operations
		WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		SELECT printf('more-%06d', i), 'key-' || i, 'fp', CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'done' END,
			'POST', 'http://127.0.0.1/charges', NULL, NULL, 0, i, i, 1, 201, '', NULL, '', '', NULL
		FROM n`, upgradeRows-300-1); err != nil {
		t.Fatal(err)
	}
	// The last connection to close writes the WAL into the file and
	// removes the -wal file: the file alone is the jar.
	db.Close()
	if _, err := os.Stat(v1 + "-wal"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the version 1 jar's -wal file: %v; want none", err)
	}
	before, _ := dump(t, v1)
	if len(before) != upgradeRows {
		t.Fatalf("the version 1 jar holds %d rows; want %d", len(before), upgradeRows)
	}
	content, err := os.ReadFile(v1)
	if err != nil {
		t.Fatal(err)
	}
	bin := testBinary(t)
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "keys.db")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, c := range together(t, bin, "upgrade", path) {
			if got := c.line(t); got != "ok" {
				t.Errorf("round %d: a process opening the version 1 jar: %s", round, got)
			}
			if err := c.cmd.Wait(); err != nil {
				t.Fatalf("child: %v", err)
			}
		}
		after, schema := dump(t, path)
		if !slices.Equal(schema, want) {
			t.Errorf("round %d: schema after two upgrades at once:\n%s\nwant a new jar's:\n%s", round, strings.Join(schema, "\n"), strings.Join(want, "\n"))
		}
		if !slices.Equal(after, before) {
			t.Errorf("round %d: the rows changed in the upgrade: %d rows, were %d", round, len(after), len(before))
		}
		if got := integrityCheck(t, path); got != "ok" {
			t.Errorf("round %d: integrity_check after the upgrade: %s", round, got)
		}
	}
}
