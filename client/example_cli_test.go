package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// chargeOrders is the core of a command-line tool that charges orders and
// survives kill -9: run again after any crash, with the same jar path and
// the same token, it charges each order once. A name per order ("charge:"
// + id) maps an input row to the same operation, and key, on every run.
func chargeOrders(ctx context.Context, jarPath, url, token string, orders []string) (err error) {
	c, err := client.New(ctx, jarPath, &client.Options{ // jarPath absolute: a run from another directory finds it
		Header: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+token); return nil },
		Policy: retry.Policy{MaxElapsed: time.Minute + 30*time.Second}, // a killed run's lease (1m), then retries
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }() // Close writes the last outcomes

	// What a killed run left pending, sent again under its keys.
	pending, err := c.Pending(ctx)
	if err != nil {
		return err
	}
	resumed := map[string]bool{}
	for _, rec := range pending {
		if !strings.HasPrefix(rec.Op, "charge:") || ctx.Err() != nil {
			continue
		}
		resumed[rec.Op] = true
		var ch struct{ ID string }
		resp, err := c.ResumeJSON(ctx, rec.Op, &ch)
		report(rec.Op, resp, ch.ID, err)
	}
	for _, id := range orders {
		if err := ctx.Err(); err != nil {
			return err // interrupted: what is left is sent by the next run
		}
		op := "charge:" + id
		if resumed[op] {
			continue
		}
		if rec, err := c.Jar().Get(ctx, op); err == nil && rec.State == idem.StateDone && rec.LastStatus/100 == 2 {
			fmt.Println(op, "charged in an earlier run")
			continue
		}
		// Not charged yet: a new order, or one refused (a 402), which is
		// asked again, under its key, for the server's saved answer.
		var ch struct{ ID string }
		resp, err := c.PostJSON(ctx, op, url, map[string]any{"order_id": id, "amount": 1000, "currency": "usd"}, &ch)
		report(op, resp, ch.ID, err)
	}
	return nil
}

// report prints what a call did to the operation op.
func report(op string, resp *client.Response, id string, err error) {
	state := idem.StatePending
	var pe *idem.PendingError
	var ce *client.ConflictError // a 409 left: the server still runs an earlier attempt
	var ste *client.StateError   // Resume: another run sharing the jar settled it meanwhile
	if errors.As(err, &pe) {
		state = pe.State
	} else if errors.As(err, &ce) {
		state = ce.State
	} else if errors.As(err, &ste) {
		state = ste.State
	}
	var se *client.StatusError
	switch {
	case err == nil:
		fmt.Println(op, "charged", id, "replayed:", resp.Replayed)
	case ste != nil:
		// Nothing sent: the jar holds the other run's outcome.
		fmt.Println(op, state, "by another run meanwhile; nothing sent")
	case errors.Is(err, idem.ErrPending) && (state == idem.StateDone || state == idem.StateFailed):
		// No answer this time, but the jar holds the outcome: not pending,
		// and neither Pending nor Resume will send it again.
		fmt.Println(op, state, "in an earlier run; no answer this time")
	case errors.Is(err, idem.ErrPending):
		fmt.Println(op, "outcome unknown: pending, the next run resumes it")
	case errors.As(err, &se):
		fmt.Println(op, "not charged:", se.StatusCode) // final: a 402, a 422…
	default:
		fmt.Println(op, "not charged:", err) // past the horizon, a jar error…
	}
}

// A command-line tool that must survive kill -9 (see chargeOrders). Run 1
// is cut off once the server charged order-2 and before its answer
// arrived; run 2 resumes it under its key and gets the server's replay;
// run 3, with a token the server refuses, shows a call that got no answer
// for an operation the jar holds as done, and one for a pending operation.
func Example_commandLine() {
	ctx, kill := context.WithCancel(context.Background()) // run 1's, which a kill -9 ends
	defer kill()
	var killed atomic.Bool
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	charge := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			OrderID string `json:"order_id"`
		}
		json.NewDecoder(r.Body).Decode(&in)
		if in.OrderID == "order-3" {
			http.Error(w, "card declined", http.StatusPaymentRequired)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%s"}`, in.OrderID)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk_good" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if strings.Contains(string(body), "order-2") && killed.CompareAndSwap(false, true) {
			charge.ServeHTTP(httptest.NewRecorder(), r) // charged, and the answer lost
			kill()
			<-r.Context().Done()
			return
		}
		charge.ServeHTTP(w, r)
	}))
	defer srv.Close()
	dir, err := os.MkdirTemp("", "client-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	jarPath := filepath.Join(dir, "charges.db")
	url := srv.URL + "/v1/charges"

	fmt.Println("run 1:", chargeOrders(ctx, jarPath, url, "sk_good", []string{"order-1", "order-2", "order-3"}))
	fmt.Println("run 2:", chargeOrders(context.Background(), jarPath, url, "sk_good", []string{"order-1", "order-2", "order-3"}))
	fmt.Println("run 3:", chargeOrders(context.Background(), jarPath, url, "sk_expired", []string{"order-1", "order-2", "order-3", "order-4"}))
	// Output:
	// charge:order-1 charged ch_order-1 replayed: false
	// charge:order-2 outcome unknown: pending, the next run resumes it
	// run 1: context canceled
	// charge:order-2 charged ch_order-2 replayed: true
	// charge:order-1 charged in an earlier run
	// charge:order-3 not charged: 402
	// run 2: <nil>
	// charge:order-1 charged in an earlier run
	// charge:order-2 charged in an earlier run
	// charge:order-3 done in an earlier run; no answer this time
	// charge:order-4 outcome unknown: pending, the next run resumes it
	// run 3: <nil>
}
