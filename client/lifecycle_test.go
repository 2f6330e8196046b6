package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/idemkit/idem/retry"
)

// TestRedirectedAnswerIsNotTheOperations: a POST answered 303 is done; the
// status of the GET the redirect makes (here 503) is a plain StatusError,
// not the operation's outcome: no *idem.PendingError, no key.
func TestRedirectedAnswerIsNotTheOperations(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/charges/ch_1", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /charges/ch_1", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "cache warming up", http.StatusServiceUnavailable)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	c, err := client.New(ctx, "", &client.Options{Jar: &idem.MemoryJar{}, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	_, err = c.PostJSON(ctx, "charge:o1", srv.URL+"/charges", chargeReq{Order: "o1"}, nil)
	st := state(t, c.Jar(), "charge:o1")
	t.Logf("PostJSON error: %v; jar state %s", err, st)
	if st != idem.StateDone {
		t.Fatalf("the POST got a final 303: state %s, want done", st)
	}
	if errors.Is(err, idem.ErrPending) {
		_, rerr := c.Resume(ctx, "charge:o1")
		t.Fatalf("err matches idem.ErrPending (no answer: call it again), but the call got the operation's answer, a 303; Resume says: %v", rerr)
	}
}

// TestCallersKeyNotOnTheRedirect: a caller's own Idempotency-Key, which
// http.Client copies onto the GET a 303 makes, is not sent with it, to
// that host or any other: the GET is no operation, and its answer (here a
// 503) is a plain StatusError, not the operation's outcome.
func TestCallersKeyNotOnTheRedirect(t *testing.T) {
	const key = "order-42-charge"
	var mu sync.Mutex
	keys := map[string][]string{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close()
		}
		mu.Lock()
		keys[r.URL.String()] = r.Header.Values(idem.KeyHeader)
		mu.Unlock()
		resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: http.NoBody, Request: r}
		if r.Method == http.MethodPost {
			resp.StatusCode = http.StatusSeeOther
			resp.Header.Set("Location", "https://receipts.test/ch_1")
		}
		return resp, nil
	})
	c := newClient(t, nil, &client.Options{Base: base})
	req, _ := http.NewRequest(http.MethodPost, "https://api.test/charges", strings.NewReader(`{"order":"o1"}`))
	req.Header.Set(idem.KeyHeader, key)
	_, err := c.Do(context.Background(), "", req)
	var se *client.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable || se.Key != "" || errors.Is(err, idem.ErrPending) {
		t.Errorf("the redirect's 503: %v; want a plain *StatusError, without the key, not matching idem.ErrPending", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := keys["https://api.test/charges"]; len(got) != 1 || got[0] != key {
		t.Errorf("the POST carried %q; want the key", got)
	}
	if got, ok := keys["https://receipts.test/ch_1"]; !ok || len(got) != 0 {
		t.Errorf("the redirect's GET (reached: %v) carried the key %q; want none", ok, got)
	}
}

// TestNoAnswerForADoneOperationIsCalledAgain: what idem.ErrPending tells a
// caller holds for a done operation too: the call got no answer, and a
// later call under the same name gets it, with the same key. Whether to
// Resume is the operation's State: Pending does not list a done one, and
// Resume refuses it, sending nothing.
func TestNoAnswerForADoneOperationIsCalledAgain(t *testing.T) {
	ctx := context.Background()
	s := newShop()
	c := newClient(t, s, &client.Options{Policy: retry.Policy{MaxAttempts: 2, InitialInterval: time.Microsecond}})
	if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil); err != nil {
		t.Fatal(err)
	}
	s.failNext(503, 503)
	_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil)
	var pe *idem.PendingError
	if !errors.Is(err, idem.ErrPending) || !errors.As(err, &pe) || pe.State != idem.StateDone {
		t.Fatalf("a done operation left without an answer: %v; want an error matching idem.ErrPending, its State done", err)
	}
	if recs, err := c.Pending(ctx); err != nil || len(recs) != 0 {
		t.Errorf("Pending: %v, %v; want nothing, the operation is done", recs, err)
	}
	if _, err := c.Resume(ctx, "charge:o1"); !errors.Is(err, client.ErrState) || s.sends() != 3 {
		t.Errorf("Resume: %v after %d sends; want ErrState, nothing sent", err, s.sends())
	}
	var ch charge
	resp, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, &ch)
	if err != nil || resp.Key != s.key(0) || !resp.Replayed || ch.Order != "o1" || s.charges("o1") != 1 {
		t.Fatalf("called again: %+v, %v; want the saved answer under key %q, o1 charged once (%d)", resp, err, s.key(0), s.charges("o1"))
	}
}

// TestResumeOfAnOperationAbandonedMeanwhile: a Resume that waits for
// another holder's lease sends nothing when, meanwhile, the operation was
// abandoned and started again under a new key: the order is charged once.
func TestResumeOfAnOperationAbandonedMeanwhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s, c := pendingCharge(t, nil) // charge:o1 pending; its one attempt got a 503 (not charged)
		oldKey := s.key(0)
		// Another process is sending it.
		if _, err := c.Jar().Acquire(ctx, "charge:o1", "other", time.Now(), time.Hour); err != nil {
			t.Fatal(err)
		}
		type result struct {
			resp *client.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := c.Resume(ctx, "charge:o1")
			if resp != nil {
				resp.Body.Close()
			}
			done <- result{resp, err}
		}()
		synctest.Wait() // Resume passed its state check and waits for the lease

		// The other holder lets go; the operator establishes that o1 was not
		// charged, abandons the operation and charges the order anew.
		if _, err := c.Jar().Update(ctx, "charge:o1", "other", idem.Change{Now: time.Now(), Release: true}); err != nil {
			t.Fatal(err)
		}
		if err := c.Abandon(ctx, "charge:o1", "ledger shows no charge for o1"); err != nil {
			t.Fatal(err)
		}
		resp, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		newKey := resp.Key

		r := <-done
		var keys []string
		for i := 0; i < s.sends(); i++ {
			keys = append(keys, s.key(i))
		}
		t.Logf("old key %s, new key %s; keys received: %v; Resume returned %v", oldKey, newKey, keys, r.err)
		if s.charges("o1") != 1 || s.key(s.sends()-1) == oldKey {
			t.Fatalf("order o1 charged %d times: Resume sent the abandoned operation with its old key after its state check (err %v)", s.charges("o1"), r.err)
		}
	})
}

// TestResumeOfAnOperationFinishedMeanwhile: a Resume that waits for the
// lease of a call still sending the operation sends nothing when that call
// finishes it meanwhile: ErrState, saying the state, and the server saw the
// one request. Sent again without the first call's credential (the
// documented limit of a resume), it would be a new request to a server that
// scopes keys by credential, which would charge the order twice.
func TestResumeOfAnOperationFinishedMeanwhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newShop()
		jar := &idem.MemoryJar{}
		held := make(chan struct{})
		gated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-held
			s.ServeHTTP(w, r)
		})
		caller := newClient(t, gated, &client.Options{Jar: jar})
		noCredential := func(*http.Request) error { return nil }
		resumer := newClient(t, gated, &client.Options{Jar: jar, Header: noCredential})

		called := make(chan error, 1)
		go func() {
			_, err := caller.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
			called <- err
		}()
		synctest.Wait() // the call holds the lease; its request is at the server
		resumed := make(chan error, 1)
		go func() {
			resp, err := resumer.Resume(ctx, "charge:o1")
			if resp != nil {
				resp.Body.Close()
			}
			resumed <- err
		}()
		synctest.Wait() // Resume found the operation pending and waits for the lease
		close(held)
		if err := <-called; err != nil {
			t.Fatalf("the call: %v", err)
		}
		err := <-resumed
		t.Logf("Resume: %v", err)
		if !errors.Is(err, client.ErrState) || !strings.Contains(err.Error(), "done") || s.sends() != 1 || s.charges("o1") != 1 {
			t.Fatalf("Resume: %v; the server got %d requests, charged o1 %d times; want ErrState naming the state done, 1 request, 1 charge",
				err, s.sends(), s.charges("o1"))
		}
		if r, _ := jar.Get(ctx, "charge:o1"); r.State != idem.StateDone || r.Holder != "" || r.Attempts != 1 {
			t.Fatalf("record %s, %d attempts, held by %q; want done, 1 attempt, its lease free", r.State, r.Attempts, r.Holder)
		}
	})
}

// settlingJar settles op (as another process would, its call ending) right
// after the first Get returns it: between Resume's check that it is pending
// and the Transport's Begin.
type settlingJar struct {
	*idem.MemoryJar
	op     string
	state  idem.State
	status int
	once   sync.Once
}

func (j *settlingJar) Get(ctx context.Context, op string) (idem.Record, error) {
	rec, err := j.MemoryJar.Get(ctx, op)
	if err == nil && op == j.op {
		j.once.Do(func() {
			_, err = j.Update(ctx, op, "", idem.Change{Now: time.Now(), State: j.state, LastStatus: j.status, Release: true})
		})
	}
	return rec, err
}

// TestResumeOfAnOperationSettledBeforeBegin: a Resume whose operation
// another process settles after Resume found it pending, before the
// Transport's Begin, sends nothing: ErrState, saying the state. An
// ordinary call would send a done or failed operation again, to get the
// server's answer; a resume, without the first credential, could run it
// again.
func TestResumeOfAnOperationSettledBeforeBegin(t *testing.T) {
	for _, tt := range []struct {
		state  idem.State
		status int
	}{{idem.StateDone, 201}, {idem.StateFailed, 422}} {
		t.Run(string(tt.state), func(t *testing.T) {
			ctx := context.Background()
			jar := &settlingJar{MemoryJar: &idem.MemoryJar{}, state: tt.state, status: tt.status}
			s, c := pendingCharge(t, &client.Options{Jar: jar})
			jar.op = "charge:o1"
			_, err := c.Resume(ctx, "charge:o1")
			t.Logf("Resume: %v", err)
			var se *client.StateError
			if !errors.Is(err, client.ErrState) || !errors.As(err, &se) || se.State != tt.state || se.Key != s.key(0) ||
				!strings.Contains(err.Error(), string(tt.state)) || s.sends() != 1 {
				t.Fatalf("Resume: %v after %d sends; want a *StateError with the state %s and key %q, nothing sent after the first",
					err, s.sends(), tt.state, s.key(0))
			}
			if r, _ := jar.Get(ctx, "charge:o1"); r.State != tt.state || r.Holder != "" {
				t.Fatalf("record %s held by %q; want %s, its lease free", r.State, r.Holder, tt.state)
			}
		})
	}
}

// eachJar runs f over each kind of jar the Client documents: MemoryJar,
// keyjar (SQLite) and pgjar (PostgreSQL).
func eachJar(t *testing.T, f func(t *testing.T, jar client.Jar)) {
	for _, kind := range []string{"MemoryJar", "keyjar", "pgjar"} {
		t.Run(kind, func(t *testing.T) {
			var jar interface {
				client.Jar
				Close() error
			}
			var err error
			switch kind {
			case "MemoryJar":
				f(t, &idem.MemoryJar{})
				return
			case "keyjar":
				jar, err = keyjar.Open(t.Context(), filepath.Join(t.TempDir(), "keys.db"), nil)
			case "pgjar":
				jar, err = pgjar.Open(t.Context(), pgtest.DB(t), nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { jar.Close() })
			f(t, jar)
		})
	}
}

// TestResumeOfAnOperationAbandonedOrForgottenBeforeBegin: another process
// abandons the operation after Resume found it pending and before the
// Transport takes it up; it may also forget it, or begin its name again
// under a new key. Resume sends nothing: ErrState naming the state for the
// abandoned one, idem.ErrNotFound for the one that is gone, a
// *idem.MismatchError for the new one, as when this happens while Resume
// waits for a lease; the jar is left as the other process left it. Begin
// would have replaced the abandoned record, or created the forgotten one
// anew, and sent it under a new key: a second charge when the first
// request did get through.
func TestResumeOfAnOperationAbandonedOrForgottenBeforeBegin(t *testing.T) {
	for _, then := range []string{"abandoned", "forgotten", "begun again"} {
		t.Run(then, func(t *testing.T) {
			eachJar(t, func(t *testing.T, jar client.Jar) {
				ctx := context.Background()
				hj := &hookJar{Jar: jar}
				s, c := pendingCharge(t, &client.Options{Jar: hj})
				other := newClient(t, s, &client.Options{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}})
				var settled idem.Record
				hj.onGet = func() { // after Resume's check, before the Transport
					if err := other.Abandon(ctx, "charge:o1", "checked by another operator"); err != nil {
						t.Fatal(err)
					}
					switch then {
					case "forgotten":
						if err := other.Forget(ctx, "charge:o1"); err != nil {
							t.Fatal(err)
						}
					case "begun again":
						s.failNext(503)
						if _, err := other.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); !errors.Is(err, idem.ErrPending) {
							t.Fatalf("the other call: %v; want it pending", err)
						}
					}
					settled, _ = jar.Get(ctx, "charge:o1")
				}
				_, err := c.Resume(ctx, "charge:o1")
				t.Logf("Resume: %v", err)
				if want := map[bool]int{false: 1, true: 2}[then == "begun again"]; s.sends() != want {
					t.Errorf("the server got %d requests, the last with key %q, the first with %q; want %d", s.sends(), s.key(s.sends()-1), s.key(0), want)
				}
				rec, gerr := jar.Get(ctx, "charge:o1")
				switch then {
				case "forgotten":
					if !errors.Is(err, idem.ErrNotFound) || !errors.Is(gerr, idem.ErrNotFound) {
						t.Fatalf("Resume: %v; then the jar's record: %v, state %s; want idem.ErrNotFound, and no record", err, gerr, rec.State)
					}
					return
				case "abandoned":
					if !errors.Is(err, client.ErrState) || !strings.Contains(err.Error(), "abandoned") {
						t.Fatalf("Resume: %v; want ErrState naming the state abandoned", err)
					}
				case "begun again":
					if !errors.Is(err, idem.ErrMismatch) || !strings.Contains(err.Error(), "begun again") {
						t.Fatalf("Resume: %v; want a *idem.MismatchError saying the operation was begun again", err)
					}
				}
				if gerr != nil || rec.State != settled.State || rec.Key != settled.Key || rec.Holder != "" || !rec.Updated.Equal(settled.Updated) {
					t.Fatalf("after Resume: %v, state %s, key %q, held by %q, updated %v; want the record as the other process left it: %s, key %q, free, updated %v",
						gerr, rec.State, rec.Key, rec.Holder, rec.Updated, settled.State, settled.Key, settled.Updated)
				}
			})
		})
	}
}

// TestRetryAfterKeptWhenTheCallIsCut: a call whose context ends while it
// waits out the server's Retry-After leaves the server's time in the
// record: Pending shows it, and Resume does not send before it.
func TestRetryAfterKeptWhenTheCallIsCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sends []time.Time
		start := time.Now()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sends = append(sends, time.Now())
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		c := newClient(t, h, &client.Options{Policy: retry.Policy{MaxAttempts: 5}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil)
		if !errors.Is(err, idem.ErrPending) {
			t.Fatalf("got %v; want a pending error", err)
		}
		pending, perr := c.Pending(context.Background())
		if perr != nil || len(pending) != 1 {
			t.Fatalf("pending %v, %v", pending, perr)
		}
		var pe *idem.PendingError
		errors.As(err, &pe)
		t.Logf("error: %v; PendingError.NextAttempt %v; record NextAttempt %v", err, pe.NextAttempt, pending[0].NextAttempt)
		want := start.Add(20 * time.Second)
		if !pending[0].NextAttempt.Equal(want) {
			resp, rerr := c.Resume(context.Background(), "charge:o1")
			if resp != nil {
				resp.Body.Close()
			}
			t.Fatalf("the server asked to be called at +%v; Pending's NextAttempt is %v; Resume then sent at once, at +%v (%v)",
				want.Sub(start), pending[0].NextAttempt, sends[1].Sub(start), rerr)
		}
	})
}

// TestResumeRefusesAMethodItDoesNotKey: a jar may hold operations of other
// methods than POST and PATCH (idem.Transport.Methods). Resume of one (a
// PUT here) would go through the Client's Transport without its key: it is
// refused with ErrMethod, and nothing is sent.
func TestResumeRefusesAMethodItDoesNotKey(t *testing.T) {
	ctx := context.Background()
	var keys []string
	var status = http.StatusServiceUnavailable
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		w.WriteHeader(status)
	})
	jar := &idem.MemoryJar{}
	hc := &http.Client{Transport: &idem.Transport{Jar: jar, Base: inProcess{h}, Methods: []string{"PUT"},
		Policy: retry.Policy{MaxAttempts: 1}}}
	req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, "put:doc-1"), http.MethodPut, chargesURL+"/doc-1", strings.NewReader(`{"v":1}`))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	rec, err := jar.Get(ctx, "put:doc-1")
	if err != nil || rec.State != idem.StatePending {
		t.Fatalf("%+v, %v; want a pending record", rec, err)
	}

	c, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{h}, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	status = http.StatusOK
	_, err = c.Resume(ctx, "put:doc-1")
	if !errors.Is(err, client.ErrMethod) || len(keys) != 1 {
		t.Fatalf("Resume of a PUT: %v after %d sends; want ErrMethod, nothing sent (it would go without its key)", err, len(keys))
	}
	if !strings.Contains(err.Error(), "Options.Methods") {
		t.Errorf("Resume of a PUT: %v; want it to point to Options.Methods", err)
	}
}

// TestOptionsMethods: Options.Methods chooses the methods that get a key,
// as idem.Transport.Methods does. By default a PUT is sent once, without a
// key or a record. With {"PUT"}, a PUT carries a key, stays pending after
// a 503, and Resume sends it again with that key; a 307 to it comes back as
// the answer instead of being followed as another operation.
func TestOptionsMethods(t *testing.T) {
	ctx := context.Background()
	var keys []string
	status := http.StatusServiceUnavailable
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		if r.URL.Path == "/moved" {
			w.Header().Set("Location", "/elsewhere")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(status)
	})
	put := func(c *client.Client, op, path string) error {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, "http://shop.test"+path, strings.NewReader(`{"v":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(ctx, op, req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	once := retry.Policy{MaxAttempts: 1}

	jar := &idem.MemoryJar{}
	err := put(newClient(t, h, &client.Options{Jar: jar, Policy: once}), "put:doc-1", "/doc-1")
	if errors.Is(err, idem.ErrPending) || len(keys) != 1 || keys[0] != "" {
		t.Fatalf("a PUT by default: %v, keys %q; want a 503 without a key, not pending", err, keys)
	}
	if _, err := jar.Get(ctx, "put:doc-1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a PUT by default: Get = %v; want ErrNotFound, no record", err)
	}

	keys = nil
	methods := []string{"PUT"}
	c := newClient(t, h, &client.Options{Jar: jar, Policy: once, Methods: methods})
	methods[0] = http.MethodGet // the Client keeps the methods it was given
	if err := put(c, "put:doc-1", "/doc-1"); !errors.Is(err, idem.ErrPending) || len(keys) != 1 || keys[0] == "" {
		t.Fatalf("a PUT with Methods {PUT}: %v, keys %q; want a 503 with a key, pending", err, keys)
	}
	status = http.StatusOK
	if _, err := c.Resume(ctx, "put:doc-1"); err != nil || len(keys) != 2 || keys[1] != keys[0] {
		t.Fatalf("Resume of the PUT: %v, keys %q; want it sent again with its key", err, keys)
	}
	if got := state(t, jar, "put:doc-1"); got != idem.StateDone {
		t.Errorf("after Resume: %s; want done", got)
	}

	var se *client.StatusError
	if err := put(c, "put:doc-2", "/moved"); !errors.As(err, &se) || se.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("a PUT answered 307: %v; want the 307 as a *StatusError, not followed", err)
	}
}

// hookJar is a client.Jar that runs a hook once, on the first call of
// Get or Acquire, to interleave another process's step deterministically.
type hookJar struct {
	client.Jar
	onGet, onAcquire func()
}

func (j *hookJar) Get(ctx context.Context, op string) (idem.Record, error) {
	r, err := j.Jar.Get(ctx, op)
	if f := j.onGet; f != nil {
		j.onGet = nil
		f()
	}
	return r, err
}

func (j *hookJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	if f := j.onAcquire; f != nil {
		j.onAcquire = nil
		f()
	}
	return j.Jar.Acquire(ctx, op, holder, now, ttl)
}

// TestAbandonRacingAnotherAbandon: an Abandon that reads the operation
// pending, and takes its lease after another operator abandoned it, changes
// nothing and returns nil: abandoning an abandoned operation is no error.
func TestAbandonRacingAnotherAbandon(t *testing.T) {
	ctx := context.Background()
	_, c := pendingCharge(t, nil)
	other, err := client.New(ctx, "", &client.Options{Jar: c.Jar()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hj := &hookJar{Jar: c.Jar()}
	hj.onAcquire = func() {
		if err := other.Abandon(ctx, "charge:o1", "checked by operator B"); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := client.New(ctx, "", &client.Options{Jar: hj})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if err := mine.Abandon(ctx, "charge:o1", "checked by operator A"); err != nil {
		t.Fatalf("abandon of an operation another operator abandoned meanwhile: %v; want nil", err)
	}
}

// TestAbandonRacingTheOperationsEnd: an Abandon that reads the operation
// pending, and takes its lease after another process resumed it to its
// end, leaves it done under its key and returns a *StateError: the name
// keeps its key, and a new call with it is not sent under a new one.
func TestAbandonRacingTheOperationsEnd(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	rec, err := c.Jar().Get(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	other := newClient(t, s, &client.Options{Jar: c.Jar()}) // the shop answers it
	hj := &hookJar{Jar: c.Jar()}
	hj.onAcquire = func() {
		if _, err := other.Resume(ctx, "charge:o1"); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := client.New(ctx, "", &client.Options{Jar: hj})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	var se *client.StateError
	if err := mine.Abandon(ctx, "charge:o1", "checked by the operator"); !errors.As(err, &se) || se.State != idem.StateDone {
		t.Fatalf("abandon of an operation resumed to its end meanwhile: %v; want a *StateError in state done", err)
	}
	got, err := c.Jar().Get(ctx, "charge:o1")
	if err != nil || got.State != idem.StateDone || got.Key != rec.Key {
		t.Errorf("after the Abandon: %+v, %v; want the operation done under its key %q", got, err, rec.Key)
	}
}

// cancelAfterAcquireJar is a client.Jar that calls cancel once Acquire
// has taken a lease: the caller's context ends while it holds it.
type cancelAfterAcquireJar struct {
	client.Jar
	cancel context.CancelFunc
}

func (j cancelAfterAcquireJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	r, err := j.Jar.Acquire(ctx, op, holder, now, ttl)
	j.cancel()
	return r, err
}

// TestAbandonCancelledHoldingTheLeaseReleasesIt: an Abandon whose context
// ends after it took the operation's lease returns the context's error,
// leaves the operation pending and gives the lease back, although its
// context has ended: another Abandon succeeds at once, rather than wait
// out the lease of a process that is alive.
func TestAbandonCancelledHoldingTheLeaseReleasesIt(t *testing.T) {
	ctx := context.Background()
	_, c := pendingCharge(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mine, err := client.New(ctx, "", &client.Options{Jar: cancelAfterAcquireJar{Jar: c.Jar(), cancel: cancel}})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if err := mine.Abandon(cctx, "charge:o1", "the ledger shows no charge"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Abandon cancelled after it took the lease: %v; want context.Canceled", err)
	}
	rec, err := c.Jar().Get(ctx, "charge:o1")
	if err != nil || rec.State != idem.StatePending || rec.Holder != "" {
		t.Fatalf("after the cancelled Abandon: state %s, holder %q, %v; want pending, with no holder", rec.State, rec.Holder, err)
	}
	if err := c.Abandon(ctx, "charge:o1", "the ledger shows no charge"); err != nil {
		t.Fatalf("a second Abandon: %v; want nil", err)
	}
}

// keyHookJar is a hookJar that stays a client.KeyForgetter: its ForgetKey
// is its jar's.
type keyHookJar struct {
	*hookJar
	kf client.KeyForgetter
}

func (j keyHookJar) ForgetKey(ctx context.Context, op, key string) error {
	return j.kf.ForgetKey(ctx, op, key)
}

// TestForgetRacingBeginAgain: a Forget that reads an abandoned operation,
// after which a new call begins its name again (the jar replaces the
// abandoned record with a pending one under a new key), keeps the new
// operation, whose key was persisted and whose outcome is unknown, and
// returns ErrState.
func TestForgetRacingBeginAgain(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) client.KeyForgetter{
		"MemoryJar": func(*testing.T) client.KeyForgetter { return &idem.MemoryJar{} },
		"keyjar": func(t *testing.T) client.KeyForgetter {
			j, err := keyjar.Open(t.Context(), filepath.Join(t.TempDir(), "keys.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { j.Close() })
			return j
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			jar := open(t)
			s, c := pendingCharge(t, &client.Options{Jar: jar})
			if err := c.Abandon(ctx, "charge:o1", "checked: never charged"); err != nil {
				t.Fatal(err)
			}
			hj := &hookJar{Jar: jar}
			hj.onGet = func() {
				s.failNext(503)
				_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
				if !errors.Is(err, idem.ErrPending) {
					t.Fatalf("the call that begins the name again: %v; want it pending", err)
				}
			}
			mine, err := client.New(ctx, "", &client.Options{Jar: keyHookJar{hj, jar}})
			if err != nil {
				t.Fatal(err)
			}
			defer mine.Close()
			err = mine.Forget(ctx, "charge:o1")
			var se *client.StateError
			if !errors.Is(err, client.ErrState) || !errors.Is(err, idem.ErrNotForgotten) || !errors.As(err, &se) ||
				se.Op != "charge:o1" || se.Key != s.key(0) || se.State != "" {
				t.Errorf("Forget of an operation begun again after the read: %v (%+v); want a *StateError for the key read, %q, without a state, matching ErrState and idem.ErrNotForgotten",
					err, se, s.key(0))
			}
			rec, err := jar.Get(ctx, "charge:o1")
			if err != nil || rec.State != idem.StatePending || rec.Key != s.key(1) || rec.Key == s.key(0) {
				t.Fatalf("after Forget: %v (state %s, key %q); want the new operation kept, pending under key %q",
					err, rec.State, rec.Key, s.key(1))
			}
		})
	}
}

// TestForgetOverAJarWithoutForgetKey: over a jar that is not a
// client.KeyForgetter, Forget reads and deletes, and still refuses a
// pending operation.
func TestForgetOverAJarWithoutForgetKey(t *testing.T) {
	ctx := context.Background()
	plain := &hookJar{Jar: &idem.MemoryJar{}}
	if _, ok := client.Jar(plain).(client.KeyForgetter); ok {
		t.Fatal("hookJar is a client.KeyForgetter; the test needs a jar that is not")
	}
	_, c := pendingCharge(t, &client.Options{Jar: plain})
	if err := c.Forget(ctx, "charge:o1"); !errors.Is(err, client.ErrState) {
		t.Fatalf("forget of a pending operation: %v; want ErrState", err)
	}
	if err := c.Abandon(ctx, "charge:o1", "checked: never charged"); err != nil {
		t.Fatal(err)
	}
	if err := c.Forget(ctx, "charge:o1"); err != nil {
		t.Fatalf("forget of an abandoned operation: %v", err)
	}
	if err := c.Forget(ctx, "charge:o1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("forget twice: %v; want idem.ErrNotFound", err)
	}
}

// TestStatusErrorOfAnUnkeyedRequest: the StatusError of a request without a
// key (a named GET) has no Op and no Key.
func TestStatusErrorOfAnUnkeyedRequest(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	c := newClient(t, h, nil)
	req, _ := http.NewRequest(http.MethodGet, chargesURL+"/ch_1", nil)
	_, err := c.Do(context.Background(), "lookup:ch_1", req)
	var se *client.StatusError
	if !errors.As(err, &se) {
		t.Fatal(err)
	}
	if se.Key != "" || se.Op != "" {
		t.Fatalf("StatusError of a GET: Op %q, Key %q; documented as \"\" for a request without a key", se.Op, se.Key)
	}
}

// TestResponseOfAnUnkeyedRequest: the Response to a named GET, which is
// no operation, has no Op and no Key, as its StatusError would not, and the
// jar keeps nothing of it.
func TestResponseOfAnUnkeyedRequest(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	jar := &idem.MemoryJar{}
	c := newClient(t, h, &client.Options{Jar: jar})
	req, _ := http.NewRequest(http.MethodGet, chargesURL+"/ch_1", nil)
	resp, err := c.Do(context.Background(), "lookup:ch_1", req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Op != "" || resp.Key != "" {
		t.Errorf("Response to a named GET: Op %q, Key %q; want \"\" for a request the Client does not key", resp.Op, resp.Key)
	}
	if recs, err := jar.List(context.Background(), idem.Filter{}); err != nil || len(recs) != 0 {
		t.Errorf("jar after a named GET: %v, %v; want nothing", recs, err)
	}
}

// TestDoOfAnUnkeyedMethod: a named GET, or DELETE, is not an operation: it
// is sent once, with no key but the caller's own, sent as it is, even when
// the answer is one the Client retries for a POST, and the jar keeps
// nothing of it. Its answers have no Op and no Key: a 503 is no pending
// operation to resume.
func TestDoOfAnUnkeyedMethod(t *testing.T) {
	for _, c := range []struct{ method, callerKey string }{
		{http.MethodGet, ""},
		{http.MethodDelete, "del-42"},
	} {
		var sent atomic.Int32
		status := http.StatusOK
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sent.Add(1)
			if k := r.Header.Get(idem.KeyHeader); k != c.callerKey {
				t.Errorf("%s carried Idempotency-Key %q; want %q", c.method, k, c.callerKey)
			}
			w.WriteHeader(status)
		})
		jar := &idem.MemoryJar{}
		cl := newClient(t, h, &client.Options{Jar: jar})
		newReq := func() *http.Request {
			req, _ := http.NewRequest(c.method, chargesURL+"/ch_1", nil)
			if c.callerKey != "" {
				req.Header.Set(idem.KeyHeader, c.callerKey)
			}
			return req
		}
		resp, err := cl.Do(context.Background(), "", newReq())
		if err != nil || resp.Op != "" || resp.Key != "" {
			t.Fatalf("%s answered 200: %+v, %v; want a Response with no Op nor Key", c.method, resp, err)
		}
		resp.Body.Close()
		status = http.StatusServiceUnavailable
		_, err = cl.Do(context.Background(), "lookup:ch_1", newReq())
		var se *client.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable || se.Err != nil || errors.Is(err, idem.ErrPending) ||
			se.Op != "" || se.Key != "" {
			t.Fatalf("named %s answered 503: %v; want a *StatusError 503 whose Err, Op and Key are empty", c.method, err)
		}
		if n := sent.Load(); n != 2 {
			t.Errorf("%s sent %d times in two calls; want once each", c.method, n)
		}
		if recs, err := jar.List(context.Background(), idem.Filter{}); err != nil || len(recs) != 0 {
			t.Errorf("jar after a named %s: %v, %v; want nothing", c.method, recs, err)
		}
	}
}

// TestHeaderNotSentToAnotherHost: Options.Header adds credentials to the
// keyed request, but not to the GET of a redirect to another host (as
// net/http drops Authorization then).
func TestHeaderNotSentToAnotherHost(t *testing.T) {
	var elsewhere, here atomic.Value
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	defer other.Close()
	_, port, _ := net.SplitHostPort(other.Listener.Addr().String())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		here.Store(r.Header.Get("Authorization"))
		http.Redirect(w, r, "http://localhost:"+port+"/receipt", http.StatusSeeOther)
	}))
	defer srv.Close()
	postWithAuth(t, srv.URL+"/charges")
	if here.Load() != authValue || elsewhere.Load() != "" {
		t.Fatalf("Authorization %q on the keyed request, %q on the redirect to another host; want it on the first only", here.Load(), elsewhere.Load())
	}
}

// TestAbandonAfterItsHolderWasKilled: a lease held by a process on this
// host that is gone (kill -9) does not stop Abandon: nothing is sending
// the operation. A live holder's lease does.
func TestAbandonAfterItsHolderWasKilled(t *testing.T) {
	killed := killedHolder(t)
	for _, tt := range []struct {
		name   string
		holder string
		want   error
	}{
		{"killed", killed, nil},
		{"alive", fmt.Sprintf("%s/%d/x.1", holderHost(t), os.Getpid()), idem.ErrLeased},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			_, c := pendingCharge(t, nil)
			if _, err := c.Jar().Acquire(ctx, "charge:o1", tt.holder, time.Now(), time.Hour); err != nil {
				t.Fatal(err)
			}
			err := c.Abandon(ctx, "charge:o1", "the ledger shows no charge")
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("Abandon with the lease held by %s: %v; want %v", tt.holder, err, tt.want)
			}
			if tt.want == nil && state(t, c.Jar(), "charge:o1") != idem.StateAbandoned {
				t.Fatalf("state %s; want abandoned", state(t, c.Jar(), "charge:o1"))
			}
		})
	}
}

// lastErrorSpy is a client.Jar that records the LastError of every change
// written through it.
type lastErrorSpy struct {
	client.Jar
	mu      sync.Mutex
	written []string
}

func (j *lastErrorSpy) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	j.mu.Lock()
	j.written = append(j.written, c.LastError)
	j.mu.Unlock()
	return j.Jar.Update(ctx, op, holder, c)
}

// TestAbandonMasksAStoredLastError: a LastError that an earlier version
// stored with a password in it is masked the first time Abandon writes the
// record: when it releases a killed holder's lease as when it abandons
// the operation, neither of which writes the record's LastError anew.
func TestAbandonMasksAStoredLastError(t *testing.T) {
	const pw = "s3cretPW"
	stored := `Post "https://ops:` + pw + `@api.example.test/v1/charges": EOF`
	for _, killed := range []bool{false, true} {
		t.Run(fmt.Sprintf("killed holder %v", killed), func(t *testing.T) {
			ctx := context.Background()
			spy := &lastErrorSpy{Jar: &idem.MemoryJar{}}
			now := time.Now()
			r := idem.Record{Op: "charge:o1", Key: "k1", Fingerprint: "fp", State: idem.StatePending, Method: "POST", URL: chargesURL,
				Created: now, Updated: now, Attempts: 1, LastError: stored}
			if killed {
				r.Holder, r.LeaseUntil = killedHolder(t), now.Add(time.Hour)
			}
			if _, _, err := spy.Begin(ctx, r); err != nil {
				t.Fatal(err)
			}
			c, err := client.New(ctx, "", &client.Options{Jar: spy})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Abandon(ctx, "charge:o1", "the ledger shows no charge"); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 1, true: 2}[killed]; len(spy.written) != want {
				t.Fatalf("Abandon wrote the record %d times; want %d", len(spy.written), want)
			}
			for i, w := range spy.written {
				if strings.Contains(w, pw) || !strings.Contains(w, "ops:xxxxx@") {
					t.Errorf("write %d: LastError %q; want the stored URL's password masked, ops:xxxxx@", i+1, w)
				}
			}
		})
	}
}

// killedHolder returns a lease holder id of a process of this host that
// has ended, as one killed does (idem.HolderGone reports it gone). It
// skips on windows, where leases are waited out.
func killedHolder(t *testing.T) string {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("process liveness is not checked on windows: leases are waited out")
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s/%d/x.1", holderHost(t), child.ProcessState.Pid())
}

// holderHost returns the host part of the lease holder ids this process
// writes (idem.NewHolder).
func holderHost(t *testing.T) string {
	t.Helper()
	holder, err := idem.NewHolder()
	if err != nil {
		t.Fatal(err)
	}
	host, _, ok := strings.Cut(holder, "/")
	if !ok {
		t.Fatalf("holder %q: want host/pid/…", holder)
	}
	return host
}

// TestRetryWhileTheServerStillRuns: an attempt that timed out on the client
// still runs on the server. With the default policy the retry gets 409s whose
// Retry-After is about as long as the first attempt has run, so the call gets
// the first answer, replayed, soon after that attempt ends: one charge, one
// call. A Retry-After of the server's whole lease left (a minute) would be
// longer than MaxRetryAfter (30 s), and the call would stop pending.
func TestRetryWhileTheServerStillRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newShop()
		const runs = 3 * time.Second
		slow := s.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(runs)
			s.charge(w, r)
		}))
		var sent atomic.Int32
		var serving sync.WaitGroup
		defer serving.Wait() // the bubble ends with the server's work
		// The server goes on with a request whose client went away.
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil {
				return nil, err
			}
			sr := r.Clone(context.WithoutCancel(r.Context()))
			sr.Body = io.NopCloser(strings.NewReader(string(body)))
			done := make(chan *http.Response, 1)
			serving.Go(func() {
				rec := httptest.NewRecorder()
				slow.ServeHTTP(rec, sr)
				done <- rec.Result()
			})
			select {
			case resp := <-done:
				resp.Request = r
				return resp, nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		c := newClient(t, nil, &client.Options{Base: base, Policy: retry.Policy{AttemptTimeout: time.Second}})
		start := time.Now()
		resp, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
		if err != nil {
			t.Fatalf("PostJSON after %v and %d attempts: %v; want the first answer", time.Since(start), sent.Load(), err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 201 || !resp.Replayed || s.charges("o1") != 1 {
			t.Fatalf("got %d, replayed %v, %d charges; want the first attempt's 201, replayed, one charge", resp.StatusCode, resp.Replayed, s.charges("o1"))
		}
		if took := time.Since(start); took < runs || took > 2*runs || sent.Load() > 4 {
			t.Fatalf("the answer came after %v and %d attempts; want it within %v of the first attempt's end, in at most 4", took, sent.Load(), runs)
		}
	})
}

// failingUpdateJar is a client.Jar whose Update fails with err.
type failingUpdateJar struct {
	client.Jar
	err error
}

func (j failingUpdateJar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	return idem.Record{}, j.err
}

// TestAbandonReportsTheFailedRelease: when the lease of a killed holder
// cannot be released (the jar failed: a lock timeout, the database down),
// Abandon returns that failure, not the holder's lease, which would send
// the operator to wait until it ends for nothing.
func TestAbandonReportsTheFailedRelease(t *testing.T) {
	holder := killedHolder(t)
	ctx := context.Background()
	_, c := pendingCharge(t, nil)
	if _, err := c.Jar().Acquire(ctx, "charge:o1", holder, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	errDown := errors.New("jar unavailable")
	other, err := client.New(ctx, "", &client.Options{Jar: failingUpdateJar{Jar: c.Jar(), err: errDown}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	err = other.Abandon(ctx, "charge:o1", "the ledger shows no charge")
	if !errors.Is(err, errDown) || errors.Is(err, idem.ErrLeased) {
		t.Fatalf("Abandon when the killed holder's lease cannot be released: %v; want the jar's error", err)
	}
	if state(t, c.Jar(), "charge:o1") != idem.StatePending {
		t.Fatalf("state %s; want pending", state(t, c.Jar(), "charge:o1"))
	}
}

// TestAbandonLeaseNamesItsProcess: the lease Abandon takes names this
// process as the Transport's do, so that if the process dies before the
// abandon is written (here: the jar's Update fails), a restart on this host
// sees that its holder is gone (idem.HolderGone) and need not wait it out.
func TestAbandonLeaseNamesItsProcess(t *testing.T) {
	ctx := context.Background()
	_, c := pendingCharge(t, nil)
	errDown := errors.New("jar unavailable")
	other, err := client.New(ctx, "", &client.Options{Jar: failingUpdateJar{Jar: c.Jar(), err: errDown}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Abandon(ctx, "charge:o1", "the ledger shows no charge"); !errors.Is(err, errDown) {
		t.Fatalf("Abandon: %v; want the jar's error", err)
	}
	rec, err := c.Jar().Get(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s/%d/", holderHost(t), os.Getpid()); !strings.HasPrefix(rec.Holder, want) {
		t.Fatalf("Abandon left the lease of holder %q; want one of this process, %s…", rec.Holder, want)
	}
}

// TestHeaderNotSentAfterARedirectToAnotherHost: once a redirect left the
// request's host, Options.Header is not called for the rest of the chain,
// a further redirect within the other host included (net/http drops
// Authorization for the rest of a chain once it left the host).
func TestHeaderNotSentAfterARedirectToAnotherHost(t *testing.T) {
	var mu sync.Mutex
	auths := map[string]string{}
	seen := func(r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		auths[r.Host+r.URL.Path] = r.Header.Get("Authorization")
	}
	var home string // srv's host, set once it listens
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		switch r.URL.Path {
		case "/hop":
			http.Redirect(w, r, "/receipt", http.StatusFound) // within the other host
		case "/receipt":
			http.Redirect(w, r, "http://"+home+"/back", http.StatusFound) // back home
		}
	}))
	defer other.Close()
	_, port, _ := net.SplitHostPort(other.Listener.Addr().String())
	elsewhere := "localhost:" + port
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		if r.URL.Path == "/charges" {
			http.Redirect(w, r, "http://"+elsewhere+"/hop", http.StatusSeeOther)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	home = srv.Listener.Addr().String()
	postWithAuth(t, srv.URL+"/charges")
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{home + "/charges": authValue, elsewhere + "/hop": "", elsewhere + "/receipt": "", home + "/back": ""}
	for where, auth := range want {
		if got, ok := auths[where]; !ok || got != auth {
			t.Errorf("Authorization at %s: %q (reached: %v); want %q", where, got, ok, auth)
		}
	}
}

// TestHeaderNotSentInTheClearAfterARedirect: a redirect from https to
// http on the same host leaves the request's origin too: Options.Header
// is not called for it, nor for the rest of the chain, so that the
// credential does not cross the network in the clear; and the
// credentials a caller set on the request itself (Authorization, which
// net/http sends on such a redirect, and an X-Api-Key, which it sends
// to any host) are not sent there either.
func TestHeaderNotSentInTheClearAfterARedirect(t *testing.T) {
	for _, callers := range []bool{false, true} {
		t.Run(map[bool]string{false: "Options.Header", true: "the caller's"}[callers], func(t *testing.T) {
			var mu sync.Mutex
			creds := map[string]string{}
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Body != nil {
					r.Body.Close()
				}
				mu.Lock()
				creds[r.URL.String()] = r.Header.Get("Authorization") + "|" + r.Header.Get("X-Api-Key")
				mu.Unlock()
				resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}
				switch r.URL.Path {
				case "/charges":
					resp.StatusCode = http.StatusSeeOther
					resp.Header.Set("Location", "https://api.test/status") // same origin
				case "/status":
					resp.StatusCode = http.StatusFound
					resp.Header.Set("Location", "http://api.test/receipt")
				case "/receipt":
					resp.StatusCode = http.StatusFound
					resp.Header.Set("Location", "https://api.test/back")
				}
				return resp, nil
			})
			header := func(r *http.Request) error {
				r.Header.Set("Authorization", authValue)
				r.Header.Set("X-Api-Key", "k_live_1")
				return nil
			}
			o := &client.Options{Base: base, Header: header}
			req, _ := http.NewRequest(http.MethodPost, "https://api.test/charges", strings.NewReader(`{"order":"o1"}`))
			if callers {
				o.Header = func(*http.Request) error { return nil }
				header(req)
			}
			if _, err := newClient(t, nil, o).Do(context.Background(), "charge:o1", req); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			sent := authValue + "|k_live_1"
			want := map[string]string{"https://api.test/charges": sent, "https://api.test/status": sent, "http://api.test/receipt": "|", "https://api.test/back": "|"}
			for where, w := range want {
				if got, ok := creds[where]; !ok || got != w {
					t.Errorf("Authorization|X-Api-Key at %s: %q (reached: %v); want %q", where, got, ok, w)
				}
			}
		})
	}
}

// postWithAuth charges order o1 at url through a Client over the network
// whose Options.Header adds the test credential.
func postWithAuth(t *testing.T, url string) {
	t.Helper()
	c, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Header: withAuth, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.PostJSON(context.Background(), "charge:o1", url, chargeReq{Order: "o1"}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestRedirectChainThatLoops: a request given to Do whose Response leads
// back to itself (set by hand: http.Client makes no such chain) is sent,
// with what Options.Header adds, and Do returns: the walk of its chain to
// check its origin ends where the chain comes round again.
func TestRedirectChainThatLoops(t *testing.T) {
	var auth atomic.Value
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		auth.Store(r.Header.Get("Authorization"))
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	// Not closed on a failure: Close would wait for the Do that runs on.
	c, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Base: base, Header: withAuth})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, "https://api.test/orders/1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Response = &http.Response{StatusCode: http.StatusTemporaryRedirect, Request: req}
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), "", req)
		done <- err
	}()
	watchdog := time.NewTimer(10 * time.Second)
	defer watchdog.Stop()
	select {
	case err := <-done:
		if err != nil || auth.Load() != authValue {
			t.Errorf("Do: %v, sent with Authorization %q; want it sent with %q", err, auth.Load(), authValue)
		}
		c.Close()
	case <-watchdog.C:
		t.Fatal("Do has not returned after 10 s")
	}
}

// TestAbandonWhileTheClientSendsIt: an attempt may outlast its lease (a
// minute, with no AttemptTimeout), and the jar then takes the operation as
// free: an Abandon from the Client that is still sending it is refused
// with idem.ErrLeased, nothing changed, so that no later call begins it
// again under a new key while the first may still be applied. Once the
// call returned, the operation is done.
func TestAbandonWhileTheClientSendsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			close(entered)
			<-release
			return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		c := newClient(t, nil, &client.Options{Base: slow})
		done := make(chan error, 1)
		go func() {
			_, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
			done <- err
		}()
		<-entered
		time.Sleep(65 * time.Second) // past the lease (synctest's clock)
		if err := c.Abandon(context.Background(), "charge:o1", "looks stuck"); !errors.Is(err, idem.ErrLeased) {
			t.Fatalf("Abandon while the Client still sends it: %v; want ErrLeased", err)
		}
		if rec, _ := c.Jar().Get(context.Background(), "charge:o1"); rec.State != idem.StatePending {
			t.Fatalf("after the refused Abandon: %s; want pending", rec.State)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("the call: %v", err)
		}
		if rec, _ := c.Jar().Get(context.Background(), "charge:o1"); rec.State != idem.StateDone {
			t.Fatalf("after the call: %s; want done", rec.State)
		}
	})
}

// beforeDoneJar is a MemoryJar that calls before as the Transport writes
// an operation's outcome, done.
type beforeDoneJar struct {
	*idem.MemoryJar
	before func()
}

func (j *beforeDoneJar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	if c.State == idem.StateDone && j.before != nil {
		j.before()
	}
	return j.MemoryJar.Update(ctx, op, holder, c)
}

func (j *beforeDoneJar) Defer(op, holder string, c idem.Change) error {
	if c.State == idem.StateDone && j.before != nil {
		j.before()
	}
	return j.MemoryJar.Defer(op, holder, c)
}

// TestAbandonAsTheAnswerIsRecorded: the answer came, past the lease, and
// the Transport is writing its outcome: an Abandon from the Client then is
// still refused, so that the operation ends done under its key, not
// abandoned (which would give the next call under its name a new key).
func TestAbandonAsTheAnswerIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			time.Sleep(65 * time.Second) // past the lease (synctest's clock)
			return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		jar := &beforeDoneJar{MemoryJar: &idem.MemoryJar{}}
		c := newClient(t, nil, &client.Options{Base: slow, Jar: jar})
		var abandonErr error
		jar.before = func() {
			jar.before = nil
			abandonErr = c.Abandon(context.Background(), "charge:o1", "looks stuck")
		}
		if _, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); err != nil {
			t.Fatalf("the call: %v", err)
		}
		if !errors.Is(abandonErr, idem.ErrLeased) {
			t.Fatalf("Abandon as the outcome is written: %v; want ErrLeased", abandonErr)
		}
		if rec, _ := c.Jar().Get(context.Background(), "charge:o1"); rec.State != idem.StateDone {
			t.Fatalf("after the call: %s; want done", rec.State)
		}
	})
}

// TestAbandonAfterAPanicInTheCall: a call that ends by a panic of its Base
// (or a hook, or the Logger) after its first attempt began counts no
// longer as sending: an Abandon afterwards is not refused.
func TestAbandonAfterAPanicInTheCall(t *testing.T) {
	boom := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		panic("base broke")
	})
	c := newClient(t, nil, &client.Options{Base: boom})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the call did not panic")
			}
		}()
		c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
	}()
	if err := c.Abandon(context.Background(), "charge:o1", "base broke"); err != nil {
		t.Fatalf("Abandon after the call panicked: %v; want it abandoned", err)
	}
}
