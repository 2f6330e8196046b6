package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

// naiveAttempts is how often a baseline sends one order at most.
const naiveAttempts = 5

// runNaive is a retry loop on plain net/http, the way code without
// idempotency keys retries: on a network error, a timeout or a 5xx, send
// again. With perTry, each attempt carries a fresh Idempotency-Key: the
// server can tell nothing, as with no key. Each attempt opens its own
// connection, so net/http never re-sends an attempt by itself.
func runNaive(ctx context.Context, e *env, perTry bool) error {
	hc := &http.Client{Timeout: e.cfg.attemptTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	forEach(ctx, e.cfg.concurrency, e.orders, func(o order) {
		defer e.done()
		body, _ := json.Marshal(o.body())
		for attempt := range naiveAttempts {
			if attempt > 0 && retry.Sleep(ctx, backoff(attempt)) != nil {
				return
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/charges", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if perTry {
				req.Header.Set(idem.KeyHeader, uuid.NewString())
			}
			resp, err := hc.Do(req)
			if err != nil {
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if retry.Classify(resp, nil) != retry.Retry && resp.StatusCode < 500 {
				return
			}
		}
	})
	return nil
}

// backoff is the naive loops' wait before attempt n: exponential with full
// jitter, from 20 ms.
func backoff(n int) time.Duration {
	d := 20 * time.Millisecond << min(n, 5)
	return rand.N(d)
}

// policy is the SDK's retry policy in the lab: short waits, so that a run
// takes seconds.
func (c config) policy() retry.Policy {
	return retry.Policy{
		MaxAttempts:     8,
		InitialInterval: 20 * time.Millisecond,
		MaxInterval:     200 * time.Millisecond,
		MaxRetryAfter:   c.lockTimeout + time.Second, // a 409's Retry-After is at most the server's lease
		MaxElapsed:      maxElapsed,
		AttemptTimeout:  c.attemptTimeout,
	}
}

// maxElapsed is a call's budget in the lab (retry.Policy.MaxElapsed).
const maxElapsed = 30 * time.Second

// resumePasses bounds how often the pending operations are resumed after
// the first pass over the orders.
const resumePasses = 8

// clientOptions are the SDK's options in the lab: the lab's policy, a
// retry budget that never runs dry (the faults are the experiment), and a
// short lease so that a restarted process soon takes over the operations
// of the one that was killed.
func (c config) clientOptions(hooks idem.Hooks) *client.Options {
	opts := &client.Options{
		Policy: c.policy(),
		Budget: &retry.Budget{Capacity: 1 << 30},
		Lease:  time.Second,
		Hooks:  hooks,
	}
	if c.ablate.newKeyPerAttempt {
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.MaxIdleConnsPerHost = 64
		opts.Base = rekey{base: base}
	}
	return opts
}

// rekey replaces the Idempotency-Key of every attempt with a fresh one: the
// bug of a client that mints a key per attempt, planted under the
// Transport for the chaos tests.
type rekey struct{ base http.RoundTripper }

func (t rekey) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get(idem.KeyHeader) == "" {
		return t.base.RoundTrip(req)
	}
	out := req.Clone(req.Context())
	out.Header.Set(idem.KeyHeader, uuid.NewString())
	return t.base.RoundTrip(out)
}

// runIdem sends every order through the SDK, with one key per order kept
// in a SQLite jar, then resumes what stayed pending.
func runIdem(ctx context.Context, e *env) error {
	c, err := client.New(ctx, e.jarPath, e.cfg.clientOptions(idem.Hooks{}))
	if err != nil {
		return err
	}
	defer c.Close()
	forEach(ctx, e.cfg.concurrency, e.orders, func(o order) {
		defer e.done()
		c.PostJSON(ctx, o.op(), e.url+"/v1/charges", o.body(), nil)
	})
	return resumePending(ctx, c, e.cfg.concurrency, resumePasses, nil)
}

// resumePending resumes the jar's pending operations, at most passes
// times over, and tells after (when not nil) how each went.
func resumePending(ctx context.Context, c *client.Client, concurrency, passes int, after func(op string, err error)) error {
	for range passes {
		recs, err := c.Pending(ctx)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		forEach(ctx, concurrency, recs, func(r idem.Record) {
			_, err := c.Resume(ctx, r.Op)
			if after != nil {
				after(r.Op, err)
			}
		})
	}
	return ctx.Err()
}
