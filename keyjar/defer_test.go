package keyjar_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

var _ idem.Deferrer = (*keyjar.Jar)(nil)

// TestDeferReadYourWrites holds the commit of a deferred change: Defer has
// returned, and Get must wait for the commit and see the change. A Get that
// read without waiting would see the record still pending.
func TestDeferReadYourWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, gate := openGated(t, keyjar.Hooks{})
		r := newRecord("op")
		r.Holder = "h"
		r.LeaseUntil = r.Created.Add(time.Minute)
		gate.release <- struct{}{} // Begin's commit
		if _, _, err := j.Begin(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		<-gate.entered // Begin's
		if err := j.Defer("op", "h", idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone,
			LastStatus: 201, Release: true}); err != nil {
			t.Fatalf("Defer: %v", err)
		}
		<-gate.entered // the deferred change is about to commit, and held
		got := make(chan idem.Record, 1)
		go func() {
			rec, err := j.Get(t.Context(), "op")
			if err != nil {
				t.Error(err)
			}
			got <- rec
		}()
		synctest.Wait()
		select {
		case rec := <-got:
			t.Fatalf("Get returned %s before the deferred change committed", rec.State)
		default:
		}
		gate.open()
		rec := <-got
		if rec.State != idem.StateDone || rec.LastStatus != 201 || rec.Holder != "" || !rec.LeaseUntil.IsZero() {
			t.Errorf("after Defer: state %s, status %d, holder %q, lease %v; want done, 201, free",
				rec.State, rec.LastStatus, rec.Holder, rec.LeaseUntil)
		}
		list, err := j.List(t.Context(), idem.Filter{State: idem.StateDone})
		if err != nil || len(list) != 1 {
			t.Errorf("List(done) = %d records, %v; want 1", len(list), err)
		}
	})
}

// TestDeferFenced: a deferred change is applied only under the holder's
// lease, and one for an unknown op is dropped; neither is an error.
func TestDeferFenced(t *testing.T) {
	j, _ := openTemp(t, nil)
	r := newRecord("op")
	r.Holder, r.LeaseUntil = "a", r.Created.Add(time.Minute)
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	now := r.Created.Add(time.Second)
	for _, holder := range []string{"b", "a"} { // b is refused, a applies
		if err := j.Defer("op", holder, idem.Change{Now: now, Attempts: 1, LastStatus: 409}); err != nil {
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
	if got.Attempts != 1 || got.LastStatus != 409 || got.Holder != "a" {
		t.Errorf("attempts %d, status %d, holder %q; want 1, 409, a (only a's change applied)", got.Attempts, got.LastStatus, got.Holder)
	}
	if _, err := j.Get(t.Context(), "unknown"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(unknown) = %v; want ErrNotFound", err)
	}
}

// TestDeferBadInputAndClose: an invalid change is refused at once; Close
// writes what was deferred before it, and Defer after Close fails.
func TestDeferBadInputAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRecord("op")
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	err = j.Defer("op", "", idem.Change{Now: r.Created, State: "bogus"})
	if !errors.Is(err, keyjar.ErrInvalid) {
		t.Errorf("Defer(state bogus) = %v; want ErrInvalid", err)
	}
	prefixOnce(t, "Defer(state bogus)", err)
	if err := j.Defer("op", "", idem.Change{Now: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.Is(err, keyjar.ErrInvalid) {
		t.Errorf("Defer(year 2300) = %v; want ErrInvalid", err)
	}
	if err := j.Defer("op", "", idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	err = j.Defer("op", "", idem.Change{Now: r.Created})
	if !errors.Is(err, keyjar.ErrClosed) {
		t.Errorf("Defer after Close = %v; want ErrClosed", err)
	}
	prefixOnce(t, "Defer after Close", err)
	j, err = keyjar.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got, err := j.Get(t.Context(), "op"); err != nil || got.State != idem.StateDone {
		t.Errorf("after Close and Open: state %s, %v; want done", got.State, err)
	}
}

// TestDeferJoinsNextBatch: a deferred change waits for the next write and
// shares its transaction; alone, it commits after a short wait.
func TestDeferJoinsNextBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, gate := openGated(t, keyjar.Hooks{})
		r := newRecord("a")
		gate.release <- struct{}{}
		if _, _, err := j.Begin(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		<-gate.entered // Begin's
		if err := j.Defer("a", "", idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone}); err != nil {
			t.Fatal(err)
		}
		began := make(chan error, 1)
		go func() {
			_, _, err := j.Begin(t.Context(), newRecord("b"))
			began <- err
		}()
		<-gate.entered
		if c := gate.log()[1]; c.Jobs != 2 || !c.Durable {
			t.Errorf("the commit after Defer and Begin: %+v; want both jobs in one durable transaction", c)
		}
		gate.release <- struct{}{}
		if err := <-began; err != nil {
			t.Fatal(err)
		}

		// Alone: committed once the wait is over, with nobody asking.
		if err := j.Defer("b", "", idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		<-gate.entered
		if waited := time.Since(start); waited <= 0 || waited > 10*time.Millisecond {
			t.Errorf("a lone deferred change committed after %v; want a short wait", waited)
		}
		if c := gate.log()[2]; c.Jobs != 1 || c.Durable {
			t.Errorf("lone deferred commit %+v; want 1 job, not durable", c)
		}
		gate.open()
	})
}

// TestCloseDuringACall closes the jar while an idem.Transport's call over it
// waits for its answer, as Close's doc tells: the answer still reaches the
// caller, and the jar, which records nothing more, keeps the operation
// pending and leased, for a resume to get the server's replay.
func TestCloseDuringACall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	j, err := keyjar.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	sent, answer := make(chan struct{}), make(chan struct{})
	tr := &idem.Transport{Jar: j, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		close(sent)
		<-answer
		return &http.Response{StatusCode: http.StatusCreated, Body: io.NopCloser(strings.NewReader("charged")), Request: r}, nil
	})}
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, err := http.NewRequestWithContext(idem.WithOperation(t.Context(), "charge"), http.MethodPost,
			"http://127.0.0.1:1/v1/charges", strings.NewReader(`{}`))
		if err != nil {
			done <- result{nil, err}
			return
		}
		resp, err := tr.RoundTrip(req)
		done <- result{resp, err}
	}()
	<-sent
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	close(answer)
	res := <-done
	if res.err != nil {
		t.Fatalf("RoundTrip: %v; want the answer that came", res.err)
	}
	b, err := io.ReadAll(res.resp.Body)
	res.resp.Body.Close()
	if res.resp.StatusCode != http.StatusCreated || string(b) != "charged" || err != nil {
		t.Fatalf("RoundTrip: %d %q, %v; want 201 charged", res.resp.StatusCode, b, err)
	}
	j, err = keyjar.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	rec, err := j.Get(t.Context(), "charge")
	if err != nil || rec.State != idem.StatePending || rec.Holder == "" || !rec.LeaseUntil.After(time.Now()) {
		t.Fatalf("after Close: %s held by %q until %v, %v; want pending, still leased", rec.State, rec.Holder, rec.LeaseUntil, err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestDeferDroppedIsLogged: a deferred change whose transaction fails is
// dropped, as Defer says, and Options.Logger gets one Warn record naming
// the operation and the error; a change fenced off is dropped silently.
// Close then returns idem.ErrDropped. Before, a dropped change reached
// nobody, and Close returned nil.
func TestDeferDroppedIsLogged(t *testing.T) {
	var fail atomic.Bool
	injected := errors.New("injected: disk I/O error")
	var logged strings.Builder
	j, err := keyjar.OpenHooked(t.Context(), filepath.Join(t.TempDir(), "keys.db"),
		&keyjar.Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))},
		keyjar.Hooks{JobError: func() error {
			if fail.Load() {
				return injected
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	r := newRecord("op")
	r.Holder, r.LeaseUntil = "h", r.Created.Add(time.Minute)
	if _, _, err := j.Begin(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	done := idem.Change{Now: r.Created.Add(time.Second), State: idem.StateDone, LastStatus: 201, Release: true}
	if err := j.Defer("op", "other", done); err != nil { // fenced off
		t.Fatal(err)
	}
	if _, err := j.Get(t.Context(), "op"); err != nil { // waits for it
		t.Fatal(err)
	}
	fail.Store(true)
	if err := j.Defer("op", "h", done); err != nil {
		t.Fatal(err)
	}
	rec, err := j.Get(t.Context(), "op")
	fail.Store(false)
	if err != nil || rec.State != idem.StatePending {
		t.Fatalf("Get after the failed change: %s, %v; want it still pending", rec.State, err)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "op=op") ||
		!strings.Contains(lines[0], `err="injected: disk I/O error"`) {
		t.Fatalf("logged %q; want one Warn record naming op and the error", logged.String())
	}
	// Close reports it too, as os.File's Close reports a write that did not
	// reach the disk; the change fenced off is not counted.
	err = j.Close()
	if !errors.Is(err, idem.ErrDropped) || !strings.Contains(err.Error(), "1 since") ||
		!strings.Contains(err.Error(), "injected: disk I/O error") {
		t.Errorf("Close = %v; want idem.ErrDropped, counting 1 change, on the injected error", err)
	}
}
