package retry

import (
	"errors"
	"net"
	"sync"
)

// Budget is a retry quota shared by many calls, in the manner of the AWS
// SDKs' retry quota: a token bucket that every retry draws from and that
// final answers refill. While a server answers, refunds keep the bucket
// full. When it is down, nothing refills it and retries stop after about
// Capacity/cost of them, across all the calls that share it: the load on
// the server falls back to the first attempts, which never draw from the
// bucket and are never refused.
//
// The zero value is ready to use, full, with the defaults written beside
// each field; a zero or negative field means its default. Set the fields
// before the first use. A Budget is safe for concurrent use and reads no
// clock: it changes only when Withdraw and Deposit are called.
type Budget struct {
	// Capacity is the most tokens the bucket holds; it starts full. Zero
	// means 500.
	Capacity int
	// RetryCost is what a retry costs after a retryable answer (408, 409,
	// 425, 429, 502, 503, 504) or a network error that is no timeout (a
	// refused or reset connection). Zero means 5.
	RetryCost int
	// TimeoutCost is what a retry costs after an attempt that timed out: a
	// net.Error whose Timeout is true (a dial, a TLS handshake or
	// Policy.AttemptTimeout that ran out). Zero means 10. As in the AWS
	// SDKs, a server too slow to answer is likely overloaded, and its
	// retries are the first to stop; a refused connection (a server down
	// or restarting) costs the server next to nothing, and its retry
	// costs as one after an answer.
	TimeoutCost int
	// Refund is given back when a call's first attempt gets a final
	// answer. Zero means 1.
	Refund int

	mu    sync.Mutex
	spent int // tokens taken out; the bucket holds capacity-spent
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

func (b *Budget) capacity() int { return orDefault(b.Capacity, 500) }

// Withdraw takes the cost of one retry out of the bucket: TimeoutCost when
// the attempt being retried timed out (err is a net.Error whose Timeout is
// true, or wraps one), RetryCost otherwise. It returns the cost taken, or
// 0 and false when the bucket holds less than the cost: then nothing is
// taken and the retry must not be sent.
func (b *Budget) Withdraw(err error) (cost int, ok bool) {
	cost = orDefault(b.RetryCost, 5)
	if ne := net.Error(nil); err != nil && errors.As(err, &ne) && ne.Timeout() {
		cost = orDefault(b.TimeoutCost, 10)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.capacity()-b.spent < cost {
		return 0, false
	}
	b.spent += cost
	return cost, true
}

// Deposit refills the bucket after a call got a final answer. lastCost is
// what Withdraw returned for the call's last retry: it is given back. When
// lastCost is 0 or less (0: the first attempt answered), Refund is given
// back instead. The bucket never holds more than Capacity.
func (b *Budget) Deposit(lastCost int) {
	if lastCost <= 0 {
		lastCost = orDefault(b.Refund, 1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.spent = max(0, b.spent-lastCost)
}

// Available returns the tokens in the bucket.
func (b *Budget) Available() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(0, b.capacity()-b.spent)
}
