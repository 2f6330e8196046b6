package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/idemkit/idem/retry"
)

func TestBudgetZeroValueDefaults(t *testing.T) {
	var b retry.Budget
	if got := b.Available(); got != 500 {
		t.Fatalf("zero Budget holds %d; want 500", got)
	}
	if cost, ok := b.Withdraw(nil); !ok || cost != 5 {
		t.Fatalf("retry after an answer: cost %d, %v; want 5, true", cost, ok)
	}
	if cost, ok := b.Withdraw(errors.New("reset")); !ok || cost != 5 {
		t.Fatalf("retry after a network error: cost %d, %v; want 5, true", cost, ok)
	}
	if cost, ok := b.Withdraw(os.ErrDeadlineExceeded); !ok || cost != 10 {
		t.Fatalf("retry after a timeout: cost %d, %v; want 10, true", cost, ok)
	}
	if got := b.Available(); got != 480 {
		t.Fatalf("after three retries: %d; want 480", got)
	}
}

// A timeout costs TimeoutCost, wherever it is in the chain; any other
// error, a refused connection included, RetryCost.
func TestBudgetTimeoutCostsMore(t *testing.T) {
	refused := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	dialTimeout := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"answer", nil, 3},
		{"refused connection", refused, 3},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), 3},
		{"dial timeout", dialTimeout, 7},
		{"context deadline", fmt.Errorf("attempt: %w", context.DeadlineExceeded), 7},
	} {
		b := &retry.Budget{Capacity: 100, RetryCost: 3, TimeoutCost: 7}
		if cost, ok := b.Withdraw(tc.err); !ok || cost != tc.want || b.Available() != 100-tc.want {
			t.Errorf("%s: cost %d, %v, %d left; want %d, true, %d left", tc.name, cost, ok, b.Available(), tc.want, 100-tc.want)
		}
	}
}

func TestBudgetEmptiesAndRefuses(t *testing.T) {
	b := &retry.Budget{Capacity: 20, RetryCost: 5, TimeoutCost: 10}
	var granted int
	for range 10 {
		if _, ok := b.Withdraw(nil); ok {
			granted++
		}
	}
	if granted != 4 || b.Available() != 0 {
		t.Fatalf("granted %d retries, %d left; want 4 granted, 0 left", granted, b.Available())
	}
	if cost, ok := b.Withdraw(nil); ok || cost != 0 {
		t.Fatalf("empty budget: %d, %v; want 0, false", cost, ok)
	}

	b = &retry.Budget{Capacity: 15, RetryCost: 5, TimeoutCost: 10}
	b.Withdraw(nil) // 10 left
	b.Withdraw(nil) // 5 left
	if _, ok := b.Withdraw(os.ErrDeadlineExceeded); ok {
		t.Fatalf("a retry costing 10 was granted with 5 left")
	}
	if b.Available() != 5 {
		t.Fatalf("a refused withdrawal took tokens: %d left; want 5", b.Available())
	}
}

func TestBudgetDepositRefillsUpToCapacity(t *testing.T) {
	b := &retry.Budget{Capacity: 30, RetryCost: 5, TimeoutCost: 10, Refund: 2}
	cost, _ := b.Withdraw(os.ErrDeadlineExceeded)
	b.Deposit(cost) // the retried call got an answer: its last retry is refunded
	if b.Available() != 30 {
		t.Fatalf("after refunding the retry: %d; want 30", b.Available())
	}
	b.Deposit(0) // a first attempt answered: Refund, capped at Capacity
	if b.Available() != 30 {
		t.Fatalf("deposit beyond capacity: %d; want 30", b.Available())
	}
	b.Withdraw(nil)
	b.Withdraw(nil) // 20 left
	b.Deposit(0)
	if b.Available() != 22 {
		t.Fatalf("after a first-attempt success: %d; want 22 (Refund 2)", b.Available())
	}
	b.Deposit(-3) // less than 0 is 0: Refund, never a withdrawal
	if b.Available() != 24 {
		t.Fatalf("after a deposit of -3: %d; want 24 (Refund 2)", b.Available())
	}
}

func TestBudgetConcurrentWithdrawalsNeverOverdraw(t *testing.T) {
	b := &retry.Budget{Capacity: 100, RetryCost: 1}
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, ok := b.Withdraw(nil); ok {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if granted != 100 || b.Available() != 0 {
		t.Fatalf("granted %d of 400 requests, %d left; want exactly 100 granted", granted, b.Available())
	}
}
