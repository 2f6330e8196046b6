package pgjar_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/idemkit/idem/retry"
)

// serverEnv hands the parent's test server to the worker processes.
const serverEnv = "PGJAR_TEST_SERVER"

// sharedOp is the operation both workers are asked to send.
const sharedOp = "charge:order-7"

// reportingJar is a worker's jar: it reports each Acquire that found the
// operation leased by another holder, so that the parent knows a worker
// is trying to send while the other one is sending.
type reportingJar struct{ *pgjar.Jar }

func (j reportingJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	r, err := j.Jar.Acquire(ctx, op, holder, now, ttl)
	if errors.Is(err, idem.ErrLeased) {
		fmt.Println(childPrefix + "leased")
	}
	return r, err
}

// TestTransportOneSendAtATime has two worker processes send the same named
// operation through idem.Transport, on one pgjar, to a server in the
// parent. The server holds the first request until the other worker has
// been refused the lease twice since it arrived, so that a second send
// would overlap it and show: it must see one request in flight at a time,
// both with the same key.
func TestTransportOneSendAtATime(t *testing.T) {
	if dsn, ok := pgtest.ChildDSN(); ok {
		j := worker(t, dsn)
		tr := &idem.Transport{Jar: reportingJar{j}, Policy: retry.Policy{
			InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, MaxElapsed: 30 * time.Second}}
		req, err := http.NewRequestWithContext(idem.WithOperation(t.Context(), sharedOp), http.MethodPost,
			os.Getenv(serverEnv), strings.NewReader(`{"order_id": "order-7", "amount": 1000}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Worker", os.Getenv(childEnv))
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%ssent %d %s\n", childPrefix, resp.StatusCode, resp.Header.Get("X-Key"))
		return
	}

	var (
		mu          sync.Mutex
		inFlight    int
		maxInFlight int
		keys        []string
		holdErr     error
	)
	refusals := make(chan string, 1024) // the worker refused the lease
	second := make(chan struct{})       // closed when a second request arrives
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, worker := r.Header.Get(idem.KeyHeader), r.Header.Get("X-Worker")
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		keys = append(keys, key)
		n := len(keys)
		mu.Unlock()
		if n == 2 {
			close(second)
		}
		if n == 1 {
			err := hold(worker, refusals, second)
			mu.Lock()
			holdErr = err
			mu.Unlock()
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		w.Header().Set("X-Key", key)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	t.Setenv(serverEnv, srv.URL)

	dsn := pgtest.DB(t)
	j := open(t, dsn, nil) // creates the schema before the workers start
	children := startWorkers(t, dsn, 2)
	for _, c := range children {
		if _, err := fmt.Fprintln(c.stdin, "go"); err != nil {
			t.Fatal(err)
		}
		c.stdin.Close()
	}
	reports := make([][]string, len(children))
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Go(func() {
			for line := range c.lines {
				if line == "leased" {
					select {
					case refusals <- fmt.Sprint(i):
					default: // nobody is counting any more
					}
					continue
				}
				reports[i] = append(reports[i], line)
			}
		})
	}
	wg.Wait()
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("worker %d: %v\n%s", i, err, c.output)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if holdErr != nil {
		t.Fatal(holdErr)
	}
	if maxInFlight != 1 || len(keys) != 2 || keys[0] == "" || keys[1] != keys[0] {
		t.Fatalf("server saw keys %q, at most %d in flight; want 2 requests with one key, one at a time", keys, maxInFlight)
	}
	for i, lines := range reports {
		if want := "sent 201 " + keys[0]; len(lines) != 1 || lines[0] != want {
			t.Fatalf("worker %d reported %q; want %q", i, lines, want)
		}
	}
	rec, err := j.Get(t.Context(), sharedOp)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Key != keys[0] || rec.State != idem.StateDone || rec.Attempts != 2 || rec.Holder != "" {
		t.Fatalf("record: key %q, %s, %d attempts, holder %q; want key %q, done, 2 attempts, no holder",
			rec.Key, rec.State, rec.Attempts, rec.Holder, keys[0])
	}
}

// hold keeps the first request in flight until the worker other than
// sender has been refused the lease twice since it arrived, or another
// request arrives (the overlap the test looks for), for at most 20 s.
func hold(sender string, refusals <-chan string, second <-chan struct{}) error {
drain: // the refusals from before this request
	for range cap(refusals) {
		select {
		case <-refusals:
		default:
			break drain
		}
	}
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for refused := 0; refused < 2; {
		select {
		case w := <-refusals:
			if w != sender {
				refused++
			}
		case <-second:
			return nil
		case <-timeout.C:
			return errors.New("the other worker was not refused the lease twice within 20 s of the first send")
		}
	}
	return nil
}

// TestTransportBeginCommittedAsContextEnds ends the caller's context once
// the server has committed Begin's INSERT, before its answer arrives (the
// relay holds it): pgx returns the context's error, and Begin with it,
// though the record is written. The call sends nothing, and gives back
// the lease and the attempt Begin counted, so that the record is pending,
// free and unsent; the next call of the operation sends it once, under
// the key the jar holds.
func TestTransportBeginCommittedAsContextEnds(t *testing.T) {
	relay, dsn := pgtest.NewRelay(t, pgtest.DB(t))
	j := open(t, dsn, nil)
	var sent atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("X-Key", r.Header.Get(idem.KeyHeader))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr := &idem.Transport{Jar: j}
	do := func(ctx context.Context) (*http.Response, error) {
		req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "op"), http.MethodPost, srv.URL, strings.NewReader(`{}`))
		if err != nil {
			return nil, err
		}
		return tr.RoundTrip(req)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	held, let := relay.HoldNext("INSERT")
	defer let()
	result := make(chan error, 1)
	go func() {
		resp, err := do(ctx)
		if resp != nil {
			resp.Body.Close()
		}
		result <- err
	}()
	select {
	case <-held:
	case err := <-result:
		t.Fatalf("the call returned before Begin's answer was held: %v", err)
	}
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("call whose context ended as Begin committed: %v; want context.Canceled", err)
	}
	let()
	if n := sent.Load(); n != 0 {
		t.Errorf("sent %d requests; want none", n)
	}
	rec, err := j.Get(t.Context(), "op")
	if err != nil || rec.State != idem.StatePending || rec.Holder != "" || rec.Attempts != 0 {
		t.Fatalf("record after the call = state %q, holder %q, attempts %d, %v; want pending, free, no attempt",
			rec.State, rec.Holder, rec.Attempts, err)
	}
	resp, err := do(t.Context())
	if err != nil {
		t.Fatalf("the next call: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Key") != rec.Key || sent.Load() != 1 {
		t.Errorf("the next call = %d, key %q, %d sent; want 201, the stored key %q, one sent",
			resp.StatusCode, resp.Header.Get("X-Key"), sent.Load(), rec.Key)
	}
}
