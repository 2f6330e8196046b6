package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/retry"
)

// A server that answers 503 to everything: with a budget shared by the
// client, retries stop multiplying its load; first attempts still go out.
// A Client without Options.Budget has one, of retry.Budget's defaults.
func TestBudgetStopsRetriesToAServerThatIsDown(t *testing.T) {
	const calls = 40
	for _, tt := range []struct {
		name   string
		budget *retry.Budget
		sends  int
		last   string // the last call's PendingError.Reason
	}{
		// 40 calls of at most 5 attempts: 40 first attempts + 160 retries.
		{"unlimited", &retry.Budget{Capacity: 1 << 30}, 200, "MaxAttempts (5) reached after status 503"},
		// 50 tokens at 5 per retry pay for 10 retries in all.
		{"budget 50", &retry.Budget{Capacity: 50, RetryCost: 5}, calls + 10, "retry budget empty after status 503"},
		// The default: 500 tokens at 5 per retry, 100 retries.
		{"no budget given", nil, calls + 100, "retry budget empty after status 503"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var sends atomic.Int64
				down := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					sends.Add(1)
					w.WriteHeader(http.StatusServiceUnavailable)
				})
				c := newClient(t, down, &client.Options{Budget: tt.budget, Policy: retry.Policy{MaxAttempts: 5}})
				for i := range calls {
					_, err := c.PostJSON(context.Background(), fmt.Sprint("charge:", i), chargesURL, chargeReq{Order: fmt.Sprint(i)}, nil)
					var pe *idem.PendingError
					if !errors.As(err, &pe) || pe.LastStatus != 503 {
						t.Fatalf("call %d: %v; want the last 503 as a pending error", i, err)
					}
					if i == calls-1 && (pe.Reason != tt.last || !strings.Contains(err.Error(), tt.last)) {
						t.Fatalf("last call: %v (Reason %q); want its Reason and message to say %q", err, pe.Reason, tt.last)
					}
				}
				if got := sends.Load(); got != int64(tt.sends) {
					t.Fatalf("server got %d requests; want %d", got, tt.sends)
				}
				pending, _ := c.Pending(context.Background())
				if len(pending) != calls {
					t.Fatalf("%d operations pending; want all %d, resumable", len(pending), calls)
				}
			})
		})
	}
}

// Unreachable server: each retry after a refused connection costs
// RetryCost (5 by default), as after an answer, not TimeoutCost.
func TestBudgetStopsRetriesToAnUnreachableServer(t *testing.T) {
	addr := refusetest.Addr(t) // connections are refused

	var dials atomic.Int64
	base := http.DefaultTransport.(*http.Transport).Clone()
	counting := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		dials.Add(1)
		return base.RoundTrip(r)
	})
	budget := &retry.Budget{Capacity: 50}
	c := newClient(t, nil, &client.Options{Base: counting, Budget: budget})
	for i := range 10 {
		_, err := c.PostJSON(context.Background(), fmt.Sprint("charge:", i), "http://"+addr+"/charges", chargeReq{}, nil)
		var ne net.Error
		if !errors.Is(err, idem.ErrPending) || !errors.As(err, &ne) {
			t.Fatalf("call %d: %v; want a pending error with the network error", i, err)
		}
	}
	// 10 first attempts + 10 retries (50 tokens / 5), instead of 50 attempts.
	if got := dials.Load(); got != 20 {
		t.Fatalf("%d attempts; want 20", got)
	}
	if budget.Available() != 0 {
		t.Fatalf("budget holds %d; want it spent", budget.Available())
	}
}

// Answers refill the budget: after the server is back, retries are paid
// for again.
func TestBudgetRefilledByAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newShop()
		budget := &retry.Budget{Capacity: 10, RetryCost: 5, Refund: 5}
		c := newClient(t, s, &client.Options{Budget: budget, Policy: retry.Policy{MaxAttempts: 5}})
		ctx := context.Background()
		s.failNext(503, 503, 503)
		if _, err := c.PostJSON(ctx, "charge:a", chargesURL, chargeReq{Order: "a"}, nil); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("got %v; want pending once the budget is spent", err)
		}
		if budget.Available() != 0 || s.sends() != 3 {
			t.Fatalf("budget %d after %d sends; want 0 after 3 (2 retries paid for)", budget.Available(), s.sends())
		}
		// The server is back: two answered first attempts refund 5 each.
		for _, op := range []string{"b", "c"} {
			if _, err := c.PostJSON(ctx, "charge:"+op, chargesURL, chargeReq{Order: op}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if budget.Available() != 10 {
			t.Fatalf("budget %d after two answers; want 10", budget.Available())
		}
		// A retry is paid for again, and refunded when it is answered.
		s.failNext(503)
		if _, err := c.PostJSON(ctx, "charge:d", chargesURL, chargeReq{Order: "d"}, nil); err != nil {
			t.Fatalf("got %v; want the retry to be sent and answered", err)
		}
		if s.sends() != 3+2+2 || budget.Available() != 10 {
			t.Fatalf("%d sends, budget %d; want 7 sends, 10 tokens", s.sends(), budget.Available())
		}
	})
}
