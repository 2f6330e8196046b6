package client_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

// TestPanickingHeader: an Options.Header that panics ends the call, and the
// panic reaches the caller as it is; nothing of that attempt was sent, as
// when Header returns an error or an OnAttempt hook panics (idem.Hooks): it
// is not counted, the lease is given back, and an operation without a name
// whose first attempt it was, which no call can name to resume, is
// abandoned, not left pending for a resume of every pending operation to
// send. One that an earlier attempt sent stays pending, with that attempt,
// and the Budget gets the cost of the retry that was not sent back.
func TestPanickingHeader(t *testing.T) {
	for _, c := range []struct {
		name   string
		op     string
		panic  int  // the attempt whose Header panics
		inBase bool // Base panics instead, after Header: the attempt may have been sent
		sent   int
		state  idem.State
	}{
		{"named, first attempt", "charge:o1", 1, false, 0, idem.StatePending},
		{"named, second attempt", "charge:o1", 2, false, 1, idem.StatePending},
		{"unnamed, first attempt", "", 1, false, 0, idem.StateAbandoned},
		{"unnamed, second attempt", "", 2, false, 1, idem.StatePending},
		{"Base, named", "charge:o1", 1, true, 1, idem.StatePending},
		{"Base, unnamed", "", 1, true, 1, idem.StatePending},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var sent atomic.Int32
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					r.Body.Close()
					sent.Add(1)
					if c.inBase {
						panic(http.ErrAbortHandler)
					}
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody, Request: r}, nil
				})
				var calls atomic.Int32
				header := func(r *http.Request) error {
					if calls.Add(1) == int32(c.panic) && !c.inBase {
						panic(http.ErrAbortHandler)
					}
					return withAuth(r)
				}
				jar := &idem.MemoryJar{}
				budget := &retry.Budget{}
				cl := newClient(t, nil, &client.Options{Jar: jar, Base: base, Header: header, Budget: budget})
				func() {
					defer func() {
						if p := recover(); p != http.ErrAbortHandler {
							t.Errorf("the call panicked with %v; want Header's %v", p, http.ErrAbortHandler)
						}
					}()
					cl.PostJSON(context.Background(), c.op, chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
				}()
				if got := int(sent.Load()); got != c.sent {
					t.Errorf("Base saw %d attempts; want %d", got, c.sent)
				}
				recs, err := jar.List(context.Background(), idem.Filter{})
				if err != nil || len(recs) != 1 {
					t.Fatalf("the jar holds %d records, %v; want 1", len(recs), err)
				}
				r := recs[0]
				if r.State != c.state || r.Attempts != c.sent || r.Holder != "" {
					t.Errorf("record: %s, %d attempts, holder %q; want %s, %d attempts, no holder", r.State, r.Attempts, r.Holder, c.state, c.sent)
				}
				if got, want := budget.Available(), (&retry.Budget{}).Available(); got != want {
					t.Errorf("Budget after the call: %d tokens; want %d, the cost of a retry not sent given back", got, want)
				}
				if c.op != "" {
					// Not taken for an attempt still in flight.
					if err := cl.Abandon(context.Background(), c.op, "Header panicked"); err != nil && !errors.Is(err, client.ErrState) {
						t.Errorf("Abandon after Header panicked: %v", err)
					}
				}
			})
		})
	}
}

// TestHeaderCannotChangeTheMethod: the jar records a keyed request's
// method, which a resume sends again, and the server fingerprints it with
// the key: an Options.Header that changed it would send another request
// than the record says under the operation's key. The call stops before
// the attempt is sent, with an error wrapping idem.ErrNotSent, as for an
// error of Header: the attempt is not counted and the operation stays
// pending.
func TestHeaderCannotChangeTheMethod(t *testing.T) {
	var methods []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		methods = append(methods, r.Method)
		return &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Request: r}, nil
	})
	header := func(r *http.Request) error {
		r.Method = http.MethodPut
		return withAuth(r)
	}
	jar := &idem.MemoryJar{}
	cl := newClient(t, nil, &client.Options{Jar: jar, Base: base, Header: header})
	_, err := cl.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
	if !errors.Is(err, idem.ErrNotSent) || len(methods) != 0 {
		t.Fatalf("a Header that changes POST to PUT: %v, sent %q; want an error wrapping idem.ErrNotSent, nothing sent", err, methods)
	}
	r, err := jar.Get(context.Background(), "charge:o1")
	if err != nil || r.State != idem.StatePending || r.Attempts != 0 || r.Method != http.MethodPost {
		t.Fatalf("record: %s %s, %d attempts, %v; want a pending POST, 0 attempts", r.State, r.Method, r.Attempts, err)
	}
}
