package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/internal/stallproxy"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

func TestPostJSONChargesOnceAndSurfacesReplay(t *testing.T) {
	s := newShop()
	c := newClient(t, s, nil)
	ctx := context.Background()
	var out charge
	resp, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || resp.Replayed || out.ID != "ch_o1" || resp.Op != "charge:o1" || resp.Key != s.key(0) {
		t.Fatalf("got %d replayed=%v %+v op %q key %q; want 201, not replayed, ch_o1, op charge:o1, the key sent", resp.StatusCode, resp.Replayed, out, resp.Op, resp.Key)
	}
	out = charge{}
	again, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || again.Key != resp.Key || out.ID != "ch_o1" || s.charges("o1") != 1 {
		t.Fatalf("second call: replayed=%v key %q %+v, charged %d times; want a replay with key %q, charged once", again.Replayed, again.Key, out, s.charges("o1"), resp.Key)
	}
	if state(t, c.Jar(), "charge:o1") != idem.StateDone {
		t.Fatalf("state %q; want done", state(t, c.Jar(), "charge:o1"))
	}

	// An unnamed operation gets its own key, and a name of its own that
	// the jar knows it by.
	other, err := c.PostJSON(ctx, "", chargesURL, chargeReq{Order: "o2", Amount: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.Key == "" || other.Key == resp.Key || other.Op == "" || other.Op == other.Key {
		t.Fatalf("unnamed: op %q key %q; want a new key and a name of its own", other.Op, other.Key)
	}
	if rec, err := c.Jar().Get(ctx, other.Op); err != nil || rec.Key != other.Key || rec.State != idem.StateDone {
		t.Fatalf("unnamed: the jar's record of %q: %+v, %v; want it done, with key %q", other.Op, rec, err, other.Key)
	}
}

// TestOptionsReachTheTransport: Lease, Hooks and Logger are the
// Transport's, and JarOptions are passed to keyjar.Open.
func TestOptionsReachTheTransport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *client.Client
		var lease time.Duration
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec, err := c.Jar().Get(r.Context(), "charge:o1")
			if err != nil {
				t.Error(err)
			}
			lease = time.Until(rec.LeaseUntil) // time stands still in the bubble
			w.WriteHeader(http.StatusCreated)
		})
		var attempts int
		var logs bytes.Buffer
		c = newClient(t, h, &client.Options{Lease: 5 * time.Second,
			Hooks:  idem.Hooks{OnAttempt: func(idem.Event) { attempts++ }},
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if _, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil); err != nil {
			t.Fatal(err)
		}
		if lease != 5*time.Second || attempts != 1 || !strings.Contains(logs.String(), `msg="idem: attempt" op=charge:o1`) {
			t.Fatalf("lease %v, %d attempts hooked, log %q; want Options' 5s lease, its hook called once and its Logger given the attempt",
				lease, attempts, logs.String())
		}
	})
	path := filepath.Join(t.TempDir(), "keys.db")
	if _, err := client.New(context.Background(), path, &client.Options{JarOptions: &keyjar.Options{MustExist: true}}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("New with JarOptions.MustExist on a missing file: %v; want fs.ErrNotExist", err)
	}
}

func TestDoReturnsOpenBodyForTheCaller(t *testing.T) {
	s := newShop()
	c := newClient(t, s, nil)
	req, err := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o3","amount":7}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(context.Background(), "charge:o3", req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Contains(b, []byte(`"ch_o3"`)) {
		t.Fatalf("body %q, %v; want the charge", b, err)
	}
	if req.Header.Get(idem.KeyHeader) != "" || req.Header.Get("Authorization") != "" {
		t.Fatalf("the caller's request was modified: %v", req.Header)
	}
}

func TestStatusesBecomeTypedErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("422 is a mismatch, failed, not retried", func(t *testing.T) {
		s := newShop()
		c := newClient(t, s, nil)
		if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); err != nil {
			t.Fatal(err)
		}
		// Another program reused the key with another amount: the server
		// refuses it. Send the same key by hand, as another operation.
		req, _ := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o1","amount":999}`))
		req.Header.Set(idem.KeyHeader, s.key(0))
		_, err := c.Do(ctx, "charge:o1-bis", req)
		var se *client.StatusError
		var me *idem.MismatchError
		if !errors.As(err, &se) || se.StatusCode != 422 || !errors.As(err, &me) || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("got %v; want *StatusError 422 wrapping *idem.MismatchError", err)
		}
		if me.Op != "charge:o1-bis" || me.Key != s.key(0) || !bytes.Contains(se.Body, []byte("mismatch")) {
			t.Fatalf("mismatch %+v, body %q; want the op, its key and the server's problem", me, se.Body)
		}
		if s.sends() != 2 || state(t, c.Jar(), "charge:o1-bis") != idem.StateFailed || s.charges("o1") != 1 {
			t.Fatalf("%d sends, state %q; want 2 sends (no retry), failed, charged once", s.sends(), state(t, c.Jar(), "charge:o1-bis"))
		}
		if _, err := c.Resume(ctx, "charge:o1-bis"); !errors.Is(err, client.ErrState) || s.sends() != 2 {
			t.Fatalf("resume of the failed operation: %v after %d sends; want ErrState, nothing sent", err, s.sends())
		}
	})
	t.Run("an API's own 422 is not called a request that differs", func(t *testing.T) {
		// The API refuses the request itself (its validation: the order
		// is charged already), on the operation's first send: the
		// message must not say the key was first sent with another
		// request, and must say what the server did.
		s := newShop()
		s.failNext(422)
		c := newClient(t, s, nil)
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) || se.StatusCode != 422 || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("got %v; want *StatusError 422 matching idem.ErrMismatch", err)
		}
		msg := err.Error()
		for _, want := range []string{"422", "refused the request with 422", "a request it will not process", "do not retry it under this key", "scripted 422"} {
			if !strings.Contains(msg, want) {
				t.Errorf("message %q; want it to say %q", msg, want)
			}
		}
		if strings.Contains(msg, "first sent with a different") {
			t.Errorf("message %q says the key was first sent with another request; it was sent once", msg)
		}
		if s.sends() != 1 || state(t, c.Jar(), "charge:o1") != idem.StateFailed {
			t.Fatalf("%d sends, state %q; want 1 send, failed", s.sends(), state(t, c.Jar(), "charge:o1"))
		}
	})
	t.Run("409 left after the attempts is a conflict, pending", func(t *testing.T) {
		s := newShop()
		s.failNext(409, 409, 409)
		c := newClient(t, s, &client.Options{Policy: retry.Policy{MaxAttempts: 3, InitialInterval: time.Microsecond}})
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil)
		var ce *client.ConflictError
		var se *client.StatusError
		if !errors.As(err, &ce) || !errors.Is(err, idem.ErrPending) || !errors.As(err, &se) || se.StatusCode != 409 {
			t.Fatalf("got %v; want *StatusError 409 wrapping *ConflictError, matching idem.ErrPending", err)
		}
		if ce.Attempts != 3 || ce.Key != s.key(0) || s.sends() != 3 || state(t, c.Jar(), "charge:o1") != idem.StatePending {
			t.Fatalf("conflict %+v after %d sends, state %q; want 3 attempts with the key, pending", ce, s.sends(), state(t, c.Jar(), "charge:o1"))
		}
		if why := "MaxAttempts (3) reached after status 409"; ce.Reason != why || !strings.Contains(err.Error(), "("+why+")") {
			t.Errorf("got %v (Reason %q); want its Reason and message to say %q", err, ce.Reason, why)
		}
	})
	// A done operation sent again for its saved answer keeps its outcome:
	// the error of a call left without an answer, *idem.PendingError for
	// a 503 and *ConflictError for a 409, says it is done.
	for _, status := range []int{503, 409} {
		t.Run(fmt.Sprint(status)+" left after the attempts on a done operation says it is done", func(t *testing.T) {
			s := newShop()
			c := newClient(t, s, &client.Options{Policy: retry.Policy{MaxAttempts: 2, InitialInterval: time.Microsecond}})
			if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil); err != nil {
				t.Fatal(err)
			}
			s.failNext(status, status)
			_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil)
			var pe *idem.PendingError
			var ce *client.ConflictError
			var got idem.State
			var msg string
			switch {
			case status == 503 && errors.As(err, &pe):
				got, msg = pe.State, pe.Error()
			case status == 409 && errors.As(err, &ce):
				got, msg = ce.State, ce.Error()
			}
			if got != idem.StateDone || !errors.Is(err, idem.ErrPending) || s.sends() != 3 || state(t, c.Jar(), "charge:o1") != idem.StateDone {
				t.Fatalf("got %v after %d sends, state %q; want a *PendingError (503) or *ConflictError (409) of State done, matching idem.ErrPending, after 2 more sends, the operation done", err, s.sends(), state(t, c.Jar(), "charge:o1"))
			}
			if strings.Contains(msg, "outcome unknown") || strings.Contains(msg, "pending") || strings.Contains(msg, "resume") || !strings.Contains(msg, `"charge:o1" (key "`+s.key(0)+`") is done`) {
				t.Errorf("message %q; want it to say the operation is done, not pending or to resume it", msg)
			}
		})
	}
	t.Run("a handler's own 409, replayed, is final", func(t *testing.T) {
		var runs int
		mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			http.Error(w, "order already exists", http.StatusConflict)
		}))
		c := newClient(t, h, &client.Options{Policy: retry.Policy{MaxAttempts: 5, InitialInterval: time.Microsecond}})
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1"}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) || se.StatusCode != 409 || !se.Replayed || se.Err != nil || errors.Is(err, idem.ErrPending) {
			t.Fatalf("got %v; want *StatusError 409, replayed, not pending", err)
		}
		if runs != 1 || state(t, c.Jar(), "charge:o1") != idem.StateDone {
			t.Fatalf("%d runs, state %q; want the handler run once and the operation done after the replay", runs, state(t, c.Jar(), "charge:o1"))
		}
	})
	t.Run("a 2xx body over MaxJSONBody is an error, not decoded", func(t *testing.T) {
		for _, tt := range []struct {
			max, size int64 // MaxJSONBody, and the answer's length
			decoded   bool
		}{
			{50, 100, false}, {200, 100, true},
			{0, 16 << 20, true}, {0, 16<<20 + 1, false}, // zero means 16 MiB
			{-1, 100, true}, {-1, 16<<20 + 1, false}, // and so does a negative one
		} {
			answer := []byte(`{"id":"` + strings.Repeat("x", int(tt.size)-len(`{"id":""}`)) + `"}`)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				w.Write(answer)
			})
			var out struct{ ID string }
			c := newClient(t, h, &client.Options{MaxJSONBody: tt.max})
			resp, err := c.PostJSON(ctx, "charge:big", chargesURL, chargeReq{Order: "big"}, &out)
			switch {
			case tt.decoded && (err != nil || len(out.ID) != len(answer)-len(`{"id":""}`)):
				t.Fatalf("MaxJSONBody %d, an answer of %d bytes: %v, %d bytes decoded; want it decoded", tt.max, tt.size, err, len(out.ID))
			case !tt.decoded && (!errors.Is(err, client.ErrTooLarge) || !strings.Contains(err.Error(), "MaxJSONBody") || resp == nil || resp.StatusCode != 201 || out.ID != ""):
				t.Fatalf("MaxJSONBody %d, an answer of %d bytes: %v, %v, %d bytes decoded; want the 201 with an ErrTooLarge error and nothing decoded",
					tt.max, tt.size, resp, err, len(out.ID))
			}
		}
	})
	t.Run("404 is a status error with its body", func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no such order "+strings.Repeat("x", 100), http.StatusNotFound)
		})
		c := newClient(t, h, &client.Options{MaxErrorBody: 20})
		_, err := c.PostJSON(ctx, "charge:o9", chargesURL, chargeReq{Order: "o9"}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) || se.StatusCode != 404 || se.Err != nil || errors.Is(err, idem.ErrPending) {
			t.Fatalf("got %v; want a plain *StatusError 404", err)
		}
		if string(se.Body) != "no such order xxxxxx" || se.Method != "POST" || se.URL != chargesURL || se.Op != "charge:o9" {
			t.Fatalf("status error %+v; want the first 20 bytes of the body, method, URL and op", se)
		}
		if !strings.Contains(err.Error(), "404 Not Found: no such order") {
			t.Fatalf("message %q; want the status and the start of the body", err)
		}
		if state(t, c.Jar(), "charge:o9") != idem.StateDone {
			t.Fatalf("a 404 is a final answer; state %q, want done", state(t, c.Jar(), "charge:o9"))
		}
	})
	t.Run("a zero or negative MaxErrorBody keeps 64 KiB", func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, strings.Repeat("x", 64<<10+1), http.StatusNotFound)
		})
		for _, max := range []int64{0, -1} {
			c := newClient(t, h, &client.Options{MaxErrorBody: max})
			_, err := c.PostJSON(ctx, "charge:o10", chargesURL, chargeReq{Order: "o10"}, nil)
			var se *client.StatusError
			if !errors.As(err, &se) {
				t.Fatalf("MaxErrorBody %d: %v; want a *StatusError", max, err)
			}
			if len(se.Body) != 64<<10 {
				t.Fatalf("MaxErrorBody %d: a body of %d bytes; want 64 KiB of it", max, len(se.Body))
			}
		}
	})
}

// TestPendingErrorOfAnUnnamedCall: a call with an empty name that ends
// pending (a 503 left after its attempts, a 401 after a send whose
// outcome is unknown) says, as the Transport's own *idem.PendingError
// does, that the same call made again without a name is a new operation
// under a new key, where "resume it later under the same name" read as
// "send it again"; a named call's, or one named by the caller's key, does
// not.
func TestPendingErrorOfAnUnnamedCall(t *testing.T) {
	const warning = "made again without a name is a new operation under a new key"
	for _, tc := range []struct {
		name, op, key, ctxOp string
		codes                []int
		unnamed              bool
		why                  string // the error's Reason, in its message too
	}{
		{"unnamed, 503", "", "", "", []int{503, 503}, true, "MaxAttempts (2) reached after status 503"},
		{"unnamed, 401 after a 503", "", "", "", []int{503, 401}, true, "credentials refused: status 401"},
		{"named, 503", "charge:o1", "", "", []int{503, 503}, false, "MaxAttempts (2) reached after status 503"},
		{"the caller's key, 503", "", "k1", "", []int{503, 503}, false, "MaxAttempts (2) reached after status 503"},
		{"named by the context, 503", "", "", "charge:o1", []int{503, 503}, false, "MaxAttempts (2) reached after status 503"},
		{"unnamed, 409", "", "", "", []int{409, 409}, true, "MaxAttempts (2) reached after status 409"},
		{"named, 409", "charge:o1", "", "", []int{409, 409}, false, "MaxAttempts (2) reached after status 409"},
		{"named by the context, 409", "", "", "charge:o1", []int{409, 409}, false, "MaxAttempts (2) reached after status 409"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop()
			s.failNext(tc.codes...)
			c := newClient(t, s, &client.Options{Policy: retry.Policy{MaxAttempts: 2, InitialInterval: time.Microsecond}})
			req, err := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o1","amount":7}`))
			if err != nil {
				t.Fatal(err)
			}
			if tc.key != "" {
				req.Header.Set(idem.KeyHeader, tc.key)
			}
			ctx := context.Background()
			if tc.ctxOp != "" {
				ctx = idem.WithOperation(ctx, tc.ctxOp)
			}
			_, err = c.Do(ctx, tc.op, req)
			if !errors.Is(err, idem.ErrPending) || s.sends() != 2 {
				t.Fatalf("got %v after %d sends; want a *idem.PendingError (a *client.ConflictError for a 409) after 2", err, s.sends())
			}
			if got := strings.Contains(err.Error(), warning); got != tc.unnamed {
				t.Errorf("%q: says a call made again is a new operation: %v, want %v", err, got, tc.unnamed)
			}
			if !strings.Contains(err.Error(), "("+tc.why+")") {
				t.Errorf("%q: want it to say why the call stopped, (%s)", err, tc.why)
			}
		})
	}
}

func TestLongRetryAfterIsAnErrorThatSaysWhen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newShop()
		busy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if s.sends() == 0 {
				s.mu.Lock()
				s.keys = append(s.keys, r.Header.Get(idem.KeyHeader))
				s.mu.Unlock()
				w.Header().Set("Retry-After", "3600")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			s.ServeHTTP(w, r)
		})
		c := newClient(t, busy, nil)
		start := time.Now()
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || !pe.NextAttempt.Equal(start.Add(time.Hour)) || pe.LastStatus != 503 {
			t.Fatalf("got %v; want *idem.PendingError with NextAttempt %v", err, start.Add(time.Hour))
		}
		if !strings.Contains(err.Error(), "resume it under the same name after "+start.Add(time.Hour).UTC().Format(time.RFC3339)) || time.Since(start) != 0 {
			t.Fatalf("message %q after %v; want it to say when, at once", err, time.Since(start))
		}

		pending, err := c.Pending(ctx)
		if err != nil || len(pending) != 1 || !pending[0].NextAttempt.Equal(start.Add(time.Hour)) || pending[0].Attempts != 1 || !pending[0].Created.Equal(start) {
			t.Fatalf("pending %+v, %v; want charge:o1 with its next attempt, 1 attempt, first sent at start", pending, err)
		}

		time.Sleep(30 * time.Minute)
		_, err = c.Resume(ctx, "charge:o1")
		if !errors.As(err, &pe) || !pe.NextAttempt.Equal(start.Add(time.Hour)) || s.sends() != 1 || time.Since(start) != 30*time.Minute {
			t.Fatalf("resume before the time: %v after %d sends; want *PendingError saying when, nothing sent, no wait", err, s.sends())
		}

		time.Sleep(30 * time.Minute)
		resp, err := c.Resume(ctx, "charge:o1")
		if err != nil || resp.StatusCode != 201 || s.key(1) != s.key(0) {
			t.Fatalf("resume at the time: %v; want 201 sent with the first key", err)
		}
		resp.Body.Close()
	})
}

func TestResume(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	resp, err := c.Resume(ctx, "charge:o1")
	if err != nil || resp.StatusCode != 201 || resp.Replayed || s.key(1) != s.key(0) || s.sends() != 2 {
		t.Fatalf("resume: %v after %d sends; want 201 with the same key", err, s.sends())
	}
	resp.Body.Close()
	if s.auths[1] != authValue {
		t.Fatalf("the resumed attempt carried Authorization %q; want Options.Header's credential", s.auths[1])
	}
	if _, err := c.Resume(ctx, "charge:o1"); !errors.Is(err, client.ErrState) {
		t.Fatalf("resume of a done operation: %v; want ErrState", err)
	}
	if _, err := c.Resume(ctx, "charge:nope"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("resume of an unknown operation: %v; want idem.ErrNotFound", err)
	}
	if s.sends() != 2 || s.charges("o1") != 1 {
		t.Fatalf("%d sends, %d charges; want 2 and 1", s.sends(), s.charges("o1"))
	}
}

func TestResumeJSON(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	var out charge
	resp, err := c.ResumeJSON(ctx, "charge:o1", &out)
	if err != nil || resp.StatusCode != 201 || s.key(1) != s.key(0) {
		t.Fatalf("resume: %v after %d sends; want 201 with the same key", err, s.sends())
	}
	if out != (charge{ID: "ch_o1", Order: "o1", Amount: 100}) {
		t.Fatalf("decoded %+v; want the server's charge of o1", out)
	}
	if n, err := resp.Body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("the Response's body after ResumeJSON: read %d, %v; want it read and closed", n, err)
	}
	if _, err := c.ResumeJSON(ctx, "charge:o1", &out); !errors.Is(err, client.ErrState) {
		t.Fatalf("ResumeJSON of a done operation: %v; want Resume's ErrState", err)
	}
	if s.sends() != 2 || s.charges("o1") != 1 {
		t.Fatalf("%d sends, %d charges; want 2 and 1", s.sends(), s.charges("o1"))
	}
}

// TestResumeOfAReconcileOperationWithoutItsBody: an operation past its
// horizon is not sent again, whatever its body: Resume says so
// (*idem.ReconcileError), not that it needs the body.
func TestResumeOfAReconcileOperationWithoutItsBody(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, &client.Options{MaxStoredBody: 8})
	if _, err := c.Jar().Update(ctx, "charge:o1", "", idem.Change{Now: time.Now(), State: idem.StateReconcile}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Resume(ctx, "charge:o1")
	var re *idem.ReconcileError
	if !errors.As(err, &re) || re.State != idem.StateReconcile || errors.Is(err, idem.ErrBodyNotStored) || s.sends() != 1 {
		t.Fatalf("resume of a reconcile operation without its body: %v after %d sends; want *idem.ReconcileError, nothing sent", err, s.sends())
	}
}

// TestResumeOfAPendingOperationPastItsHorizonWithoutItsBody: a pending
// operation whose first send is older than the horizon is not sent again,
// whatever its body: Resume marks it for reconciliation and says so
// (*idem.ReconcileError), as it does when the jar holds the body, not that
// it needs the body. Under the horizon it still needs the body.
func TestResumeOfAPendingOperationPastItsHorizonWithoutItsBody(t *testing.T) {
	ctx := context.Background()
	for _, tt := range horizonCases {
		s, c := pendingCharge(t, &client.Options{MaxStoredBody: 8})
		backdate(t, c.Jar(), "charge:o1", time.Now().Add(-tt.age))
		_, err := c.Resume(ctx, "charge:o1")
		got := state(t, c.Jar(), "charge:o1")
		if tt.sent {
			if !errors.Is(err, client.ErrBodyNotStored) || errors.Is(err, idem.ErrReconcile) || got != idem.StatePending || s.sends() != 1 {
				t.Fatalf("%v old: %v, state %s, after %d sends; want ErrBodyNotStored, still pending, nothing sent", tt.age, err, got, s.sends())
			}
			continue
		}
		var re *idem.ReconcileError
		if !errors.As(err, &re) || re.State != idem.StateReconcile || errors.Is(err, idem.ErrBodyNotStored) || got != idem.StateReconcile || s.sends() != 1 {
			t.Fatalf("%v old: %v, state %s, after %d sends; want *idem.ReconcileError, the operation marked reconcile, nothing sent", tt.age, err, got, s.sends())
		}
	}
}

func TestResumeWithBodyChecksTheFingerprint(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, &client.Options{MaxStoredBody: 8})
	body := `{"order":"o1","amount":100}`
	if _, err := c.Resume(ctx, "charge:o1"); !errors.Is(err, client.ErrBodyNotStored) || !errors.Is(err, idem.ErrBodyNotStored) {
		t.Fatalf("resume without the body: %v; want ErrBodyNotStored (client's and idem's)", err)
	}
	if _, err := c.ResumeWithBody(ctx, "charge:o1", nil); !errors.Is(err, idem.ErrRequestBody) || s.sends() != 1 ||
		state(t, c.Jar(), "charge:o1") != idem.StatePending {
		t.Fatalf("resume with a nil getBody: %v after %d sends; want an error matching idem.ErrRequestBody, nothing sent, still pending", err, s.sends())
	}
	bodyOf := func(s string) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(s)), nil }
	}
	for _, other := range []string{`{"order":"o1","amount":999}`, `{"order":"o1","amount":1000}`} {
		_, err := c.ResumeWithBody(ctx, "charge:o1", bodyOf(other))
		var me *idem.MismatchError
		if !errors.As(err, &me) || s.sends() != 1 {
			t.Fatalf("resume with the body %s: %v after %d sends; want *idem.MismatchError, nothing sent", other, err, s.sends())
		}
	}
	resp, err := c.ResumeWithBody(ctx, "charge:o1", bodyOf(body))
	if err != nil || resp.StatusCode != 201 || s.key(1) != s.key(0) {
		t.Fatalf("resume with the body: %v; want 201 with the same key", err)
	}
	resp.Body.Close()
}

// arrival is what a server got of one request: its key and the bytes of
// its body.
type arrival struct{ key, body string }

// bodyServer is a server on 127.0.0.1 that records the key and body of
// every request, and answers each with the next status of its script (201
// once the script is spent).
func bodyServer(t *testing.T, script ...int) (*httptest.Server, func() []arrival) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []arrival
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, arrival{r.Header.Get(idem.KeyHeader), string(b)})
		code := http.StatusCreated
		if len(script) > 0 {
			code, script = script[0], script[1:]
		}
		mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []arrival {
		mu.Lock()
		defer mu.Unlock()
		return append([]arrival(nil), got...)
	}
}

// TestResumeWithBodyOfAStreamedBody: an idem.Transport with a MaxBuffer
// smaller than a JSON body fingerprints its bytes as they are, streamed,
// and stores no body. ResumeWithBody, whose Transport buffers it whole,
// sends those same bytes under the operation's key, and still refuses
// another body before it is sent.
func TestResumeWithBodyOfAStreamedBody(t *testing.T) {
	ctx := context.Background()
	srv, got := bodyServer(t, http.StatusServiceUnavailable)
	jar := &idem.MemoryJar{}
	body := `{"order":"o1","amount":100,"note":"` + strings.Repeat("x", 100) + `"}` // not in canonical key order
	tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, MaxBuffer: 64, Policy: retry.Policy{MaxAttempts: 1}}
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "charge:o1"), http.MethodPost, srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %v, %v; want the 503, the operation pending", resp, err)
	}
	resp.Body.Close()

	c, err := client.New(ctx, "", &client.Options{Jar: jar, Base: srv.Client().Transport, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Resume(ctx, "charge:o1"); !errors.Is(err, client.ErrBodyNotStored) {
		t.Fatalf("Resume: %v; want ErrBodyNotStored", err)
	}
	bodyOf := func(s string) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(s)), nil }
	}
	other := strings.Replace(body, "100", "999", 1)
	if _, err := c.ResumeWithBody(ctx, "charge:o1", bodyOf(other)); !errors.Is(err, idem.ErrMismatch) || len(got()) != 1 {
		t.Fatalf("ResumeWithBody with another body: %v after %d sends; want *idem.MismatchError, nothing sent", err, len(got()))
	}
	r, err := c.ResumeWithBody(ctx, "charge:o1", bodyOf(body))
	if err != nil {
		t.Fatalf("ResumeWithBody with the body first sent: %v; want it sent under its key", err)
	}
	r.Body.Close()
	g := got()
	if len(g) != 2 || g[1] != g[0] || g[0].body != body || r.Key != g[0].key {
		t.Fatalf("the server got %+v; want the same body twice under one key", g)
	}
}

// TestResumeWithBodyGivingBackAReadBody: a getBody that gives back one
// reader, which the fingerprint read, sends nothing over HTTP/2 either
// (net/http would send it empty under the key, and the server's 400 would
// settle the operation): idem.ErrRequestBody, the operation still pending.
func TestResumeWithBodyGivingBackAReadBody(t *testing.T) {
	ctx := context.Background()
	s := newShop()
	s.failNext(http.StatusServiceUnavailable)
	srv := httptest.NewUnstartedServer(s)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := newClient(t, s, &client.Options{Base: srv.Client().Transport, MaxStoredBody: -1, Policy: retry.Policy{MaxAttempts: 1}})
	body := `{"order":"o1","amount":100}`
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "charge:o1", req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want the 503 as a pending error", err)
	}
	r := io.NopCloser(strings.NewReader(body))
	_, err = c.ResumeWithBody(ctx, "charge:o1", func() (io.ReadCloser, error) { return r, nil })
	if !errors.Is(err, idem.ErrRequestBody) || s.sends() != 1 || state(t, c.Jar(), "charge:o1") != idem.StatePending {
		t.Fatalf("resume: %v after %d sends, the operation %s; want idem.ErrRequestBody, nothing sent, still pending",
			err, s.sends(), state(t, c.Jar(), "charge:o1"))
	}
}

func TestAbandonThenNewKey(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	if err := c.Abandon(ctx, "charge:o1", "  "); !errors.Is(err, client.ErrNoReason) {
		t.Fatalf("abandon without a reason: %v; want ErrNoReason", err)
	}
	// Another process is sending it right now: not abandoned.
	if _, err := c.Jar().Acquire(ctx, "charge:o1", "other", time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	err := c.Abandon(ctx, "charge:o1", "checked")
	if !errors.Is(err, idem.ErrLeased) || state(t, c.Jar(), "charge:o1") != idem.StatePending {
		t.Fatalf("abandon while leased: %v; want idem.ErrLeased, still pending", err)
	}
	if !strings.Contains(err.Error(), `held by "other" until `) {
		t.Errorf("abandon while leased: %q; want it to name the holder and when its lease ends", err)
	}
	// And what to do about it, past the jar's error.
	if want := "wait for that process to finish sending it, or stop it, then abandon it again"; !strings.HasSuffix(err.Error(), want) {
		t.Errorf("abandon while leased: %q; want it to end saying %q", err, want)
	}
	if _, err := c.Jar().Update(ctx, "charge:o1", "other", idem.Change{Now: time.Now(), Release: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Abandon(ctx, "charge:o1", "ledger shows no charge for o1"); err != nil {
		t.Fatal(err)
	}
	r, _ := c.Jar().Get(ctx, "charge:o1")
	if r.State != idem.StateAbandoned || r.Note != "ledger shows no charge for o1" || r.Holder != "" {
		t.Fatalf("record %+v; want abandoned with the reason, no lease", r)
	}
	if err := c.Abandon(ctx, "charge:o1", "checked again"); err != nil {
		t.Fatalf("abandon of an abandoned operation: %v; want nil", err)
	}
	if again, _ := c.Jar().Get(ctx, "charge:o1"); again.Note != r.Note || !again.Updated.Equal(r.Updated) {
		t.Fatalf("abandon of an abandoned operation changed it: %+v; want %+v", again, r)
	}
	resp, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
	if err != nil || resp.Key == s.key(0) || s.charges("o1") != 1 {
		t.Fatalf("after abandon: %v, key %q; want a new key (not %q), charged once", err, resp.Key, s.key(0))
	}
	if err := c.Abandon(ctx, "charge:o1", "oops"); !errors.Is(err, client.ErrState) {
		t.Fatalf("abandon of a done operation: %v; want ErrState", err)
	}
	if err := c.Abandon(ctx, "charge:none", "x"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("abandon of an unknown operation: %v; want idem.ErrNotFound", err)
	}
}

func TestForgetRefusesPending(t *testing.T) {
	ctx := context.Background()
	_, c := pendingCharge(t, nil)
	if err := c.Forget(ctx, "charge:o1"); !errors.Is(err, client.ErrState) || state(t, c.Jar(), "charge:o1") != idem.StatePending {
		t.Fatalf("forget of a pending operation: %v; want ErrState and the record kept", err)
	}
	if _, err := c.Resume(ctx, "charge:o1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Forget(ctx, "charge:o1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Jar().Get(ctx, "charge:o1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("after forget: %v; want idem.ErrNotFound", err)
	}
	if err := c.Forget(ctx, "charge:o1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("forget twice: %v; want idem.ErrNotFound", err)
	}
}

// TestHeaderErrorSendsNothing: an error of Options.Header stops the call
// before its attempt is sent: the error wraps idem.ErrNotSent, the attempt
// is neither retried nor counted, and the operation stays pending. Without
// a name, the operation, never sent, is abandoned. So does, over an
// http.Transport, a header Header sets that net/http refuses to send (a
// token read from a file with its line break), with idem.ErrInvalidHeader,
// the value not quoted: net/http's own refusal left the operation pending
// after a counted attempt, named or not.
func TestHeaderErrorSendsNothing(t *testing.T) {
	const secret = "sk_test_read_from_a_file"
	errExpired := errors.New("token expired")
	for _, c := range []struct {
		name   string
		header func(*http.Request) error
		http   bool // over an http.Transport to a server on the loopback
		want   error
	}{
		{name: "error", header: func(*http.Request) error { return errExpired }, want: errExpired},
		{
			name:   "value with a line break",
			header: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+secret+"\n"); return nil },
			http:   true,
			want:   idem.ErrInvalidHeader,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newShop()
			calls := 0
			o := &client.Options{Header: func(r *http.Request) error { calls++; return c.header(r) }}
			url := chargesURL
			if c.http {
				srv := httptest.NewServer(s)
				defer srv.Close()
				o.Base, url = srv.Client().Transport, srv.URL+"/charges"
			}
			cl := newClient(t, s, o)
			_, err := cl.PostJSON(context.Background(), "charge:o1", url, chargeReq{Order: "o1"}, nil)
			if !errors.Is(err, idem.ErrPending) || !errors.Is(err, idem.ErrNotSent) || !errors.Is(err, c.want) ||
				strings.Contains(err.Error(), secret) || s.sends() != 0 || calls != 1 {
				t.Fatalf("got %v after %d sends, Options.Header called %d times; want a pending error wrapping ErrNotSent and %v, without the secret, nothing sent, no retry",
					err, s.sends(), calls, c.want)
			}
			if r, err := cl.Jar().Get(context.Background(), "charge:o1"); err != nil || r.Attempts != 0 || r.State != idem.StatePending {
				t.Fatalf("record %+v, %v; want pending with no attempt counted", r, err)
			}
			_, err = cl.PostJSON(context.Background(), "", url, chargeReq{Order: "o2"}, nil)
			if !errors.Is(err, idem.ErrNotSent) || !errors.Is(err, c.want) || errors.Is(err, idem.ErrPending) {
				t.Fatalf("without a name: %v; want ErrNotSent and %v, not pending", err, c.want)
			}
			pending, err := cl.Pending(context.Background())
			if err != nil || len(pending) != 1 || pending[0].Op != "charge:o1" {
				t.Fatalf("pending: %v, %v; want charge:o1 alone, the unnamed one abandoned", pending, err)
			}
		})
	}
}

// TestProxyFuncErrorNotSent: the error of the Proxy function of an
// http.Transport Base, which net/http returns before it dials, is an
// attempt not sent through the Client's wrapper of its Base, as through a
// Transport over the http.Transport itself: not counted nor retried, the
// operation without a name abandoned, a named one pending for a later
// call. The wrapper hid the http.Transport: the attempt was counted, and
// the operation left pending, named or not.
func TestProxyFuncErrorNotSent(t *testing.T) {
	errProxy := errors.New("no proxy for shop.test")
	for _, c := range []struct {
		op    string
		state idem.State
	}{{"", idem.StateAbandoned}, {"charge:o1", idem.StatePending}} {
		t.Run("op="+c.op, func(t *testing.T) {
			base, dials := refusetest.Proxy(errProxy)
			jar := &idem.MemoryJar{}
			cl := newClient(t, nil, &client.Options{Jar: jar, Base: base})
			_, err := cl.PostJSON(context.Background(), c.op, chargesURL, chargeReq{Order: "o1"}, nil)
			if !errors.Is(err, errProxy) || !errors.Is(err, idem.ErrNotSent) || errors.Is(err, idem.ErrPending) != (c.state == idem.StatePending) {
				t.Errorf("PostJSON: %v; want the Proxy's error, not sent, pending only when named", err)
			}
			all, err := jar.List(context.Background(), idem.Filter{})
			if err != nil || len(all) != 1 {
				t.Fatalf("List: %d records, %v; want 1", len(all), err)
			}
			if r := all[0]; r.State != c.state || r.Attempts != 0 || dials() != 0 {
				t.Errorf("record: %s, %d attempts, after %d dials; want %s, no attempt counted, no dial", r.State, r.Attempts, dials(), c.state)
			}
		})
	}
}

// TestHeaderCannotChangeTheKey: Options.Header adds credentials to each
// attempt; an Idempotency-Key it sets (a new one per attempt, as code
// written before the Client did) or removes is not what is sent: every
// attempt carries the operation's key from the jar, the one Response.Key
// reports.
func TestHeaderCannotChangeTheKey(t *testing.T) {
	var n atomic.Int64
	newKey := func() string { return "per-attempt-" + strconv.FormatInt(n.Add(1), 10) }
	for name, header := range map[string]func(*http.Request) error{
		"set": func(r *http.Request) error {
			r.Header.Set(idem.KeyHeader, newKey())
			return withAuth(r)
		},
		"set in lower case": func(r *http.Request) error {
			r.Header["idempotency-key"] = []string{newKey()}
			return withAuth(r)
		},
		"removed": func(r *http.Request) error {
			r.Header.Del(idem.KeyHeader)
			return withAuth(r)
		},
		"header replaced by nil": func(r *http.Request) error {
			r.Header = nil
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newShop()
			s.failNext(http.StatusServiceUnavailable)
			srv := httptest.NewServer(s) // on the wire: a header in lower case is sent too
			defer srv.Close()
			jar := &idem.MemoryJar{}
			c := newClient(t, s, &client.Options{Jar: jar, Header: header, Base: srv.Client().Transport})
			resp, err := c.PostJSON(context.Background(), "charge:o1", srv.URL+"/charges", chargeReq{Order: "o1", Amount: 100}, nil)
			if err != nil {
				t.Fatal(err)
			}
			rec, err := jar.Get(context.Background(), "charge:o1")
			if err != nil {
				t.Fatal(err)
			}
			if s.sends() != 2 || s.key(0) != rec.Key || s.key(1) != rec.Key || resp.Key != rec.Key {
				t.Fatalf("sent keys %q, Response.Key %q; want the jar's key %q on both attempts", s.keys, resp.Key, rec.Key)
			}
		})
	}
}

func TestKeyedRedirectIsNotFollowed(t *testing.T) {
	var other int
	mux := http.NewServeMux()
	mux.HandleFunc("/charges", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) { other++ })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.PostJSON(context.Background(), "op", srv.URL+"/charges", chargeReq{}, nil)
	var se *client.StatusError
	if !errors.As(err, &se) || se.StatusCode != 307 || other != 0 {
		t.Fatalf("got %v, redirect target hit %d times; want the 307 as a *StatusError, not followed", err, other)
	}
}

// TestRedirectLimit: as http.Client does by default, the Client sends at
// most 10 requests for one call, so it follows 9 redirects in a row: the
// 10th comes back as an error saying it stopped, and the request it points
// to is never sent.
func TestRedirectLimit(t *testing.T) {
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		// /{redirects left}
		left, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if left > 0 {
			http.Redirect(w, r, "/"+strconv.Itoa(left-1), http.StatusFound)
		}
	}))
	defer srv.Close()
	c, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tt := range []struct {
		redirects int
		wantErr   bool
		wantSent  int64
	}{
		{9, false, 10},
		{10, true, 10},
		{12, true, 10},
	} {
		sent.Store(0)
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/"+strconv.Itoa(tt.redirects), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(context.Background(), "", req)
		if err == nil {
			resp.Body.Close()
		}
		stopped := err != nil && strings.Contains(err.Error(), "client: stopped after 10 redirects")
		if stopped != tt.wantErr || (!tt.wantErr && err != nil) || sent.Load() != tt.wantSent {
			t.Errorf("a chain of %d redirects: %v after %d requests; want stopped %v after %d", tt.redirects, err, sent.Load(), tt.wantErr, tt.wantSent)
		}
	}
}

func TestNewChecksItsJar(t *testing.T) {
	ctx := context.Background()
	for _, o := range []*client.Options{nil, {}} {
		if _, err := client.New(ctx, "", o); !errors.Is(err, client.ErrOptions) {
			t.Fatalf("New without a path or a jar (options %+v): %v; want ErrOptions", o, err)
		}
	}
	if _, err := client.New(ctx, t.TempDir()+"/j.db", &client.Options{Jar: &idem.MemoryJar{}}); !errors.Is(err, client.ErrOptions) {
		t.Fatalf("New with both a path and a jar: %v; want ErrOptions", err)
	}
	// JarOptions configure the jar New opens: beside a jar of the caller's
	// they would configure nothing, without a word.
	both := &client.Options{Jar: &idem.MemoryJar{}, JarOptions: &keyjar.Options{BusyTimeout: time.Second}}
	if _, err := client.New(ctx, "", both); !errors.Is(err, client.ErrOptions) || !strings.Contains(err.Error(), "JarOptions") {
		t.Fatalf("New with both Options.Jar and Options.JarOptions: %v; want ErrOptions naming JarOptions", err)
	}
	c, err := client.New(ctx, "", &client.Options{Jar: &idem.MemoryJar{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := client.DefaultBase(c).MaxIdleConnsPerHost; n < 32 {
		t.Fatalf("default pool keeps %d idle connections per host; want at least 32", n)
	}
}

// TestDefaultBaseFindsALostHTTP2Connection: over HTTP/2, net/http sends
// every attempt on the one connection to the host while it looks open.
// The default Base checks the connection's health (a PING after a quiet
// spell, the connection closed when it goes unanswered), so a call whose
// connection stopped carrying anything is sent again, same key, on a new
// connection, with no AttemptTimeout set; and by default that check takes
// no longer than half of the retry policy's default budget.
func TestDefaultBaseFindsALostHTTP2Connection(t *testing.T) {
	c, err := client.New(t.Context(), "", &client.Options{Jar: &idem.MemoryJar{}})
	if err != nil {
		t.Fatal(err)
	}
	h2 := client.DefaultBase(c).HTTP2
	c.Close()
	budget := (retry.Policy{}).Defaults().MaxElapsed
	if h2 == nil || h2.SendPingTimeout <= 0 || h2.PingTimeout <= 0 || h2.SendPingTimeout+h2.PingTimeout > budget/2 {
		t.Fatalf("default Base's HTTP/2 config %+v; want a health check whose ping and timeout add up to at most %v", h2, budget/2)
	}

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	proxy := stallproxy.New(t, srv.Listener.Addr().String())
	client.SetHTTP2HealthCheck(t, http.HTTP2Config{SendPingTimeout: 250 * time.Millisecond, PingTimeout: 250 * time.Millisecond})
	c, err = client.New(t.Context(), "", &client.Options{Jar: &idem.MemoryJar{}, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The test server's certificate, before the first request.
	client.DefaultBase(c).TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	for i, op := range []string{"first", "second"} {
		if i == 1 {
			proxy.Stall() // the connection the first call opened
		}
		// Bounded, so that a call left on the lost connection fails the
		// test rather than hangs it.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, _ := http.NewRequest(http.MethodPost, "https://"+proxy.Addr()+"/charges", strings.NewReader(`{"amount":100}`))
		resp, err := c.Do(ctx, op, req)
		cancel()
		if err != nil {
			t.Fatalf("call %q: %v; want 201 (the second on a new connection, once the first was found lost)", op, err)
		}
		resp.Body.Close()
		rec, err := c.Jar().Get(t.Context(), op)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusCreated || resp.ProtoMajor != 2 || rec.Attempts != i+1 || proxy.Accepted() != i+1 {
			t.Fatalf("call %q: %s over %s after %d attempts, %d connections; want 201 over HTTP/2 after %d, %d", op, resp.Status, resp.Proto, rec.Attempts, proxy.Accepted(), i+1, i+1)
		}
	}
}

// TestStateErrorSaysTheState: Resume of a done, a failed and an abandoned
// operation, Abandon of a done one and Forget of a pending one return a
// *StateError that holds the operation, its key and its state, matches
// ErrState and reads as the call and the state.
func TestStateErrorSaysTheState(t *testing.T) {
	ctx := context.Background()
	jar := &idem.MemoryJar{}
	c, err := client.New(ctx, "", &client.Options{Jar: jar})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, st := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateAbandoned, idem.StatePending} {
		if _, _, err := jar.Begin(ctx, idem.Record{Op: "op:" + string(st), Key: "key-" + string(st), State: st,
			Method: http.MethodPost, URL: chargesURL, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(call string, err error, st idem.State, msg string) {
		t.Helper()
		var se *client.StateError
		if !errors.Is(err, client.ErrState) || !errors.As(err, &se) || se.Op != "op:"+string(st) ||
			se.Key != "key-"+string(st) || se.State != st || err.Error() != msg {
			t.Errorf("%s: %v (%+v); want a *StateError of op:%s with its key and state, matching ErrState, reading %q",
				call, err, se, st, msg)
		}
	}
	for _, st := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateAbandoned} {
		op := "op:" + string(st)
		_, err := c.Resume(ctx, op)
		check("Resume "+op, err, st, fmt.Sprintf("client: resume %q: the operation is %s, not pending; nothing was sent: the operation's state does not allow this", op, st))
		_, err = c.ResumeWithBody(ctx, op, func() (io.ReadCloser, error) { return http.NoBody, nil })
		check("ResumeWithBody "+op, err, st, fmt.Sprintf("client: resume %q: the operation is %s, not pending; nothing was sent: the operation's state does not allow this", op, st))
	}
	check("Abandon op:done", c.Abandon(ctx, "op:done", "checked"), idem.StateDone,
		`client: abandon "op:done": the operation is done, its outcome is known: the operation's state does not allow this`)
	check("Forget op:pending", c.Forget(ctx, "op:pending"), idem.StatePending,
		`client: forget "op:pending": the operation is pending, its outcome unknown; resume or abandon it first: the operation's state does not allow this`)
}

// TestSchemeMisspelt: over the default Base, an *http.Transport that the
// client wraps, a URL of a scheme net/http does not send (htp://) is
// refused with idem.ErrInvalidURL before anything is stored, as it is
// through an idem.Transport over an *http.Transport. Before, the wrapper
// hid the *http.Transport from the check: the operation was stored, each
// attempt failed alike, and it stayed pending, which no resume could
// settle and a call with the URL fixed met as a *MismatchError.
func TestSchemeMisspelt(t *testing.T) {
	jar := &idem.MemoryJar{}
	c, err := client.New(context.Background(), "", &client.Options{Jar: jar, Policy: fastPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.PostJSON(context.Background(), "charge:1", "htp://127.0.0.1:8080/v1/charges", map[string]int{"amount": 1}, nil)
	if !errors.Is(err, idem.ErrInvalidURL) {
		t.Errorf("PostJSON to htp://: %v; want idem.ErrInvalidURL", err)
	}
	if _, err := jar.Get(context.Background(), "charge:1"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("the jar after it: %v; want the operation not stored", err)
	}
}

// TestMethodsWithoutPOST: Options.Methods empty but not nil (a config
// file's "methods: []") is ErrOptions, and PostJSON over a Client whose
// Methods leave POST out sends nothing and returns ErrMethod. Before,
// both sent the POST once, its operation's name ignored, without a key, a
// retry or a record.
func TestMethodsWithoutPOST(t *testing.T) {
	if _, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Methods: []string{}}); !errors.Is(err, client.ErrOptions) {
		t.Errorf("New with Methods empty: %v; want ErrOptions", err)
	}
	// As a config file may give them: no request's method matches one,
	// and the POSTs they meant to key would go unkeyed.
	for _, methods := range [][]string{{"POST "}, {"PUT", "post,patch"}, {""}} {
		_, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Methods: methods})
		if !errors.Is(err, client.ErrOptions) || !strings.Contains(err.Error(), strconv.Quote(methods[len(methods)-1])) {
			t.Errorf("New with Methods %q: %v; want ErrOptions quoting the one that is not a method", methods, err)
		}
	}
	if _, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Methods: []string{"post", "PURGE", "M-SEARCH"}}); err != nil {
		t.Errorf("New with Methods of tokens: %v", err)
	}
	var sent atomic.Int64
	c := newClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent.Add(1) }), &client.Options{Methods: []string{"PUT"}})
	if _, err := c.PostJSON(context.Background(), "charge:1", chargesURL, map[string]int{"amount": 1}, nil); !errors.Is(err, client.ErrMethod) || sent.Load() != 0 {
		t.Errorf("PostJSON with Methods {PUT}: %v, %d sent; want ErrMethod, nothing sent", err, sent.Load())
	}
}

// TestDoneOperationCalledAgainWithoutAnAnswer: a done operation called
// again for its saved answer that gets none (a 401, its credentials
// refused; a 503 left after the attempts) matches idem.ErrPending, its
// *idem.PendingError's State done, and keeps its outcome. Before, the 401
// was a *StatusError alone, where a 503 matched ErrPending.
func TestDoneOperationCalledAgainWithoutAnAnswer(t *testing.T) {
	for _, codes := range [][]int{{401}, {503, 503}} {
		s := newShop()
		jar := &idem.MemoryJar{}
		c := newClient(t, s, &client.Options{Jar: jar, Policy: retry.Policy{MaxAttempts: 2, InitialInterval: time.Microsecond}})
		ctx := context.Background()
		if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, map[string]any{"order": "o1", "amount": 7}, nil); err != nil {
			t.Fatal(err)
		}
		s.failNext(codes...)
		_, err := c.PostJSON(ctx, "charge:o1", chargesURL, map[string]any{"order": "o1", "amount": 7}, nil)
		var pe *idem.PendingError
		if !errors.Is(err, idem.ErrPending) || !errors.As(err, &pe) || pe.State != idem.StateDone {
			t.Errorf("%v: the done operation called again: %v; want a *idem.PendingError of State done", codes, err)
		}
		if r, _ := jar.Get(ctx, "charge:o1"); r.State != idem.StateDone || r.LastStatus != http.StatusCreated {
			t.Errorf("%v: state %s, last status %d after it; want done, 201", codes, r.State, r.LastStatus)
		}
	}
}

// TestKeyedAnswerWithoutRequest: a Base whose response leaves Request nil
// (a hand-written RoundTripper, a test double) still answers a keyed
// request: its 503 is a pending operation's, its 409 a *ConflictError,
// with the operation's name and key, not an answer to a request sent
// without a key.
func TestKeyedAnswerWithoutRequest(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody}, nil
		})
		c := newClient(t, nil, &client.Options{Base: base, Policy: retry.Policy{MaxAttempts: 1}})
		_, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) || se.Op != "charge:o1" || se.Key == "" || !errors.Is(err, idem.ErrPending) && !errors.As(err, new(*client.ConflictError)) {
			t.Errorf("%d: %v (%#v); want the operation's pending error, with its name and key", code, err, se)
		}
	}
}

// A PostgreSQL URL given as New's path, as idemctl --jar takes one, is not
// a file to open: New says to open the jar with pgjar and give it as
// Options.Jar, without quoting the URL (which may hold a password), and
// creates nothing.
func TestNewRefusesAPostgresURLAsPath(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, u := range []string{"postgres://worker:s3cret@127.0.0.1:1/app", "postgresql://worker:s3cret@127.0.0.1:1/app"} {
		c, err := client.New(context.Background(), u, nil)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, client.ErrOptions) || !strings.Contains(err.Error(), "pgjar") || !strings.Contains(err.Error(), "Options.Jar") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("New(%q): %v; want ErrOptions saying to open it with pgjar and give it as Options.Jar, without the password", u, err)
		}
	}
	if ents, _ := os.ReadDir("."); len(ents) != 0 {
		t.Errorf("New created %v in the working directory", ents)
	}
}
