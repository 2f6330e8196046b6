package pgjar_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
)

// The cross-process tests run this test binary again as worker processes
// (pgtest.Command) that share one database. A worker says "ready" once its
// jar is open, waits for "go" on its standard input, so that all start
// together, and reports on standard output in lines that start with
// childPrefix.
const (
	childEnv    = "PGJAR_CHILD" // the worker's index
	childPrefix = "pgjar-child "
	workers     = 4
)

// child is a running worker process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // the worker's report lines, without childPrefix; closed at EOF
	output *syncBuffer // everything else it printed, for failure messages
}

// syncBuffer is a bytes.Buffer for two writers: the worker's standard output
// and standard error.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startWorkers starts n workers of the current test on dsn and waits until
// each has said it is ready.
func startWorkers(t *testing.T, dsn string, n int) []*child {
	t.Helper()
	children := make([]*child, n)
	for i := range children {
		cmd := pgtest.Command(t, dsn, childEnv+"="+strconv.Itoa(i))
		c := &child{cmd: cmd, lines: make(chan string, 1024), output: new(syncBuffer)}
		cmd.Stderr = c.output
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if c.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines, output := c.lines, c.output
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(sc.Text(), childPrefix); ok {
					lines <- rest
				} else {
					fmt.Fprintln(output, sc.Text())
				}
			}
		}()
		t.Cleanup(func() {
			c.stdin.Close()
			cmd.Process.Kill() // a no-op once it has exited
			<-done
			cmd.Wait()
		})
		children[i] = c
	}
	for i, c := range children {
		if line, ok := <-c.lines; !ok || line != "ready" {
			t.Fatalf("worker %d did not get ready (said %q): %v\n%s", i, line, c.cmd.Wait(), c.output)
		}
	}
	return children
}

// run releases the workers together and returns each one's report lines
// once all have exited successfully.
func run(t *testing.T, children []*child) [][]string {
	t.Helper()
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		c.stdin.Close()
	}
	reports := make([][]string, len(children))
	for i, c := range children {
		for line := range c.lines {
			reports[i] = append(reports[i], line)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("worker %d: %v\n%s", i, err, c.output)
		}
	}
	return reports
}

// worker is the child's side: it opens the jar, reports ready, waits for
// the go, and returns the jar.
func worker(t *testing.T, dsn string) *pgjar.Jar {
	j := open(t, dsn, nil)
	fmt.Println(childPrefix + "ready")
	if line, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil || line != "go\n" {
		t.Fatalf("worker: got %q, %v; want go", line, err)
	}
	return j
}

const beginRounds = 40

// TestCrossProcessBegin races Begin on the same operation names from
// several processes: each name gets one key, created once, and every
// process gets that key.
func TestCrossProcessBegin(t *testing.T) {
	t.Parallel()
	if dsn, ok := pgtest.ChildDSN(); ok {
		j := worker(t, dsn)
		id := os.Getenv(childEnv)
		for i := range beginRounds {
			r := record(fmt.Sprint("charge:", i))
			r.Key = fmt.Sprintf("key-%d-from-%s", i, id)
			rec, created, err := j.Begin(t.Context(), r)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("%sbegin %s %s %v\n", childPrefix, rec.Op, rec.Key, created)
		}
		return
	}

	dsn := pgtest.DB(t)
	j := open(t, dsn, nil) // creates the schema before the workers start
	reports := run(t, startWorkers(t, dsn, workers))

	keys := map[string]map[string]int{} // op → key → how many workers got it
	created := map[string]int{}
	for i, lines := range reports {
		if len(lines) != beginRounds {
			t.Errorf("worker %d reported %d Begins; want %d", i, len(lines), beginRounds)
		}
		for _, line := range lines {
			var op, key string
			var c bool
			if _, err := fmt.Sscanf(line, "begin %s %s %t", &op, &key, &c); err != nil {
				t.Fatalf("worker %d: bad line %q: %v", i, line, err)
			}
			if keys[op] == nil {
				keys[op] = map[string]int{}
			}
			keys[op][key]++
			if c {
				created[op]++
			}
		}
	}
	if len(keys) != beginRounds {
		t.Errorf("%d operations reported; want %d", len(keys), beginRounds)
	}
	for op, ks := range keys {
		if len(ks) != 1 || created[op] != 1 {
			t.Errorf("%s: keys %v, created %d times; want one key for all %d workers, created once", op, ks, created[op], workers)
			continue
		}
		rec, err := j.Get(t.Context(), op)
		if err != nil {
			t.Fatal(err)
		}
		if ks[rec.Key] != workers {
			t.Errorf("%s: stored key %q; workers got %v", op, rec.Key, ks)
		}
	}
}

// acquireAttempts is how many times each worker tries to take the lease:
// a fixed number, so that the test's work is bounded whatever the
// scheduling.
const acquireAttempts = 150

// TestCrossProcessAcquire has several processes try to take one
// operation's lease at once, each releasing it as soon as it has done its
// "send": a probe row counts the holders inside that critical section, and
// must never see two.
func TestCrossProcessAcquire(t *testing.T) {
	t.Parallel()
	if dsn, ok := pgtest.ChildDSN(); ok {
		j := worker(t, dsn)
		holder := "worker-" + os.Getenv(childEnv)
		conn := pgtest.Connect(t, dsn)
		ctx := t.Context()
		held, refused := 0, 0
		for range acquireAttempts {
			_, err := j.Acquire(ctx, "send:1", holder, time.Now(), time.Minute)
			if errors.Is(err, idem.ErrLeased) {
				refused++
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			// The critical section: one send at a time.
			if _, err := conn.Exec(ctx, `UPDATE probe SET inside = inside + 1,
				max_inside = greatest(max_inside, inside + 1), entries = entries + 1`); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Update(ctx, "send:1", holder, idem.Change{Now: time.Now(), Attempts: 1}); err != nil {
				t.Fatalf("fenced Update while holding the lease: %v", err)
			}
			if _, err := conn.Exec(ctx, `UPDATE probe SET inside = inside - 1`); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Update(ctx, "send:1", holder, idem.Change{Now: time.Now(), Release: true}); err != nil {
				t.Fatalf("release: %v", err)
			}
			held++
		}
		fmt.Printf("%sheld %d refused %d\n", childPrefix, held, refused)
		return
	}

	dsn := pgtest.DB(t)
	j := open(t, dsn, nil)
	if _, _, err := j.Begin(t.Context(), record("send:1")); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(t.Context(), `CREATE TABLE probe (inside int, max_inside int, entries int);
		INSERT INTO probe VALUES (0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	reports := run(t, startWorkers(t, dsn, workers))
	totalHeld, totalRefused := 0, 0
	for i, lines := range reports {
		var held, refused int
		if len(lines) != 1 {
			t.Fatalf("worker %d reported %q; want one line", i, lines)
		}
		if _, err := fmt.Sscanf(lines[0], "held %d refused %d", &held, &refused); err != nil {
			t.Fatalf("worker %d: bad line %q: %v", i, lines[0], err)
		}
		if held+refused != acquireAttempts {
			t.Errorf("worker %d: %d held + %d refused; want %d attempts", i, held, refused, acquireAttempts)
		}
		totalHeld += held
		totalRefused += refused
	}
	// Workers released together contend: a run without a single refusal
	// would have tested nothing.
	if totalHeld == 0 || totalRefused == 0 {
		t.Fatalf("%d holds, %d refusals; want both, the lease contended", totalHeld, totalRefused)
	}
	var inside, maxInside, entries int
	if err := conn.QueryRow(t.Context(), `SELECT inside, max_inside, entries FROM probe`).Scan(&inside, &maxInside, &entries); err != nil {
		t.Fatal(err)
	}
	if maxInside != 1 || inside != 0 || entries != totalHeld {
		t.Errorf("probe: at most %d holders at once, %d inside at the end, %d entries; want 1, 0, %d",
			maxInside, inside, entries, totalHeld)
	}
	rec, err := j.Get(t.Context(), "send:1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Attempts != totalHeld || rec.Holder != "" {
		t.Errorf("record: %d attempts, holder %q; want %d attempts (no fenced update lost), no holder",
			rec.Attempts, rec.Holder, totalHeld)
	}
}
