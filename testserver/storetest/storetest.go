// Package storetest is the conformance suite every testserver.Store must
// pass. A store's tests call Run with a function that returns a new, empty
// store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) testserver.Store { return open(t) })
//	}
//
// A store that has a Close method also calls RunClosed, with its ErrClosed.
// A store that several server instances may share (one database, one file)
// also calls RunFleet, with a function that opens another store on the
// same storage at each call.
//
// Run and RunClosed use only the Store interface, times on whole seconds,
// tokens that are Unix nanoseconds (about 1.7e18, beyond 2^53: a float64
// loses them) and claim IDs that are short ASCII strings, the empty one
// included, so any backend that keeps microseconds, 64-bit integers and
// text can pass them. RunFleet runs Middlewares over the stores, on
// the clock of the machine moved forward.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
)

// Racers is how many goroutines the race cases start on one key.
const Racers = 64

// base is the suite's "now"; tokens count from its Unix nanoseconds.
var base = time.Unix(1_700_000_000, 0)

// Run runs every case as a subtest, each on a new store from newStore.
func Run(t *testing.T, newStore func(t *testing.T) testserver.Store) {
	cases := []struct {
		name string
		f    func(t *testing.T, s testserver.Store)
	}{
		{"ClaimOneWinner", claimOneWinner},
		{"ClaimReturnsExisting", claimReturnsExisting},
		{"TakeOverOneWinner", takeOverOneWinner},
		{"TakeOverNeedsInFlightAndToken", takeOverNeedsInFlightAndToken},
		{"ZombieFenced", zombieFenced},
		{"FencedByClaimID", fencedByClaimID},
		{"ReleaseDeletes", releaseDeletes},
		{"ScopesIsolated", scopesIsolated},
		{"PruneOnlyDue", pruneOnlyDue},
		{"PruneLimit", pruneLimit},
		{"PruneFarCutoffs", pruneFarCutoffs},
		{"PruneKeepsLiveClaims", pruneKeepsLiveClaims},
		{"ResponseRoundTrip", responseRoundTrip},
		{"EmptyBodyReadsNil", emptyBodyReadsNil},
		{"CancelledContext", cancelledContext},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.f(t, newStore(t)) })
	}
}

// fence returns the i-th fence of a case: its token counts from base, and
// its ID is its own.
func fence(i int) testserver.Fence {
	return testserver.Fence{Token: base.UnixNano() + int64(i), ClaimID: fmt.Sprint("claim-", i)}
}

// at returns a fence with token t and an ID of its own.
func at(t int64) testserver.Fence {
	return testserver.Fence{Token: t, ClaimID: fmt.Sprint("claim-at-", t)}
}

// claim claims (scope, key) and fails the test unless it was claimed.
func claim(t *testing.T, s testserver.Store, scope, key, fp string, f testserver.Fence, now time.Time) {
	t.Helper()
	_, ok, err := s.Claim(context.Background(), scope, key, fp, f, now)
	if err != nil || !ok {
		t.Fatalf("Claim(%q, %q) = claimed %v, %v; want a new claim", scope, key, ok, err)
	}
}

// peek returns the entry for (scope, key), or false when there is none. It
// uses Claim (the interface has no read), and releases a claim it made.
func peek(t *testing.T, s testserver.Store, scope, key string) (testserver.Entry, bool) {
	t.Helper()
	probe := testserver.Fence{Token: 1 << 52, ClaimID: "peek"}
	e, claimed, err := s.Claim(context.Background(), scope, key, "peek", probe, base)
	if err != nil {
		t.Fatalf("Claim (peek %q, %q): %v", scope, key, err)
	}
	if claimed {
		if ok, err := s.Release(context.Background(), scope, key, probe); !ok || err != nil {
			t.Fatalf("Release (peek) = %v, %v; want true", ok, err)
		}
		return testserver.Entry{}, false
	}
	return e, true
}

func mustPeek(t *testing.T, s testserver.Store, scope, key string) testserver.Entry {
	t.Helper()
	e, ok := peek(t, s, scope, key)
	if !ok {
		t.Fatalf("entry (%q, %q) is gone; want it kept", scope, key)
	}
	return e
}

// race runs f(i) on Racers goroutines released together and returns the
// indexes for which f returned true.
func race(t *testing.T, f func(i int) (bool, error)) []int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int
		errs    []error
		start   = make(chan struct{})
	)
	for i := range Racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ok, err := f(i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				winners = append(winners, i)
			}
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%d of %d racers failed: %v", len(errs), Racers, err)
	}
	return winners
}

func claimOneWinner(t *testing.T, s testserver.Store) {
	var entries sync.Map
	winners := race(t, func(i int) (bool, error) {
		e, ok, err := s.Claim(context.Background(), "scope", "key", "fp", fence(i), base)
		entries.Store(i, e)
		return ok, err
	})
	if len(winners) != 1 {
		t.Fatalf("%d of %d concurrent claims won; want exactly 1", len(winners), Racers)
	}
	want := fence(winners[0])
	entries.Range(func(k, v any) bool {
		if e := v.(testserver.Entry); e.Fence != want || e.Status != testserver.StatusInFlight || e.Fingerprint != "fp" {
			t.Errorf("racer %d saw fence %+v, status %q, fingerprint %q; want the winner's %+v, in_flight, fp", k, e.Fence, e.Status, e.Fingerprint, want)
		}
		return true
	})
}

func claimReturnsExisting(t *testing.T, s testserver.Store) {
	claim(t, s, "scope", "key", "first", fence(1), base)
	e, ok, err := s.Claim(context.Background(), "scope", "key", "second", fence(2), base.Add(time.Second))
	if err != nil || ok {
		t.Fatalf("second Claim = claimed %v, %v; want the existing entry", ok, err)
	}
	if e.Scope != "scope" || e.Key != "key" || e.Fingerprint != "first" || e.Fence != fence(1) ||
		e.Status != testserver.StatusInFlight || e.Response != nil || !e.Created.Equal(base) {
		t.Fatalf("existing entry = %+v; want the first claim's fingerprint, fence, status and created time %v", e, base)
	}
	if !e.LockedAt().Equal(time.Unix(0, fence(1).Token)) {
		t.Fatalf("LockedAt = %v; want %v", e.LockedAt(), time.Unix(0, fence(1).Token))
	}
}

func takeOverOneWinner(t *testing.T, s testserver.Store) {
	claim(t, s, "scope", "key", "fp", fence(0), base)
	winners := race(t, func(i int) (bool, error) {
		return s.TakeOver(context.Background(), "scope", "key", fence(0), fence(1+i))
	})
	if len(winners) != 1 {
		t.Fatalf("%d of %d concurrent take-overs won; want exactly 1", len(winners), Racers)
	}
	if e := mustPeek(t, s, "scope", "key"); e.Fence != fence(1+winners[0]) || e.Status != testserver.StatusInFlight || e.Fingerprint != "fp" {
		t.Fatalf("after take-over: %+v; want fence %+v, in flight, fingerprint kept", e, fence(1+winners[0]))
	}
}

func takeOverNeedsInFlightAndToken(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	if ok, err := s.TakeOver(ctx, "scope", "missing", fence(0), fence(1)); ok || err != nil {
		t.Fatalf("TakeOver of a missing key = %v, %v; want false, nil", ok, err)
	}
	claim(t, s, "scope", "key", "fp", fence(0), base)
	if ok, err := s.TakeOver(ctx, "scope", "key", fence(5), fence(6)); ok || err != nil {
		t.Fatalf("TakeOver with a wrong old token = %v, %v; want false, nil", ok, err)
	}
	if err := s.Save(ctx, "scope", "key", fence(0), testserver.Response{Status: 201}); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if ok, err := s.TakeOver(ctx, "scope", "key", fence(0), fence(1)); ok || err != nil {
		t.Fatalf("TakeOver of a done key = %v, %v; want false, nil", ok, err)
	}
	if e := mustPeek(t, s, "scope", "key"); e.Status != testserver.StatusDone || e.Fence != fence(0) {
		t.Fatalf("done entry after refused take-over: %+v; want unchanged", e)
	}
}

func zombieFenced(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	zombie, owner := fence(1), fence(2)
	claim(t, s, "scope", "key", "fp", zombie, base)
	if ok, err := s.TakeOver(ctx, "scope", "key", zombie, owner); !ok || err != nil {
		t.Fatalf("TakeOver = %v, %v; want true", ok, err)
	}

	err := s.Save(ctx, "scope", "key", zombie, testserver.Response{Status: 201, Body: []byte("zombie")})
	if !errors.Is(err, testserver.ErrFenced) {
		t.Fatalf("zombie Save = %v; want ErrFenced", err)
	}
	if e := mustPeek(t, s, "scope", "key"); e.Status != testserver.StatusInFlight || e.Fence != owner || e.Response != nil {
		t.Fatalf("after fenced Save: %+v; want in flight under the owner's token, no response", e)
	}
	if ok, err := s.Release(ctx, "scope", "key", zombie); ok || err != nil {
		t.Fatalf("zombie Release = %v, %v; want false, nil", ok, err)
	}
	mustPeek(t, s, "scope", "key")

	want := testserver.Response{Status: 201, Body: []byte("owner")}
	if err := s.Save(ctx, "scope", "key", owner, want); err != nil {
		t.Fatalf("owner Save: %v", err)
	}
	// Once done, nobody can write: not the zombie, not the owner again.
	for _, f := range []testserver.Fence{zombie, owner} {
		if err := s.Save(ctx, "scope", "key", f, testserver.Response{Status: 500}); !errors.Is(err, testserver.ErrFenced) {
			t.Fatalf("Save(%+v) on a done entry = %v; want ErrFenced", f, err)
		}
		if ok, err := s.Release(ctx, "scope", "key", f); ok || err != nil {
			t.Fatalf("Release(%+v) on a done entry = %v, %v; want false, nil", f, ok, err)
		}
	}
	e := mustPeek(t, s, "scope", "key")
	if e.Status != testserver.StatusDone || e.Response == nil || e.Response.Status != 201 || string(e.Response.Body) != "owner" {
		t.Fatalf("final entry: %+v; want done with the owner's 201 \"owner\"", e)
	}
}

// fencedByClaimID: a claim whose token is the holder's but whose ID is
// another (a duplicate on a server whose clock read the same, releasing
// the claim it may have made) neither releases, saves nor takes over the
// holder's claim. The empty ID, of a claim an earlier version of a store
// made, fences as any other.
func fencedByClaimID(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	holder := fence(1)
	claim(t, s, "scope", "key", "fp", holder, base)
	for _, other := range []testserver.Fence{{Token: holder.Token, ClaimID: "another"}, {Token: holder.Token}} {
		if e, ok, err := s.Claim(ctx, "scope", "key", "fp", other, base); err != nil || ok || e.Fence != holder {
			t.Fatalf("Claim(%+v) = %+v, claimed %v, %v; want the holder's entry", other, e, ok, err)
		}
		if ok, err := s.Release(ctx, "scope", "key", other); ok || err != nil {
			t.Fatalf("Release(%+v) = %v, %v; want false, nil", other, ok, err)
		}
		if err := s.Save(ctx, "scope", "key", other, testserver.Response{Status: 201}); !errors.Is(err, testserver.ErrFenced) {
			t.Fatalf("Save(%+v) = %v; want ErrFenced", other, err)
		}
		if ok, err := s.TakeOver(ctx, "scope", "key", other, fence(2)); ok || err != nil {
			t.Fatalf("TakeOver(%+v) = %v, %v; want false, nil", other, ok, err)
		}
	}
	if e := mustPeek(t, s, "scope", "key"); e.Status != testserver.StatusInFlight || e.Fence != holder || e.Response != nil {
		t.Fatalf("after the writes of other claims: %+v; want the holder's claim in flight", e)
	}
	if ok, err := s.Release(ctx, "scope", "key", holder); !ok || err != nil {
		t.Fatalf("Release by the holder = %v, %v; want true", ok, err)
	}

	unnamed := testserver.Fence{Token: holder.Token}
	claim(t, s, "scope", "unnamed", "fp", unnamed, base)
	if ok, err := s.TakeOver(ctx, "scope", "unnamed", unnamed, fence(2)); !ok || err != nil {
		t.Fatalf("TakeOver of a claim with the empty ID = %v, %v; want true", ok, err)
	}
	if err := s.Save(ctx, "scope", "unnamed", fence(2), testserver.Response{Status: 201}); err != nil {
		t.Fatalf("Save after the take-over: %v", err)
	}
	if e := mustPeek(t, s, "scope", "unnamed"); e.Status != testserver.StatusDone || e.Fence != fence(2) {
		t.Fatalf("entry taken over from the empty ID and saved: %+v; want done under %+v", e, fence(2))
	}
}

func releaseDeletes(t *testing.T, s testserver.Store) {
	claim(t, s, "scope", "key", "fp", fence(1), base)
	if ok, err := s.Release(context.Background(), "scope", "key", fence(1)); !ok || err != nil {
		t.Fatalf("Release by the holder = %v, %v; want true", ok, err)
	}
	if _, ok := peek(t, s, "scope", "key"); ok {
		t.Fatal("entry still there after Release; want it deleted")
	}
	claim(t, s, "scope", "key", "other", fence(2), base) // the key is free again
}

func scopesIsolated(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	claim(t, s, "tenant-a", "key", "fp-a", fence(1), base)
	claim(t, s, "tenant-b", "key", "fp-b", fence(2), base)
	if err := s.Save(ctx, "tenant-a", "key", fence(1), testserver.Response{Status: 201, Body: []byte("a")}); err != nil {
		t.Fatalf("Save in tenant-a: %v", err)
	}
	// tenant-a's token means nothing in tenant-b.
	if err := s.Save(ctx, "tenant-b", "key", fence(1), testserver.Response{Status: 201}); !errors.Is(err, testserver.ErrFenced) {
		t.Fatalf("Save in tenant-b with tenant-a's token = %v; want ErrFenced", err)
	}
	if ok, err := s.Release(ctx, "tenant-b", "key", fence(1)); ok || err != nil {
		t.Fatalf("Release in tenant-b with tenant-a's token = %v, %v; want false", ok, err)
	}
	if ok, err := s.TakeOver(ctx, "tenant-b", "key", fence(1), fence(3)); ok || err != nil {
		t.Fatalf("TakeOver in tenant-b with tenant-a's token = %v, %v; want false", ok, err)
	}
	if b := mustPeek(t, s, "tenant-b", "key"); b.Status != testserver.StatusInFlight || b.Fingerprint != "fp-b" || b.Fence != fence(2) || b.Response != nil {
		t.Fatalf("tenant-b entry: %+v; want its own in-flight claim", b)
	}
	if a := mustPeek(t, s, "tenant-a", "key"); a.Status != testserver.StatusDone || string(a.Response.Body) != "a" {
		t.Fatalf("tenant-a entry: %+v; want done with \"a\"", a)
	}
	if _, ok := peek(t, s, "", "key"); ok {
		t.Fatal("the anonymous scope sees a tenant's key")
	}
}

func pruneOnlyDue(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	ages := []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour, 0}
	for i, age := range ages {
		claim(t, s, "scope", fmt.Sprint("k", i), "fp", at(base.Add(-age).UnixNano()), base.Add(-age))
	}
	// k0 is done, k1 abandoned in flight: both due.
	if err := s.Save(ctx, "scope", "k0", at(base.Add(-ages[0]).UnixNano()), testserver.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	cutoff := base.Add(-time.Hour) // k2 was created exactly at the cutoff: not due
	for i, want := range []int{1, 1, 0} {
		n, err := s.Prune(ctx, cutoff, 1)
		if err != nil || n != want {
			t.Fatalf("Prune #%d = %d, %v; want %d", i+1, n, err, want)
		}
	}
	for i := range ages {
		_, ok := peek(t, s, "scope", fmt.Sprint("k", i))
		if due := i < 2; ok == due {
			t.Errorf("k%d (created %v before now): present %v after Prune; want %v", i, ages[i], ok, !due)
		}
	}
}

func pruneLimit(t *testing.T, s testserver.Store) {
	for i := range 10 {
		claim(t, s, "scope", fmt.Sprint("k", i), "fp", at(base.Add(-48*time.Hour).UnixNano()+int64(i)), base.Add(-48*time.Hour))
	}
	// A limit of 0 or less deletes nothing (unlike a jar's Prune).
	for _, limit := range []int{0, -1} {
		if n, err := s.Prune(context.Background(), base, limit); err != nil || n != 0 {
			t.Fatalf("Prune(limit %d) = %d, %v; want 0", limit, n, err)
		}
	}
	n, err := s.Prune(context.Background(), base, 3)
	if err != nil || n != 3 {
		t.Fatalf("Prune(limit 3) = %d, %v; want 3", n, err)
	}
	n, err = s.Prune(context.Background(), base, 100)
	if err != nil || n != 7 {
		t.Fatalf("Prune(limit 100) = %d, %v; want the 7 left", n, err)
	}
}

// pruneFarCutoffs prunes with cutoffs that Unix nanoseconds in an int64
// cannot hold (before 1678, after 2262), and entries created, or claimed,
// at the first and the last nanosecond they hold: nothing was created
// before the first cutoffs, everything before the last.
func pruneFarCutoffs(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	first, last := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	claim(t, s, "scope", "key", "fp", fence(0), base)
	if err := s.Save(ctx, "scope", "key", fence(0), testserver.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	claim(t, s, "scope", "first", "fp", at(math.MinInt64), first) // abandoned in flight
	claim(t, s, "scope", "last", "fp", fence(1), last)
	if err := s.Save(ctx, "scope", "last", fence(1), testserver.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	claim(t, s, "scope", "last-token", "fp", at(math.MaxInt64), base) // claimed at the last nanosecond
	for _, c := range []struct {
		before time.Time
		want   int
	}{
		{time.Time{}.Add(-time.Hour), 0},
		{time.Time{}, 0},
		{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{first, 0},
		{first.Add(time.Nanosecond), 1}, // first
		{base, 0},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), 3}, // key, last, last-token
	} {
		if n, err := s.Prune(ctx, c.before, 10); err != nil || n != c.want {
			t.Fatalf("Prune(before %v) = %d, %v; want %d", c.before, n, err, c.want)
		}
	}
}

// pruneKeepsLiveClaims: a claim created long ago but taken over within the
// retention is in use. Pruning it would let the next request claim the key
// afresh and run the operation again while its holder still runs it.
func pruneKeepsLiveClaims(t *testing.T, s testserver.Store) {
	ctx := context.Background()
	old := base.Add(-48 * time.Hour)
	claim(t, s, "scope", "live", "fp", at(old.UnixNano()), old)
	if ok, err := s.TakeOver(ctx, "scope", "live", at(old.UnixNano()), at(base.UnixNano())); !ok || err != nil {
		t.Fatalf("TakeOver = %v, %v; want true", ok, err)
	}
	claim(t, s, "scope", "abandoned", "fp", at(old.UnixNano()+1), old)
	if n, err := s.Prune(ctx, base.Add(-24*time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1, the abandoned claim", n, err)
	}
	if _, ok := peek(t, s, "scope", "abandoned"); ok {
		t.Error("the claim abandoned 48 h ago survived Prune")
	}
	if e := mustPeek(t, s, "scope", "live"); e.Status != testserver.StatusInFlight || e.Fence != at(base.UnixNano()) {
		t.Fatalf("claim taken over now: %+v after Prune; want it in flight under token %d", e, base.UnixNano())
	}
	if err := s.Save(ctx, "scope", "live", at(base.UnixNano()), testserver.Response{Status: 201}); err != nil {
		t.Fatalf("holder's Save after Prune: %v; want it saved", err)
	}
}

func responseRoundTrip(t *testing.T, s testserver.Store) {
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', '"', '\\', 0}
	cases := []struct {
		name string
		resp testserver.Response
	}{
		{"headers and binary body", testserver.Response{Status: 201, Body: binary, Header: http.Header{
			"Content-Type": {"application/json; charset=utf-8"},
			"Link":         {"<https://a.example/1>; rel=next", "<https://a.example/0>; rel=prev"},
			"Etag":         {`"v1"`},
		}}},
		{"header bytes that are not UTF-8", testserver.Response{Status: 201, Body: []byte("ok"), Header: http.Header{
			"Etag":     {"\"caf\xe9\""}, // Latin-1: HTTP's obs-text
			"Location": {"/files/r\xe9sum\xe9.pdf"},
		}}},
		{"empty body", testserver.Response{Status: 204, Body: []byte{}, Header: http.Header{}}},
		{"nil body and header", testserver.Response{Status: 500}},
		{"large body", testserver.Response{Status: 200, Body: bytes.Repeat([]byte("0123456789"), 100_000)}},
	}
	for i, c := range cases {
		key := fmt.Sprint("k", i)
		claim(t, s, "scope", key, "fp", fence(i), base)
		if err := s.Save(context.Background(), "scope", key, fence(i), c.resp); err != nil {
			t.Fatalf("%s: Save: %v", c.name, err)
		}
		got := mustPeek(t, s, "scope", key).Response
		switch {
		case got == nil:
			t.Errorf("%s: no response read back", c.name)
		case got.Status != c.resp.Status:
			t.Errorf("%s: status %d; want %d", c.name, got.Status, c.resp.Status)
		case !bytes.Equal(got.Body, c.resp.Body):
			t.Errorf("%s: body %d bytes %q…; want %d bytes", c.name, len(got.Body), got.Body[:min(len(got.Body), 16)], len(c.resp.Body))
		case len(c.resp.Header) == 0 && len(got.Header) != 0:
			t.Errorf("%s: header %v; want none", c.name, got.Header)
		case len(c.resp.Header) != 0 && !reflect.DeepEqual(got.Header, c.resp.Header):
			t.Errorf("%s: header %v; want %v", c.name, got.Header, c.resp.Header)
		}
	}
}

// emptyBodyReadsNil: a response saved with no body, nil or empty, reads
// back with a nil Body, whatever the backend keeps.
func emptyBodyReadsNil(t *testing.T, s testserver.Store) {
	for i, body := range [][]byte{nil, {}} {
		key := fmt.Sprint("k", i)
		claim(t, s, "scope", key, "fp", fence(i), base)
		if err := s.Save(context.Background(), "scope", key, fence(i), testserver.Response{Status: 204, Body: body}); err != nil {
			t.Fatalf("Save (body %#v): %v", body, err)
		}
		if got := mustPeek(t, s, "scope", key).Response; got == nil || got.Status != 204 || got.Body != nil {
			t.Errorf("saved with body %#v, read back %+v; want status 204 and a nil body", body, got)
		}
	}
}

func cancelledContext(t *testing.T, s testserver.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok, err := s.Claim(ctx, "scope", "key", "fp", fence(1), base); err == nil || ok {
		t.Fatalf("Claim with a cancelled context = claimed %v, %v; want an error", ok, err)
	}
	if _, ok := peek(t, s, "scope", "key"); ok {
		t.Fatal("a Claim that failed left an entry behind")
	}
}
