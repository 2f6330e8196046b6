package testserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/idemkit/idem/testserver"
)

// seenClaim is what ClaimFrom reported to one run of a handler.
type seenClaim struct {
	testserver.Claim
	ok bool
}

// saveFences is a Store that keeps the fence of every Save.
type saveFences struct {
	testserver.Store
	mu     sync.Mutex
	fences []testserver.Fence
}

func (s *saveFences) Save(ctx context.Context, scope, key string, f testserver.Fence, resp testserver.Response) error {
	s.mu.Lock()
	s.fences = append(s.fences, f)
	s.mu.Unlock()
	return s.Store.Save(ctx, scope, key, f, resp)
}

func (s *saveFences) last() testserver.Fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fences) == 0 {
		return testserver.Fence{}
	}
	return s.fences[len(s.fences)-1]
}

// TestClaimFrom: the handler's context carries the scope, the key
// unquoted, the token the Middleware fences its save with, and TakenOver
// only for a run that took a stale claim over, not for a claim made
// afresh after a release.
func TestClaimFrom(t *testing.T) {
	eachStore(t, func(t *testing.T, store testserver.Store) {
		clk := newClock()
		st := &saveFences{Store: store}
		seen := make(chan seenClaim, 1)
		var hold func(testserver.Claim) int // the status to answer
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, ok := testserver.ClaimFrom(r.Context())
			status := http.StatusCreated
			if hold != nil {
				status = hold(c)
			}
			seen <- seenClaim{c, ok}
			w.WriteHeader(status)
		})
		mw := &testserver.Middleware{Store: st, Now: clk.Now}
		srv := mw.Wrap(h)

		// A first claim, with a quoted key and a credential.
		r := request("POST", "/", chargeBody, "Idempotency-Key", `"k1"`, "Authorization", "Bearer A")
		if w := serve(srv, r); w.Code != 201 {
			t.Fatalf("first claim: %d %q; want 201", w.Code, w.Body)
		}
		// Its token is the clock's reading.
		c := <-seen
		now := clk.Now().UnixNano()
		if !c.ok || c.Scope != testserver.CredentialScope(r) || c.Key != "k1" || c.TakenOver || c.Token != now {
			t.Fatalf("ClaimFrom in a first claim = %+v; want the credential's scope, key k1, a first claim, token %d", c, now)
		}
		saved := st.last()
		if saved.Token != c.Token || saved.ClaimID == "" || saved.ClaimID != c.ClaimID {
			t.Errorf("the Middleware saved with fence %+v; the handler was told token %d and ID %q; want those, an ID not empty", saved, c.Token, c.ClaimID)
		}

		// The Middleware's Scope function names the scope.
		scoped := (&testserver.Middleware{Store: st, Now: clk.Now, Scope: func(*http.Request) string { return "acct_1" }}).Wrap(h)
		serve(scoped, request("POST", "/", chargeBody, "Idempotency-Key", "k1"))
		if got := <-seen; !got.ok || got.Scope != "acct_1" || got.Key != "k1" || got.TakenOver {
			t.Errorf("ClaimFrom with a Scope function = %+v; want scope acct_1, key k1, a first claim", got)
		}

		// A run stalls past its lease and is taken over.
		started, unblock := make(chan testserver.Claim), make(chan struct{})
		stall := true
		hold = func(c testserver.Claim) int {
			if stall { // the first run only
				stall = false
				started <- c
				<-unblock
			}
			return http.StatusCreated
		}
		a := make(chan *httptest.ResponseRecorder)
		go func() { a <- serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k2")) }()
		first := <-started
		clk.Add(testserver.DefaultLockTimeout)
		if w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k2")); w.Code != 201 {
			t.Fatalf("take-over: %d %q; want 201", w.Code, w.Body)
		}
		got := <-seen
		if !got.ok || got.Key != "k2" || !got.TakenOver || got.Token <= first.Token {
			t.Errorf("ClaimFrom in the run that took over = %+v; want key k2, TakenOver, a token greater than the stale claim's %d", got, first.Token)
		}
		if first.TakenOver {
			t.Errorf("the stale run was told it took over: %+v", first)
		}
		over := st.last()
		if over.Token != got.Token || over.ClaimID == "" || over.ClaimID != got.ClaimID {
			t.Errorf("the Middleware saved the take-over's answer with fence %+v; the handler was told token %d and ID %q; want those, an ID not empty", over, got.Token, got.ClaimID)
		}
		close(unblock)
		<-seen
		wantProblem(t, <-a, 409, testserver.ProblemTakenOver)
		if stale := st.last(); stale.Token != first.Token || stale.ClaimID != first.ClaimID || stale.ClaimID == "" || stale.ClaimID == over.ClaimID {
			t.Errorf("the stale run's save was fenced with %+v; want its token %d and an ID other than the take-over's %q", stale, first.Token, over.ClaimID)
		}

		// A run fails and its claim is released: the next one is a first
		// claim, not a take-over.
		failed := true
		hold = func(testserver.Claim) int {
			if failed {
				failed = false
				return http.StatusInternalServerError
			}
			return http.StatusCreated
		}
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k3"))
		<-seen
		serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k3"))
		if got := <-seen; !got.ok || got.TakenOver || mw.Stats().Released != 1 {
			t.Errorf("ClaimFrom after a released claim = %+v, %+v; want a first claim after one release", got, mw.Stats())
		}
	})
}

// TestClaimFromWithoutClaim: ClaimFrom reports false outside the
// Middleware, in a handler it lets through unprotected, and in the
// caller's request, which the Middleware leaves as it was, whether it ran
// the handler or replayed.
func TestClaimFromWithoutClaim(t *testing.T) {
	if c, ok := testserver.ClaimFrom(context.Background()); ok {
		t.Errorf("ClaimFrom(context.Background()) = %+v, true; want false", c)
	}
	var runs []bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		_, ok := testserver.ClaimFrom(r.Context())
		runs = append(runs, ok)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore), Optional: true}
	var outer []bool
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mw.Wrap(h).ServeHTTP(w, r)
		_, ok := testserver.ClaimFrom(r.Context())
		outer = append(outer, ok)
	})
	serve(srv, request("GET", "/", ""))                                       // a method the Middleware does not protect
	serve(srv, request("POST", "/", chargeBody))                              // no key, Optional
	serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k"))      // claimed
	w := serve(srv, request("POST", "/", chargeBody, "Idempotency-Key", "k")) // replayed
	if w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second request with key k: %d %v; want a replay", w.Code, w.Header())
	}
	if want := []bool{false, false, true}; !slices.Equal(runs, want) {
		t.Errorf("ClaimFrom in the handler's runs = %v; want %v", runs, want)
	}
	if want := []bool{false, false, false, false}; !slices.Equal(outer, want) {
		t.Errorf("ClaimFrom in the caller's request after the Middleware = %v; want %v", outer, want)
	}
}
