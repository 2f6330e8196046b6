package pgjar_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
)

var _ idem.Deferrer = (*pgjar.Jar)(nil)

// gate holds a jar's applier before each batch: entered receives the
// batch's size, and the applier sends the batch once release gets a value
// or is closed.
type gate struct {
	entered chan int
	release chan struct{}
	once    sync.Once
}

// holdApplier installs a gate on j's applier. The gate opens for good when the
// test ends, before the jar is closed.
func holdApplier(t *testing.T, j *pgjar.Jar) *gate {
	g := &gate{entered: make(chan int, 1024), release: make(chan struct{})}
	pgjar.HoldApplier(j, func(n int) {
		g.entered <- n
		<-g.release
	})
	t.Cleanup(g.open)
	return g
}

// open lets every batch through from now on.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// batches returns the sizes of the batches entered so far.
func (g *gate) batches() []int {
	var sizes []int
	for range cap(g.entered) {
		select {
		case n := <-g.entered:
			sizes = append(sizes, n)
		default:
			return sizes
		}
	}
	return sizes
}

// leased begins op, leased by "h" until a minute after t0.
func leased(t *testing.T, j *pgjar.Jar, op string) {
	t.Helper()
	r := record(op)
	r.Holder, r.LeaseUntil = "h", t0.Add(time.Minute)
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
}

// done is the outcome the Transport defers: done, and the lease released.
var done = idem.Change{Now: t0.Add(time.Second), State: idem.StateDone, LastStatus: 201, Release: true}

type result struct {
	rec idem.Record
	err error
}

// TestDeferReadYourWrites holds the applier with a deferred change in hand:
// a Get must wait for it, so cancelling the Get's context ends it with
// context.Canceled. A Get that did not wait would have read the record
// without the change. Once the applier goes on, Get sees the change.
func TestDeferReadYourWrites(t *testing.T) {
	dsn := pgtest.DB(t)
	synctest.Test(t, func(t *testing.T) {
		j := open(t, dsn, nil)
		g := holdApplier(t, j)
		leased(t, j, "op")
		if err := j.Defer("op", "h", done); err != nil {
			t.Fatalf("Defer: %v", err)
		}
		<-g.entered // the applier holds the change
		ctx, cancel := context.WithCancel(t.Context())
		got := make(chan result, 1)
		go func() {
			rec, err := j.Get(ctx, "op")
			got <- result{rec, err}
		}()
		synctest.Wait() // Get has returned, or waits for the applier
		select {
		case res := <-got:
			t.Fatalf("Get returned (%s, %v) while the deferred change was held", res.rec.State, res.err)
		default:
		}
		cancel()
		if res := <-got; !errors.Is(res.err, context.Canceled) {
			t.Errorf("Get with its context cancelled while waiting = (%s, %v); want context.Canceled", res.rec.State, res.err)
		}
		g.open()
		rec, err := j.Get(t.Context(), "op")
		if err != nil || rec.State != idem.StateDone || rec.LastStatus != 201 || rec.Holder != "" || !rec.LeaseUntil.IsZero() {
			t.Errorf("Get after the applier went on = %s, status %d, holder %q, lease %v, %v; want done, 201, free",
				rec.State, rec.LastStatus, rec.Holder, rec.LeaseUntil, err)
		}
	})
}

// TestDeferEveryMethodWaits: each method on the operation (List and Prune
// on any) waits for the change deferred before it, then acts on the record
// as changed: done, the lease released.
func TestDeferEveryMethodWaits(t *testing.T) {
	dsn := pgtest.DB(t)
	for name, call := range map[string]func(ctx context.Context, j *pgjar.Jar) error{
		"Get": func(ctx context.Context, j *pgjar.Jar) error {
			rec, err := j.Get(ctx, "op")
			if err == nil && rec.State != idem.StateDone {
				err = fmt.Errorf("state %s; want done", rec.State)
			}
			return err
		},
		"List": func(ctx context.Context, j *pgjar.Jar) error {
			list, err := j.List(ctx, idem.Filter{State: idem.StateDone})
			if err == nil && len(list) != 1 {
				err = fmt.Errorf("%d done records; want 1", len(list))
			}
			return err
		},
		"Begin": func(ctx context.Context, j *pgjar.Jar) error {
			rec, created, err := j.Begin(ctx, record("op"))
			if err == nil && (created || rec.State != idem.StateDone) {
				err = fmt.Errorf("created %v, state %s; want the done record", created, rec.State)
			}
			return err
		},
		"Acquire": func(ctx context.Context, j *pgjar.Jar) error {
			_, err := j.Acquire(ctx, "op", "other", t0.Add(2*time.Second), time.Minute)
			return err // ErrLeased while h holds it
		},
		"Update": func(ctx context.Context, j *pgjar.Jar) error {
			_, err := j.Update(ctx, "op", "h", idem.Change{Now: t0.Add(2 * time.Second), Attempts: 1})
			if errors.Is(err, idem.ErrLeaseLost) {
				return nil // h's lease was released
			}
			return fmt.Errorf("Update as h = %v; want ErrLeaseLost", err)
		},
		"Forget": func(ctx context.Context, j *pgjar.Jar) error {
			return j.Forget(ctx, "op")
		},
		"Prune": func(ctx context.Context, j *pgjar.Jar) error {
			n, err := j.Prune(ctx, t0.Add(time.Hour), 0)
			if err == nil && n != 1 {
				err = fmt.Errorf("pruned %d; want 1", n)
			}
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j := open(t, dsn, nil)
				// Each case starts from an empty table: List and Prune see every record.
				if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `DELETE FROM idem_operations`); err != nil {
					t.Fatal(err)
				}
				g := holdApplier(t, j)
				leased(t, j, "op")
				if err := j.Defer("op", "h", done); err != nil {
					t.Fatal(err)
				}
				<-g.entered
				got := make(chan error, 1)
				go func() { got <- call(t.Context(), j) }()
				synctest.Wait()
				select {
				case err := <-got:
					t.Fatalf("%s returned (%v) while the deferred change was held", name, err)
				default:
				}
				g.open()
				if err := <-got; err != nil {
					t.Errorf("%s after the deferred change: %v", name, err)
				}
			})
		})
	}
}

// TestDeferOtherOpsDoNotWait: a change deferred on one operation holds up
// no method on another.
func TestDeferOtherOpsDoNotWait(t *testing.T) {
	dsn := pgtest.DB(t)
	synctest.Test(t, func(t *testing.T) {
		j := open(t, dsn, nil)
		g := holdApplier(t, j)
		leased(t, j, "a")
		if err := j.Defer("a", "h", done); err != nil {
			t.Fatal(err)
		}
		<-g.entered
		got := make(chan error, 1)
		go func() {
			_, _, err := j.Begin(t.Context(), record("b"))
			if err == nil {
				_, err = j.Get(t.Context(), "b")
			}
			got <- err
		}()
		synctest.Wait()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("Begin and Get of b wait for a change deferred on a")
		}
	})
}

// TestDeferFenced: a deferred change is applied only under the holder's
// lease, and one for an unknown op is dropped; neither is an error.
func TestDeferFenced(t *testing.T) {
	j := open(t, pgtest.DB(t), nil)
	leased(t, j, "op")
	now := t0.Add(time.Second)
	for _, holder := range []string{"b", "h"} { // b is refused, h applies
		if err := j.Defer("op", holder, idem.Change{Now: now, Attempts: 1, LastStatus: 409, LastError: "by " + holder}); err != nil {
			t.Fatalf("Defer as %s: %v", holder, err)
		}
	}
	if err := j.Defer("unknown", "", idem.Change{Now: now, State: idem.StateDone}); err != nil {
		t.Fatalf("Defer of an unknown op: %v", err)
	}
	got, err := j.Get(t.Context(), "op")
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 1 || got.LastError != "by h" || got.Holder != "h" {
		t.Errorf("attempts %d, error %q, holder %q; want 1, by h, h (only h's change applied)",
			got.Attempts, got.LastError, got.Holder)
	}
	if _, err := j.Get(t.Context(), "unknown"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(unknown) = %v; want ErrNotFound", err)
	}
}

// TestDeferOrder: changes are applied in the order they were deferred, in
// batches of at most 64: while the applier holds the first, the next are
// queued, and go out together.
func TestDeferOrder(t *testing.T) {
	j := open(t, pgtest.DB(t), nil)
	g := holdApplier(t, j)
	for _, op := range []string{"a", "op", "z"} {
		leased(t, j, op)
	}
	defer1 := func(op string, c idem.Change) {
		t.Helper()
		if err := j.Defer(op, "", c); err != nil {
			t.Fatal(err)
		}
	}
	defer1("z", idem.Change{Now: t0})
	if n := <-g.entered; n != 1 {
		t.Fatalf("first batch of %d; want 1", n)
	}
	// One batch: the changes to op keep their order around one to a.
	defer1("op", idem.Change{Now: t0.Add(1), Attempts: 1, LastStatus: 503, Note: "first"})
	defer1("a", idem.Change{Now: t0.Add(2), LastStatus: 1})
	defer1("op", idem.Change{Now: t0.Add(3), Attempts: 1, LastStatus: 201, State: idem.StateDone})
	// Two batches: 100 changes to z.
	for i := range 100 {
		defer1("z", idem.Change{Now: t0.Add(time.Duration(4 + i)), Attempts: 1, LastStatus: i})
	}
	g.open()
	rec, err := j.Get(t.Context(), "op")
	if err != nil || rec.Attempts != 2 || rec.LastStatus != 201 || rec.State != idem.StateDone || rec.Note != "first" {
		t.Errorf("op: %d attempts, status %d, %s, note %q, %v; want 2, 201, done, first",
			rec.Attempts, rec.LastStatus, rec.State, rec.Note, err)
	}
	rec, err = j.Get(t.Context(), "z")
	if err != nil || rec.Attempts != 100 || rec.LastStatus != 99 || !rec.Updated.Equal(t0.Add(103)) {
		t.Errorf("z: %d attempts, status %d, updated %v, %v; want 100, 99, t0+103ns",
			rec.Attempts, rec.LastStatus, rec.Updated, err)
	}
	if sizes, want := g.batches(), []int{64, 39}; !slices.Equal(sizes, want) {
		t.Errorf("batches after the first: %v; want %v", sizes, want)
	}
}

// TestDeferInvalidAndClose: an invalid change is refused at once; Close
// waits until the applier has applied what was queued, and Defer after
// Close fails.
func TestDeferInvalidAndClose(t *testing.T) {
	dsn := pgtest.DB(t)
	synctest.Test(t, func(t *testing.T) {
		j, err := pgjar.Open(t.Context(), dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		g := holdApplier(t, j)
		leased(t, j, "op")
		if err := j.Defer("op", "h", idem.Change{Now: t0, State: "sent"}); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Defer(state sent) = %v; want ErrInvalid", err)
		}
		if err := j.Defer("op", "h", idem.Change{Now: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Defer(year 2300) = %v; want ErrInvalid", err)
		}
		if err := j.Defer("op", "h", idem.Change{Now: t0.Add(time.Second), Attempts: 1, LastStatus: 503}); err != nil {
			t.Fatal(err)
		}
		<-g.entered
		if err := j.Defer("op", "h", done); err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- j.Close() }()
		synctest.Wait()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) before the queued changes were applied", err)
		default:
		}
		g.open()
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := j.Defer("op", "", done); !errors.Is(err, pgjar.ErrClosed) {
			t.Errorf("Defer after Close = %v; want ErrClosed", err)
		}
		if err := j.Close(); !errors.Is(err, pgjar.ErrClosed) {
			t.Errorf("second Close = %v; want ErrClosed", err)
		}
		rec, err := open(t, dsn, nil).Get(t.Context(), "op")
		if err != nil || rec.State != idem.StateDone || rec.Attempts != 1 || rec.Holder != "" {
			t.Errorf("after Close and Open: %s, %d attempts, holder %q, %v; want done, 1, free",
				rec.State, rec.Attempts, rec.Holder, err)
		}
	})
}

// TestTransportDefersOutcome: a call through idem.Transport on a pgjar ends
// with the record done and its lease released, the outcome sent by the
// applier.
func TestTransportDefersOutcome(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := open(t, pgtest.DB(t), nil)
	g := holdApplier(t, j)
	g.open() // count the batches only
	client := &http.Client{Transport: &idem.Transport{Jar: j}}
	req, err := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge:1"), http.MethodPost,
		srv.URL, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d; want 201", resp.StatusCode)
	}
	rec, err := j.Get(t.Context(), "charge:1")
	if err != nil || rec.State != idem.StateDone || rec.LastStatus != 201 || rec.Attempts != 1 || rec.Holder != "" {
		t.Errorf("record: %s, status %d, %d attempts, holder %q, %v; want done, 201, 1, free",
			rec.State, rec.LastStatus, rec.Attempts, rec.Holder, err)
	}
	if len(g.batches()) == 0 {
		t.Error("the applier sent nothing: the Transport waited for its outcome")
	}
}

// BenchmarkOutcome: one operation after another, Begin then its outcome,
// written with Update or deferred.
func BenchmarkOutcome(b *testing.B) {
	for _, mode := range []string{"Update", "Defer"} {
		b.Run(mode, func(b *testing.B) {
			j, err := pgjar.Open(b.Context(), pgtest.DB(b), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			i := 0
			for b.Loop() {
				r := record(fmt.Sprint("op-", i))
				i++
				r.Holder, r.LeaseUntil = "h", t0.Add(time.Minute)
				if _, _, err := j.Begin(b.Context(), r); err != nil {
					b.Fatal(err)
				}
				if mode == "Update" {
					_, err = j.Update(b.Context(), r.Op, "h", done)
				} else {
					err = j.Defer(r.Op, "h", done)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestRefusedChangeSparesItsBatch: a deferred change the database refuses
// for its data (an attempt count past bigint) is dropped alone, and
// Options.Logger gets one Warn record naming it and the error; the other
// changes of its batch are applied, and one fenced off is dropped without
// a record.
func TestRefusedChangeSparesItsBatch(t *testing.T) {
	if math.MaxInt < math.MaxInt64 {
		t.Skip("an attempt count at bigint's largest needs a 64-bit int")
	}
	var logged syncBuffer
	j := open(t, pgtest.DB(t), &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	g := holdApplier(t, j)
	for _, op := range []string{"a", "z"} {
		leased(t, j, op)
	}
	full := record("b")
	full.Holder, full.LeaseUntil, full.Attempts = "h", t0.Add(time.Minute), math.MaxInt
	if _, _, err := j.Begin(t.Context(), full); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("z", "h", idem.Change{Now: t0}); err != nil { // holds the applier on a first batch
		t.Fatal(err)
	}
	<-g.entered
	if err := j.Defer("a", "h", done); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("b", "h", idem.Change{Now: t0, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("z", "other", done); err != nil { // fenced off
		t.Fatal(err)
	}
	g.open()
	a, err := j.Get(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := j.Get(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	if sizes := g.batches(); len(sizes) != 1 || sizes[0] != 3 {
		t.Fatalf("batches after the first: %v; want one of 3 changes", sizes)
	}
	if a.State != idem.StateDone || a.Holder != "" || b.Attempts != math.MaxInt {
		t.Errorf("a is %s held by %q, b has %d attempts; want a done and released, b as it was", a.State, a.Holder, b.Attempts)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "op=b") ||
		!strings.Contains(lines[0], "out of range") {
		t.Errorf("logged %q; want one Warn record naming b and the database's error", logged.String())
	}
	closeDropped(t, j, "1 since", "22003")
}

// closeDropped closes j and checks that Close reports the deferred changes
// dropped: an error matching idem.ErrDropped whose text holds each of want.
func closeDropped(t *testing.T, j *pgjar.Jar, want ...string) {
	t.Helper()
	err := j.Close()
	if !errors.Is(err, idem.ErrDropped) {
		t.Fatalf("Close = %v; want it to match idem.ErrDropped", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Close = %q; want it to say %q", err, w)
		}
	}
	if err := j.Close(); !errors.Is(err, pgjar.ErrClosed) {
		t.Errorf("Close again = %v; want ErrClosed", err)
	}
}

// TestDroppedBatchIsLogged: a batch of deferred changes that fails whole
// (here its UPDATE waits for a row another transaction locks, past the
// statement_timeout QueryTimeout sets) is dropped, and Options.Logger gets
// one Warn record per change, naming its operation and the error. Before,
// nobody heard of it.
func TestDroppedBatchIsLogged(t *testing.T) {
	var logged syncBuffer
	dsn := pgtest.DB(t)
	// The jar is created first under the default timeout: the short one is
	// for the blocked batch, and a loaded machine has taken an Open
	// (creating the tables) past 200 ms.
	open(t, dsn, nil)
	j := open(t, dsn, &pgjar.Options{QueryTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	leased(t, j, "a")
	tx, err := pgtest.Connect(t, dsn).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT FROM idem_operations WHERE op = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("a", "h", done); err != nil {
		t.Fatal(err)
	}
	rec, err := j.Get(t.Context(), "a") // waits for the applier
	if err != nil || rec.State != idem.StatePending {
		t.Fatalf("Get after the dropped change: %s, %v; want it still pending", rec.State, err)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "op=a") ||
		!strings.Contains(lines[0], "57014") {
		t.Errorf("logged %q; want one Warn record naming a and the statement timeout", logged.String())
	}
	closeDropped(t, j, "1 since", "57014")
}

// TestStatusOutOfRange: a LastStatus that PostgreSQL's integer column cannot
// hold is ErrInvalid before anything is sent, for Defer as for Update and
// Begin; a deferred one would fail its whole batch in the driver, and take
// the other changes of the batch with it.
func TestStatusOutOfRange(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("an int cannot hold a status out of 32 bits here")
	}
	j := open(t, pgtest.DB(t), nil)
	g := holdApplier(t, j)
	for _, op := range []string{"a", "b", "z"} {
		leased(t, j, op)
	}
	if err := j.Defer("z", "h", idem.Change{Now: t0}); err != nil { // holds the applier on a first batch
		t.Fatal(err)
	}
	<-g.entered
	past := int64(math.MaxInt32) + 1 // an int of 64 bits (above)
	statuses := []int{int(past), int(-past - 1)}
	for _, status := range statuses {
		if err := j.Defer("b", "h", idem.Change{Now: t0, LastStatus: status}); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Defer with LastStatus %d: %v; want ErrInvalid", status, err)
		}
	}
	if err := j.Defer("a", "h", done); err != nil {
		t.Fatal(err)
	}
	g.open()
	a, err := j.Get(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if a.State != idem.StateDone || a.Holder != "" {
		t.Errorf("a is %s held by %q; want done and released", a.State, a.Holder)
	}
	for _, status := range statuses {
		if _, err := j.Update(t.Context(), "b", "h", idem.Change{Now: t0, LastStatus: status}); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Update with LastStatus %d: %v; want ErrInvalid", status, err)
		}
		r := record("c")
		r.LastStatus = status
		if _, _, err := j.Begin(t.Context(), r); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Begin with LastStatus %d: %v; want ErrInvalid", status, err)
		}
	}
	if _, err := j.Get(t.Context(), "c"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(c) after refused Begins: %v; want ErrNotFound", err)
	}
}

// TestInvalidStringMasksURLPassword: the ErrInvalid of a string that text
// cannot hold quotes it with the password of a URL in it masked
// (user:xxxxx@), as url.URL.Redacted masks it: a record's URL, or an error
// that quotes one.
func TestInvalidStringMasksURLPassword(t *testing.T) {
	const pw = "s3cretPW"
	j := open(t, pgtest.DB(t), nil)
	leased(t, j, "op")
	url := "https://ops:" + pw + "@api.example.test/v1/caf\xe9"
	r := record("op2")
	r.URL = url
	_, _, err := j.Begin(t.Context(), r)
	if !errors.Is(err, pgjar.ErrInvalid) || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), "ops:xxxxx@") {
		t.Errorf("Begin with URL %q: %v; want ErrInvalid, the password masked, ops:xxxxx@", url, err)
	}
	_, err = j.Update(t.Context(), "op", "h", idem.Change{Now: t0, LastError: `Post "` + url + `": EOF`})
	if !errors.Is(err, pgjar.ErrInvalid) || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), "ops:xxxxx@") {
		t.Errorf("Update with a LastError quoting %q: %v; want ErrInvalid, the password masked, ops:xxxxx@", url, err)
	}
}

// TestStringsTextCannotHold: a NUL byte or bytes that are not UTF-8, which
// PostgreSQL's text refuses, are ErrInvalid before anything is sent, for
// Defer as for Update; so is an Op too long for the index.
func TestStringsTextCannotHold(t *testing.T) {
	j := open(t, pgtest.DB(t), nil)
	leased(t, j, "op")
	for _, s := range []string{"a\x00b", "caf\xe9"} {
		c := idem.Change{Now: t0, LastError: s}
		if _, err := j.Update(t.Context(), "op", "h", c); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Update with LastError %q: %v; want ErrInvalid", s, err)
		}
		if err := j.Defer("op", "h", c); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Defer with LastError %q: %v; want ErrInvalid", s, err)
		}
		r := record("op2")
		r.Note = s
		if _, _, err := j.Begin(t.Context(), r); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Begin with Note %q: %v; want ErrInvalid", s, err)
		}
		if _, err := j.Acquire(t.Context(), "op", s, t0, time.Minute); !errors.Is(err, pgjar.ErrInvalid) {
			t.Errorf("Acquire for holder %q: %v; want ErrInvalid", s, err)
		}
	}
	// Such a name or key is unknown to the reads.
	if _, err := j.Get(t.Context(), "a\x00b"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get of a name with a NUL byte: %v; want ErrNotFound", err)
	}
	if err := j.Forget(t.Context(), "caf\xe9"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Forget of a name that is not UTF-8: %v; want ErrNotFound", err)
	}
	if recs, err := j.ByKey(t.Context(), "a\x00b"); err != nil || len(recs) != 0 {
		t.Errorf("ByKey of a key with a NUL byte: %v, %v; want none", recs, err)
	}
	// Such a state is no state, which List refuses, as it does any other.
	for _, s := range []idem.State{"pend\x00ing", "caf\xe9"} {
		if recs, err := j.List(t.Context(), idem.Filter{State: s}); !errors.Is(err, pgjar.ErrInvalid) || len(recs) != 0 {
			t.Errorf("List of state %q: %v, %v; want ErrInvalid", s, recs, err)
		}
	}
	if _, _, err := j.Begin(t.Context(), record(strings.Repeat("x", pgjar.MaxOpLen+1))); !errors.Is(err, pgjar.ErrInvalid) {
		t.Errorf("Begin of an Op of %d bytes: %v; want ErrInvalid", pgjar.MaxOpLen+1, err)
	}
	// The longest name is stored, even one that does not compress.
	long := make([]byte, pgjar.MaxOpLen)
	for i := range long {
		long[i] = byte(33 + (i*7919+i*i)%94)
	}
	if _, created, err := j.Begin(t.Context(), record(string(long))); err != nil || !created {
		t.Errorf("Begin of an Op of %d bytes: %v, %v; want it created", len(long), created, err)
	}
}

// TestDeferAcrossRestart restarts PostgreSQL, and lets it start again once
// the applier, sending a deferred outcome, found it down. The applier
// sends it again once the server is back: the record is done and its
// lease free. Before, the change was dropped: the record stayed pending,
// leased to a call that had ended.
func TestDeferAcrossRestart(t *testing.T) {
	t.Parallel()
	c, dsn := pgtest.Own(t)
	relay, dsn := pgtest.NewRelay(t, dsn)
	j := open(t, dsn, nil)
	leased(t, j, "op")
	err := c.Restart(t.Context(), func() {
		if err := j.Defer("op", "h", done); err != nil {
			t.Errorf("Defer: %v", err)
		}
		<-relay.Refused()
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := j.Get(t.Context(), "op")
	if err != nil || rec.State != idem.StateDone || rec.Holder != "" || !rec.LeaseUntil.IsZero() {
		t.Errorf("after the restart: %s, holder %q, lease %v, %v; want done, free", rec.State, rec.Holder, rec.LeaseUntil, err)
	}
}

// TestDeferAnswerLost loses the answer to a batch the server applied: the
// applier sends again only the change that applying twice applies once
// (an outcome that releases the lease, which the second run finds
// released), not one that adds an attempt, which would count it twice.
// The one it does not send again is dropped as one lost to an error is:
// Options.Logger hears of it, and Close reports it. Before, nobody did.
func TestDeferAnswerLost(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	var logged syncBuffer
	j := open(t, dsn, &pgjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	g := holdApplier(t, j)
	leased(t, j, "counted")
	leased(t, j, "released")
	if err := j.Defer("other", "h", done); err != nil { // holds the applier on a first batch
		t.Fatal(err)
	}
	<-g.entered
	if err := j.Defer("counted", "h", idem.Change{Now: t0, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := j.Defer("released", "h", done); err != nil {
		t.Fatal(err)
	}
	g.release <- struct{}{} // the first batch
	if n := <-g.entered; n != 2 {
		t.Fatalf("second batch of %d changes; want both", n)
	}
	lost := relay.LoseNext("UPDATE")
	g.open()
	for op, want := range map[string]func(idem.Record) bool{
		"counted":  func(r idem.Record) bool { return r.Attempts == 1 && r.Holder == "h" },
		"released": func(r idem.Record) bool { return r.State == idem.StateDone && r.Holder == "" },
	} {
		if rec, err := j.Get(t.Context(), op); err != nil || !want(rec) {
			t.Errorf("%s: %s, %d attempts, holder %q, %v", op, rec.State, rec.Attempts, rec.Holder, err)
		}
	}
	select {
	case <-lost:
	default:
		t.Error("the relay lost no answer")
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "op=counted") {
		t.Errorf("logged %q; want one Warn record naming counted", logged.String())
	}
	closeDropped(t, j, "1 since")
}
