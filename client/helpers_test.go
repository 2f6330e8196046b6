package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// authValue is the credential of the test requests: it must reach the
// server on every attempt and never the jar.
const authValue = "Bearer sk_test_9f8e7d6c5b4a_NEVER_ON_DISK"

func withAuth(r *http.Request) error {
	r.Header.Set("Authorization", authValue)
	return nil
}

// fastPolicy retries at once: tests that need waits run in a synctest
// bubble.
var fastPolicy = retry.Policy{InitialInterval: time.Microsecond, MaxInterval: time.Microsecond, MaxAttempts: 5}

type chargeReq struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

type charge struct {
	ID     string `json:"id"`
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// shop is a test payments server: the testserver Middleware over a handler
// that charges each order it is asked to, and a log of every request that
// reached it.
type shop struct {
	mw *testserver.Middleware

	mu      sync.Mutex
	keys    []string // Idempotency-Key of every request received
	auths   []string // Authorization of every request received
	charged map[string]int
	script  []int // statuses answered before the middleware, one per request, in order
}

func newShop() *shop {
	return &shop{mw: &testserver.Middleware{Store: &testserver.MemoryStore{}}, charged: map[string]int{}}
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get(idem.KeyHeader))
	s.auths = append(s.auths, r.Header.Get("Authorization"))
	var code int
	if len(s.script) > 0 {
		code, s.script = s.script[0], s.script[1:]
	}
	s.mu.Unlock()
	if code != 0 {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(code)
		io.WriteString(w, `{"title":"scripted `+strconv.Itoa(code)+`"}`)
		return
	}
	s.mw.Wrap(http.HandlerFunc(s.charge)).ServeHTTP(w, r)
}

func (s *shop) charge(w http.ResponseWriter, r *http.Request) {
	var in chargeReq
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.charged[in.Order]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(charge{ID: "ch_" + in.Order, Order: in.Order, Amount: in.Amount})
}

// failNext makes the next requests answer these statuses, without reaching
// the middleware.
func (s *shop) failNext(codes ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, codes...)
}

func (s *shop) sends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *shop) key(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[i]
}

func (s *shop) charges(order string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charged[order]
}

// inProcess is a RoundTripper that serves requests with a handler in
// this goroutine, without a network: it works in a synctest bubble.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if r.Body != nil {
		r.Body.Close()
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newClient returns a client over a MemoryJar (unless o sets a Jar) that
// sends to h in process, with the test credential and fastPolicy.
func newClient(t *testing.T, h http.Handler, o *client.Options) *client.Client {
	t.Helper()
	if o == nil {
		o = &client.Options{}
	}
	if o.Jar == nil {
		o.Jar = &idem.MemoryJar{}
	}
	if o.Base == nil {
		o.Base = inProcess{h}
	}
	if o.Header == nil {
		o.Header = withAuth
	}
	if o.Policy == (retry.Policy{}) {
		o.Policy = fastPolicy
	}
	c, err := client.New(context.Background(), "", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const chargesURL = "http://shop.test/charges"

// backdate rewrites op's creation time in jar, as if its first send had
// been at t0 in an earlier process.
func backdate(t *testing.T, jar client.Jar, op string, t0 time.Time) idem.Record {
	t.Helper()
	ctx := context.Background()
	r, err := jar.Get(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	if err := jar.Forget(ctx, op); err != nil {
		t.Fatal(err)
	}
	r.Created, r.Updated = t0, t0
	if _, created, err := jar.Begin(ctx, r); err != nil || !created {
		t.Fatalf("re-creating %q: created=%v, %v", op, created, err)
	}
	return r
}

func state(t *testing.T, jar client.Jar, op string) idem.State {
	t.Helper()
	r, err := jar.Get(context.Background(), op)
	if err != nil {
		t.Fatalf("get %q: %v", op, err)
	}
	return r.State
}

// pendingCharge returns a shop and a client (newClient with o) whose
// operation charge:o1 stayed pending: its only attempt got a 503.
func pendingCharge(t *testing.T, o *client.Options) (*shop, *client.Client) {
	t.Helper()
	s := newShop()
	s.failNext(503)
	if o == nil {
		o = &client.Options{}
	}
	o.Policy = retry.Policy{MaxAttempts: 1}
	c := newClient(t, s, o)
	_, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
	if !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want the 503 as a pending error", err)
	}
	return s, c
}
