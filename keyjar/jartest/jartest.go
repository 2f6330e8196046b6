// Package jartest is the conformance suite that every idem.Jar with the
// operator methods (List, Forget, Prune) must pass: idem.MemoryJar,
// *keyjar.Jar and the PostgreSQL jar run the same cases.
//
//	func TestJar(t *testing.T) {
//		jartest.Run(t, func(t *testing.T) jartest.Jar {
//			j, err := keyjar.Open(t.Context(), filepath.Join(t.TempDir(), "keys.db"), nil)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { j.Close() })
//			return j
//		})
//	}
//
// Time is a parameter of the Jar methods, so no case sleeps.
package jartest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Jar is what the suite tests: an idem.Jar with the methods an operator
// uses to inspect and clean it, with the semantics of idem.MemoryJar.
type Jar interface {
	idem.Jar
	// List returns the records that pass f (its State, After and Limit),
	// oldest Created first, then by Op.
	List(ctx context.Context, f idem.Filter) ([]idem.Record, error)
	// Forget deletes op whatever its state, or returns idem.ErrNotFound.
	Forget(ctx context.Context, op string) error
	// Prune deletes at most limit (<= 0: no limit) records whose state is
	// idem.Prunable and whose Updated is before before, and returns how many.
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// Run runs every case against jars made by open. open is called once per
// case and must return a new, empty jar; it should close it with t.Cleanup.
func Run(t *testing.T, open func(t *testing.T) Jar) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, open(t))
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, j Jar)
}{
	{"BeginCreates", testBeginCreates},
	{"BeginReturnsExisting", testBeginReturnsExisting},
	{"BeginConcurrent", testBeginConcurrent},
	{"BeginReplacesAbandoned", testBeginReplacesAbandoned},
	{"BeginEmptyState", testBeginEmptyState},
	{"Invalid", testInvalid},
	{"AcquireLease", testAcquireLease},
	{"UpdateFenced", testUpdateFenced},
	{"UpdateUnfenced", testUpdateUnfenced},
	{"NotFound", testNotFound},
	{"List", testList},
	{"ListPages", testListPages},
	{"ListPagesDeleted", testListPagesDeleted},
	{"ListAfter", testListAfter},
	{"ListAfterFarTimes", testListAfterFarTimes},
	{"ByKey", testByKey},
	{"Forget", testForget},
	{"ForgetKey", testForgetKey},
	{"ForgetKeyRacingBegin", testForgetKeyRacingBegin},
	{"AbandonKey", testAbandonKey},
	{"Prune", testPrune},
	{"PruneLimit", testPruneLimit},
	{"PruneFarTimes", testPruneFarTimes},
	{"SecretHeaders", testSecretHeaders},
	{"RoundTrip", testRoundTrip},
	{"Times", testTimes},
	{"NoAliasing", testNoAliasing},
	{"CancelledContext", testCancelledContext},
	{"Sequences", testSequences},
}

// t0 has nanoseconds, so a jar that rounds times fails.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// record returns a pending record for op created at t0.
func record(op string) idem.Record {
	body := []byte(`{"amount":42,"currency":"EUR"}`)
	return idem.Record{
		Op:          op,
		Key:         "key-" + op,
		Fingerprint: "fp-" + op,
		State:       idem.StatePending,
		Method:      http.MethodPost,
		URL:         "https://api.example.com/v1/charges?order=" + op,
		Header:      http.Header{"Content-Type": {"application/json"}, "X-Request-Tag": {"a", "b"}},
		Body:        body,
		BodySize:    int64(len(body)),
		Created:     t0,
		Updated:     t0,
	}
}

func begin(t *testing.T, j Jar, r idem.Record) idem.Record {
	t.Helper()
	got, created, err := j.Begin(t.Context(), r)
	if err != nil {
		t.Fatalf("Begin(%q): %v", r.Op, err)
	}
	if !created {
		t.Fatalf("Begin(%q): created = false; want true", r.Op)
	}
	return got
}

func get(t *testing.T, j Jar, op string) idem.Record {
	t.Helper()
	r, err := j.Get(t.Context(), op)
	if err != nil {
		t.Fatalf("Get(%q): %v", op, err)
	}
	return r
}

func update(t *testing.T, j Jar, op, holder string, c idem.Change) idem.Record {
	t.Helper()
	r, err := j.Update(t.Context(), op, holder, c)
	if err != nil {
		t.Fatalf("Update(%q, %q): %v", op, holder, err)
	}
	return r
}

// diff describes how got differs from want, or returns "". Times are
// compared with Equal; a nil and an empty Header are the same, a nil and an
// empty Body are not.
func diff(got, want idem.Record) string {
	var d []string
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"Op", got.Op, want.Op},
		{"Key", got.Key, want.Key},
		{"Fingerprint", got.Fingerprint, want.Fingerprint},
		{"State", got.State, want.State},
		{"Method", got.Method, want.Method},
		{"URL", got.URL, want.URL},
		{"BodySize", got.BodySize, want.BodySize},
		{"Attempts", got.Attempts, want.Attempts},
		{"LastStatus", got.LastStatus, want.LastStatus},
		{"LastError", got.LastError, want.LastError},
		{"Note", got.Note, want.Note},
		{"Holder", got.Holder, want.Holder},
	} {
		if f.got != f.want {
			d = append(d, fmt.Sprintf("%s = %#v; want %#v", f.name, f.got, f.want))
		}
	}
	if !(len(got.Header) == 0 && len(want.Header) == 0) && !headerEqual(got.Header, want.Header) {
		d = append(d, fmt.Sprintf("Header = %v; want %v", got.Header, want.Header))
	}
	if (got.Body == nil) != (want.Body == nil) || !bytes.Equal(got.Body, want.Body) {
		d = append(d, fmt.Sprintf("Body = %#v; want %#v", got.Body, want.Body))
	}
	for _, f := range []struct {
		name      string
		got, want time.Time
	}{
		{"Created", got.Created, want.Created},
		{"Updated", got.Updated, want.Updated},
		{"NextAttempt", got.NextAttempt, want.NextAttempt},
		{"LeaseUntil", got.LeaseUntil, want.LeaseUntil},
	} {
		if !f.got.Equal(f.want) {
			d = append(d, fmt.Sprintf("%s = %s; want %s", f.name, f.got.Format(time.RFC3339Nano), f.want.Format(time.RFC3339Nano)))
		}
	}
	if len(d) == 0 {
		return ""
	}
	return fmt.Sprint(d)
}

func headerEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || !slices.Equal(va, vb) {
			return false
		}
	}
	return true
}

func expect(t *testing.T, what string, got, want idem.Record) {
	t.Helper()
	if d := diff(got, want); d != "" {
		t.Errorf("%s: %s", what, d)
	}
}

func testBeginCreates(t *testing.T, j Jar) {
	want := record("charge:1")
	got := begin(t, j, want)
	expect(t, "Begin", got, want)
	expect(t, "Get after Begin", get(t, j, want.Op), want)
}

func testBeginReturnsExisting(t *testing.T, j Jar) {
	first := begin(t, j, record("op"))
	leased, err := j.Acquire(t.Context(), "op", "worker-1", t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := update(t, j, "op", "worker-1", idem.Change{Now: t0.Add(time.Second), Attempts: 1, LastStatus: 503})
	if want.Key != first.Key || want.Holder != leased.Holder {
		t.Fatalf("setup: got %+v", want)
	}
	for _, s := range []idem.State{idem.StatePending, idem.StateDone, idem.StateFailed, idem.StateReconcile} {
		if s != idem.StatePending {
			want = update(t, j, "op", "", idem.Change{Now: t0.Add(2 * time.Second), State: s, Attempts: 0, LastStatus: 201})
		}
		other := record("op")
		other.Key, other.Fingerprint, other.Body, other.BodySize = "another-key", "another-fp", []byte("x"), 1
		got, created, err := j.Begin(t.Context(), other)
		if err != nil {
			t.Fatalf("Begin over %s: %v", s, err)
		}
		if created {
			t.Errorf("Begin over %s: created = true; want false", s)
		}
		expect(t, "Begin over "+string(s), got, want)
		expect(t, "Get after Begin over "+string(s), get(t, j, "op"), want)
	}
}

func testBeginConcurrent(t *testing.T, j Jar) {
	const n = 64
	type result struct {
		rec     idem.Record
		created bool
		err     error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := record("charge:race")
			r.Key = fmt.Sprintf("key-%d", i)
			<-start
			rec, created, err := j.Begin(t.Context(), r)
			results[i] = result{rec, created, err}
		})
	}
	close(start)
	wg.Wait()
	createdN := 0
	keys := map[string]int{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("Begin %d: %v", i, r.err)
		}
		if r.created {
			createdN++
		}
		keys[r.rec.Key]++
	}
	if createdN != 1 || len(keys) != 1 {
		t.Fatalf("%d concurrent Begins: %d created, keys %v; want 1 created and one key", n, createdN, keys)
	}
	if stored := get(t, j, "charge:race").Key; keys[stored] != n {
		t.Errorf("stored key %q; every Begin returned %v", stored, keys)
	}
}

func testBeginReplacesAbandoned(t *testing.T, j Jar) {
	begin(t, j, record("op"))
	if _, err := j.Acquire(t.Context(), "op", "worker-1", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	update(t, j, "op", "worker-1", idem.Change{Now: t0.Add(time.Second), State: idem.StateAbandoned,
		Attempts: 3, LastStatus: 503, Note: "did not happen", Release: true})

	// Many callers race to replace it: one wins, all see the new key.
	const n = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		keys    = map[string]bool{}
	)
	for i := range n {
		wg.Go(func() {
			r := record("op")
			r.Key, r.Fingerprint = fmt.Sprintf("new-key-%d", i), "new-fp"
			r.Created, r.Updated = t0.Add(time.Hour), t0.Add(time.Hour)
			rec, c, err := j.Begin(t.Context(), r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Begin: %v", err)
				return
			}
			if c {
				created++
			}
			keys[rec.Key] = true
		})
	}
	wg.Wait()
	if created != 1 || len(keys) != 1 {
		t.Fatalf("Begin over abandoned: %d created, keys %v; want 1 created and one key", created, keys)
	}
	got := get(t, j, "op")
	want := record("op")
	want.Key, want.Fingerprint = got.Key, "new-fp"
	want.Created, want.Updated = t0.Add(time.Hour), t0.Add(time.Hour)
	if !keys[got.Key] {
		t.Errorf("stored key %q; Begin returned %v", got.Key, keys)
	}
	expect(t, "replaced record", got, want)
}

func testBeginEmptyState(t *testing.T, j Jar) {
	r := record("op")
	r.State = ""
	want := record("op") // StatePending
	expect(t, "Begin with an empty State", begin(t, j, r), want)
	expect(t, "Get after Begin with an empty State", get(t, j, "op"), want)
}

// testInvalid: Begin refuses a record without Op or Key or with a State
// that is not valid, and Update and Defer a Change with a State that is not
// valid. Each jar refuses with its own error (idem.ErrInvalidRecord,
// keyjar.ErrInvalid, pgjar.ErrInvalid); the suite asks for an error and
// that nothing changed.
func testInvalid(t *testing.T, j Jar) {
	ctx := t.Context()
	begin(t, j, record("op"))
	want, err := j.Acquire(ctx, "op", "a", t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	begin(t, j, record("gone"))
	abandoned := update(t, j, "gone", "", idem.Change{Now: t0.Add(time.Second), State: idem.StateAbandoned})
	for _, c := range []struct {
		name string
		edit func(r *idem.Record)
	}{
		{"no Op", func(r *idem.Record) { r.Op = "" }},
		{"no Key", func(r *idem.Record) { r.Key = "" }},
		{"invalid State", func(r *idem.Record) { r.State = "bogus" }},
		{"no Key, over an existing op", func(r *idem.Record) { r.Op, r.Key = "op", "" }},
		{"invalid State, over an existing op", func(r *idem.Record) { r.Op, r.State = "op", "bogus" }},
		{"no Key, over an abandoned op", func(r *idem.Record) { r.Op, r.Key = "gone", "" }},
		{"invalid State, over an abandoned op", func(r *idem.Record) { r.Op, r.State = "gone", "Pending" }},
	} {
		r := record("new")
		c.edit(&r)
		if _, created, err := j.Begin(ctx, r); err == nil || created {
			t.Errorf("Begin with %s: created %v, err %v; want an error", c.name, created, err)
		}
	}
	for _, holder := range []string{"", "a"} {
		if _, err := j.Update(ctx, "op", holder, idem.Change{Now: t0.Add(time.Minute), State: "bogus", Attempts: 1}); err == nil {
			t.Errorf("Update(holder %q) with an invalid State: err = nil; want an error", holder)
		}
	}
	if d, ok := j.(idem.Deferrer); ok {
		for _, op := range []string{"op", "unknown"} {
			if err := d.Defer(op, "", idem.Change{Now: t0.Add(time.Minute), State: "bogus", Attempts: 1}); err == nil {
				t.Errorf("Defer(%q) with an invalid State: err = nil; want an error", op)
			}
		}
	}
	for _, s := range []idem.State{"bogus", "Pending", "pending\x00"} {
		if list, err := j.List(ctx, idem.Filter{State: s}); err == nil {
			t.Errorf("List with the State %q: %d records, err = nil; want an error", s, len(list))
		}
	}
	// Nothing changed.
	all, err := j.List(ctx, idem.Filter{})
	if err != nil || !slices.Equal(ops(all), []string{"gone", "op"}) {
		t.Fatalf("List after refused calls = %v, %v; want [gone op]", ops(all), err)
	}
	expect(t, "after refused calls", get(t, j, "op"), want)
	expect(t, "abandoned op after refused calls", get(t, j, "gone"), abandoned)
}

func testAcquireLease(t *testing.T, j Jar) {
	ctx := t.Context()
	begin(t, j, record("op"))
	ttl := 30 * time.Second

	r, err := j.Acquire(ctx, "op", "a", t0, ttl)
	if err != nil || r.Holder != "a" || !r.LeaseUntil.Equal(t0.Add(ttl)) {
		t.Fatalf("Acquire free = %q until %v, %v; want a until %v", r.Holder, r.LeaseUntil, err, t0.Add(ttl))
	}
	// The holder renews its own lease.
	r, err = j.Acquire(ctx, "op", "a", t0.Add(10*time.Second), ttl)
	if err != nil || r.Holder != "a" || !r.LeaseUntil.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("Acquire own = %q until %v, %v; want a until %v", r.Holder, r.LeaseUntil, err, t0.Add(40*time.Second))
	}
	// Another holder is refused until the lease ends, and sees the holder.
	r, err = j.Acquire(ctx, "op", "b", t0.Add(40*time.Second-time.Nanosecond), ttl)
	if !errors.Is(err, idem.ErrLeased) {
		t.Fatalf("Acquire held: err = %v; want ErrLeased", err)
	}
	if r.Holder != "a" || r.Op != "op" {
		t.Errorf("Acquire held returned holder %q op %q; want a, op", r.Holder, r.Op)
	}
	if g := get(t, j, "op"); g.Holder != "a" || !g.LeaseUntil.Equal(t0.Add(40*time.Second)) {
		t.Errorf("after refused Acquire: holder %q until %v; want a until %v", g.Holder, g.LeaseUntil, t0.Add(40*time.Second))
	}
	// At the end of the lease it is expired: b takes it over.
	r, err = j.Acquire(ctx, "op", "b", t0.Add(40*time.Second), ttl)
	if err != nil || r.Holder != "b" || !r.LeaseUntil.Equal(t0.Add(70*time.Second)) {
		t.Fatalf("Acquire expired = %q until %v, %v; want b until %v", r.Holder, r.LeaseUntil, err, t0.Add(70*time.Second))
	}
	// Released, it is free for anyone at any time.
	update(t, j, "op", "b", idem.Change{Now: t0.Add(41 * time.Second), Release: true})
	r, err = j.Acquire(ctx, "op", "c", t0.Add(42*time.Second), ttl)
	if err != nil || r.Holder != "c" {
		t.Fatalf("Acquire released = %q, %v; want c", r.Holder, err)
	}
	want := record("op")
	want.Updated, want.Holder, want.LeaseUntil = t0.Add(41*time.Second), "c", t0.Add(72*time.Second)
	expect(t, "after leases", get(t, j, "op"), want)
}

func testUpdateFenced(t *testing.T, j Jar) {
	ctx := t.Context()
	begin(t, j, record("op"))
	if _, err := j.Acquire(ctx, "op", "a", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	want := update(t, j, "op", "a", idem.Change{Now: t0.Add(time.Second), Attempts: 1, LastStatus: 503,
		LastError: "unavailable", NextAttempt: t0.Add(5 * time.Second), Note: "retrying"})
	// b takes the expired lease over; a's late write is refused.
	want2, err := j.Acquire(ctx, "op", "b", t0.Add(time.Minute), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want.Holder, want.LeaseUntil = want2.Holder, want2.LeaseUntil
	r, err := j.Update(ctx, "op", "a", idem.Change{Now: t0.Add(2 * time.Minute), State: idem.StateDone,
		Attempts: 1, LastStatus: 201, Release: true})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Update by the old holder: err = %v; want ErrLeaseLost", err)
	}
	if r.Holder != "b" {
		t.Errorf("Update by the old holder returned holder %q; want b", r.Holder)
	}
	expect(t, "after a lost Update", get(t, j, "op"), want)

	// The new holder's change applies: attempts add up, NextAttempt and the
	// last status and error are replaced, an empty Note keeps the note.
	got := update(t, j, "op", "b", idem.Change{Now: t0.Add(2 * time.Minute), State: idem.StateDone,
		Attempts: 2, LastStatus: 201, Release: true})
	want.State, want.Updated, want.Attempts, want.LastStatus, want.LastError = idem.StateDone, t0.Add(2*time.Minute), 3, 201, ""
	want.NextAttempt, want.Holder, want.LeaseUntil = time.Time{}, "", time.Time{}
	expect(t, "Update by the holder", got, want)
	expect(t, "Get after Update", get(t, j, "op"), want)
}

func testUpdateUnfenced(t *testing.T, j Jar) {
	begin(t, j, record("op"))
	if _, err := j.Acquire(t.Context(), "op", "a", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	// holder "" applies whoever holds the lease, and keeps the lease unless
	// told to release it; an empty State keeps the state.
	got := update(t, j, "op", "", idem.Change{Now: t0.Add(time.Second), Attempts: 2, Note: "operator"})
	want := record("op")
	want.Updated, want.Attempts, want.Note, want.Holder, want.LeaseUntil = t0.Add(time.Second), 2, "operator", "a", t0.Add(time.Minute)
	expect(t, "unfenced Update", got, want)
	got = update(t, j, "op", "", idem.Change{Now: t0.Add(2 * time.Second), State: idem.StateReconcile, Release: true})
	want.Updated, want.State, want.Holder, want.LeaseUntil = t0.Add(2*time.Second), idem.StateReconcile, "", time.Time{}
	expect(t, "unfenced Update with Release", got, want)
	expect(t, "Get after unfenced Update", get(t, j, "op"), want)
}

func testNotFound(t *testing.T, j Jar) {
	ctx := t.Context()
	begin(t, j, record("known"))
	if _, err := j.Get(ctx, "unknown"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get: err = %v; want ErrNotFound", err)
	}
	if _, err := j.Acquire(ctx, "unknown", "a", t0, time.Minute); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Acquire: err = %v; want ErrNotFound", err)
	}
	if _, err := j.Update(ctx, "unknown", "", idem.Change{Now: t0}); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Update: err = %v; want ErrNotFound", err)
	}
	if _, err := j.Update(ctx, "unknown", "a", idem.Change{Now: t0}); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("fenced Update: err = %v; want ErrNotFound", err)
	}
	if err := j.Forget(ctx, "unknown"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Forget: err = %v; want ErrNotFound", err)
	}
	// None of them created anything.
	all, err := j.List(ctx, idem.Filter{})
	if err != nil || len(all) != 1 || all[0].Op != "known" {
		t.Errorf("List after unknown ops = %v, %v; want only known", ops(all), err)
	}
}

func ops(rs []idem.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Op
	}
	return out
}

func testList(t *testing.T, j Jar) {
	ctx := t.Context()
	if all, err := j.List(ctx, idem.Filter{}); err != nil || len(all) != 0 {
		t.Fatalf("List of an empty jar = %v, %v; want none", ops(all), err)
	}
	// Created out of insertion order, with ties broken by Op, and a zero
	// Created first.
	for _, c := range []struct {
		op      string
		created time.Time
		state   idem.State
	}{
		{"d", t0.Add(2 * time.Second), idem.StatePending},
		{"b", t0.Add(time.Second), idem.StateDone},
		{"c", t0.Add(time.Second), idem.StatePending},
		{"a", t0.Add(3 * time.Second), idem.StateDone},
		{"e", t0.Add(time.Nanosecond), idem.StateFailed},
		{"z", time.Time{}, idem.StatePending},
	} {
		r := record(c.op)
		r.Created, r.State = c.created, c.state
		begin(t, j, r)
	}
	for _, c := range []struct {
		f    idem.Filter
		want []string
	}{
		{idem.Filter{}, []string{"z", "e", "b", "c", "d", "a"}},
		{idem.Filter{Limit: 3}, []string{"z", "e", "b"}},
		{idem.Filter{Limit: 100}, []string{"z", "e", "b", "c", "d", "a"}},
		{idem.Filter{Limit: -1}, []string{"z", "e", "b", "c", "d", "a"}}, // no limit, as 0
		{idem.Filter{State: idem.StatePending}, []string{"z", "c", "d"}},
		{idem.Filter{State: idem.StateDone, Limit: 1}, []string{"b"}},
		{idem.Filter{State: idem.StateReconcile}, []string{}},
	} {
		got, err := j.List(ctx, c.f)
		if err != nil {
			t.Fatalf("List(%+v): %v", c.f, err)
		}
		if !slices.Equal(ops(got), c.want) {
			t.Errorf("List(%+v) = %v; want %v", c.f, ops(got), c.want)
		}
	}
	all, err := j.List(ctx, idem.Filter{State: idem.StateFailed})
	if err != nil || len(all) != 1 {
		t.Fatalf("List failed = %v, %v", ops(all), err)
	}
	want := record("e")
	want.Created, want.State = t0.Add(time.Nanosecond), idem.StateFailed
	expect(t, "listed record", all[0], want)
}

// pageSet begins records of which several share a Created time, in two
// states, with one created at the zero time, and returns their names in
// List's order.
func pageSet(t *testing.T, j Jar) []string {
	for _, c := range []struct {
		op      string
		created time.Time
		state   idem.State
	}{
		{"c", t0, idem.StatePending},
		{"a", t0, idem.StateDone},
		{"d", t0, idem.StatePending},
		{"b", t0, idem.StatePending},
		{"e", t0.Add(time.Nanosecond), idem.StateDone},
		{"aa", t0.Add(time.Nanosecond), idem.StatePending},
		{"f", t0.Add(-time.Nanosecond), idem.StatePending},
		{"z", time.Time{}, idem.StatePending},
		{"g", t0.Add(time.Hour), idem.StateDone},
	} {
		r := record(c.op)
		r.Created, r.State = c.created, c.state
		begin(t, j, r)
	}
	return []string{"z", "f", "a", "b", "c", "d", "aa", "e", "g"}
}

// walk lists the records that pass f in pages of f.Limit, each page after
// the last record of the one before, and returns their names. It calls
// between, if not nil, after each page but the last, and fails t when a
// page is longer than the limit or repeats a position.
func walk(t *testing.T, j Jar, f idem.Filter, between func(page []idem.Record)) []string {
	t.Helper()
	var got []string
	for range 100 { // the sets are far smaller
		page, err := j.List(t.Context(), f)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		if len(page) > f.Limit {
			t.Fatalf("List(%+v) = %v: more than the limit", f, ops(page))
		}
		for _, r := range page {
			if !f.After.IsZero() && f.After.Compare(r.Cursor()) >= 0 {
				t.Fatalf("List(%+v) = %v: %q is not after the cursor", f, ops(page), r.Op)
			}
		}
		got = append(got, ops(page)...)
		if len(page) < f.Limit {
			return got
		}
		if between != nil {
			between(page)
		}
		f.After = page[len(page)-1].Cursor()
	}
	t.Fatalf("List(%+v): no end after 100 pages: %v", f, got)
	return nil
}

// testListPages: a walk in pages of 1, 2 and 3, each after the record that
// ended the one before as List returned it, lists every record once in
// List's order, with several records of the same Created at a page's end,
// with and without a State filter.
func testListPages(t *testing.T, j Jar) {
	all := pageSet(t, j)
	pending := []string{"z", "f", "b", "c", "d", "aa"}
	for _, state := range []idem.State{"", idem.StatePending} {
		want := all
		if state != "" {
			want = pending
		}
		if got, err := j.List(t.Context(), idem.Filter{State: state}); err != nil || !slices.Equal(ops(got), want) {
			t.Fatalf("List(%q) = %v, %v; want %v", state, ops(got), err, want)
		}
		for size := 1; size <= 3; size++ {
			if got := walk(t, j, idem.Filter{State: state, Limit: size}, nil); !slices.Equal(got, want) {
				t.Errorf("state %q, pages of %d: %v; want %v", state, size, got, want)
			}
		}
	}
}

// testListPagesDeleted: a record deleted between two pages, the one whose
// position the next page starts after included, neither ends nor repeats
// the walk; a record created meanwhile after the cursor is listed, one
// created before it is not.
func testListPagesDeleted(t *testing.T, j Jar) {
	pageSet(t, j)
	ctx := t.Context()
	pages := 0
	got := walk(t, j, idem.Filter{Limit: 2}, func(page []idem.Record) {
		pages++
		switch pages {
		case 1: // [z f]: forget f, the cursor's record, and c, ahead
			for _, op := range []string{"f", "c"} {
				if err := j.Forget(ctx, op); err != nil {
					t.Fatalf("Forget(%q): %v", op, err)
				}
			}
			early, late := record("early"), record("ab")
			early.Created = t0.Add(-time.Hour)
			begin(t, j, early)
			begin(t, j, late) // at t0, between a and b
		case 2: // [a ab]: prune ab, the cursor's record, and a
			if err := j.Forget(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			update(t, j, "ab", "", idem.Change{Now: t0.Add(-2 * time.Hour), State: idem.StateDone})
			if n, err := j.Prune(ctx, t0.Add(-time.Hour), 0); err != nil || n != 1 {
				t.Fatalf("Prune = %d, %v; want 1 (ab)", n, err)
			}
		}
	})
	if want := []string{"z", "f", "a", "ab", "b", "d", "aa", "e", "g"}; !slices.Equal(got, want) {
		t.Errorf("walk with deletions = %v; want %v", got, want)
	}
}

// testListAfter: After keeps the records strictly after a position, which
// need not be a record's: past the end there are none; a Cursor with a
// time and no Op begins at that time; one at the zero time keeps the
// records created then that sort after its Op; with a State, the same of
// that state's records.
func testListAfter(t *testing.T, j Jar) {
	pageSet(t, j)
	for _, c := range []struct {
		f    idem.Filter
		want []string
	}{
		{idem.Filter{After: idem.Cursor{Created: t0.Add(time.Hour), Op: "g"}}, []string{}},
		{idem.Filter{After: idem.Cursor{Created: t0.Add(time.Hour), Op: "zz"}}, []string{}},
		{idem.Filter{After: idem.Cursor{Created: t0.Add(2 * time.Hour)}, Limit: 5}, []string{}},
		{idem.Filter{After: idem.Cursor{Created: t0}}, []string{"a", "b", "c", "d", "aa", "e", "g"}},
		{idem.Filter{After: idem.Cursor{Created: t0, Op: "bb"}}, []string{"c", "d", "aa", "e", "g"}},
		{idem.Filter{After: idem.Cursor{Created: t0, Op: "d"}, State: idem.StateDone}, []string{"e", "g"}},
		{idem.Filter{After: idem.Cursor{Created: t0.Add(time.Nanosecond)}, Limit: 1}, []string{"aa"}},
		{idem.Filter{After: idem.Cursor{Op: "y"}, Limit: 2}, []string{"z", "f"}},
		{idem.Filter{After: idem.Cursor{Op: "z"}, Limit: 2}, []string{"f", "a"}},
		{idem.Filter{After: idem.Cursor{Created: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}}, []string{"f", "a", "b", "c", "d", "aa", "e", "g"}},
		{idem.Filter{After: idem.Cursor{Created: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}, State: idem.StateDone}, []string{"a", "e", "g"}},
		{idem.Filter{After: idem.Cursor{Op: "y"}, State: idem.StatePending, Limit: 2}, []string{"z", "f"}},
		{idem.Filter{After: idem.Cursor{Op: "z"}, State: idem.StatePending}, []string{"f", "b", "c", "d", "aa"}},
		{idem.Filter{After: idem.Cursor{Created: t0, Op: "b"}, State: idem.StatePending, Limit: 2}, []string{"c", "d"}},
	} {
		got, err := j.List(t.Context(), c.f)
		if err != nil {
			t.Fatalf("List(%+v): %v", c.f, err)
		}
		if !slices.Equal(ops(got), c.want) {
			t.Errorf("List(%+v) = %v; want %v", c.f, ops(got), c.want)
		}
	}
}

// testListAfterFarTimes: a cursor at a time that a durable jar cannot
// store, before 1678 or after 2262 (Unix nanoseconds), is a position all
// the same: every record is after one before the first time stored but
// those at the zero time (the year 1), none after one past the last, and
// every record after one before the zero time.
func testListAfterFarTimes(t *testing.T, j Jar) {
	first, last := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	for _, c := range []struct {
		op      string
		created time.Time
	}{{"zero", time.Time{}}, {"first", first}, {"now", t0}, {"last", last}} {
		r := record(c.op)
		r.Created = c.created
		begin(t, j, r)
	}
	for _, c := range []struct {
		after idem.Cursor
		want  []string
	}{
		{idem.Cursor{Created: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), Op: "zz"}, []string{"first", "now", "last"}},
		{idem.Cursor{Created: first.Add(-time.Nanosecond), Op: "zz"}, []string{"first", "now", "last"}},
		{idem.Cursor{Created: first, Op: "first"}, []string{"now", "last"}},
		{idem.Cursor{Created: last, Op: "lass"}, []string{"last"}},
		{idem.Cursor{Created: last.Add(time.Nanosecond)}, []string{}},
		{idem.Cursor{Created: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), Op: "a"}, []string{}},
		{idem.Cursor{Created: time.Time{}.Add(-time.Hour), Op: "zz"}, []string{"zero", "first", "now", "last"}},
	} {
		got, err := j.List(t.Context(), idem.Filter{After: c.after})
		if err != nil || !slices.Equal(ops(got), c.want) {
			t.Errorf("List after %v %q = %v, %v; want %v", c.after.Created, c.after.Op, ops(got), err, c.want)
		}
	}
}

// ByKeyer is a Jar that finds records by their key; every jar of this
// module is one. The ByKey case is skipped for a jar that is not.
type ByKeyer interface {
	// ByKey returns the records whose Key is key, ordered as List orders
	// them.
	ByKey(ctx context.Context, key string) ([]idem.Record, error)
}

func testByKey(t *testing.T, j Jar) {
	bk, ok := j.(ByKeyer)
	if !ok {
		t.Skip("the jar has no ByKey method")
	}
	ctx := t.Context()
	if got, err := bk.ByKey(ctx, "key-nobody"); err != nil || len(got) != 0 {
		t.Fatalf("ByKey of an empty jar = %v, %v; want none", ops(got), err)
	}
	// One key under two names (a caller sent its key twice), created out
	// of order, and an operation of its own.
	a, b, c := record("a"), record("b"), record("c")
	a.Key, a.Created = "key-shared", t0.Add(time.Second)
	b.Key = "key-shared"
	for _, r := range []idem.Record{a, b, c} {
		begin(t, j, r)
	}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"key-shared", []string{"b", "a"}},
		{"key-c", []string{"c"}},
		{"key-a", []string{}},
		{"KEY-C", []string{}},
	} {
		got, err := bk.ByKey(ctx, tc.key)
		if err != nil {
			t.Fatalf("ByKey(%q): %v", tc.key, err)
		}
		if !slices.Equal(ops(got), tc.want) {
			t.Errorf("ByKey(%q) = %v; want %v", tc.key, ops(got), tc.want)
		}
		if tc.key == "key-c" && len(got) == 1 {
			expect(t, "record found by key", got[0], c)
		}
	}
}

func testForget(t *testing.T, j Jar) {
	ctx := t.Context()
	begin(t, j, record("keep"))
	begin(t, j, record("pending"))
	if _, err := j.Acquire(ctx, "pending", "a", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := j.Forget(ctx, "pending"); err != nil {
		t.Fatalf("Forget of a pending, leased op: %v", err)
	}
	if _, err := j.Get(ctx, "pending"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get after Forget: err = %v; want ErrNotFound", err)
	}
	if err := j.Forget(ctx, "pending"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("second Forget: err = %v; want ErrNotFound", err)
	}
	// The name is free again: Begin creates it with the new key.
	r := record("pending")
	r.Key = "second-key"
	if got := begin(t, j, r); got.Key != "second-key" || got.Holder != "" {
		t.Errorf("Begin after Forget: key %q holder %q; want second-key and no holder", got.Key, got.Holder)
	}
	expect(t, "untouched record", get(t, j, "keep"), record("keep"))
}

// KeyForgetter is a Jar that deletes an operation only while its record
// has a given key and is not pending, as client.KeyForgetter says; every
// jar of this module is one. The ForgetKey cases are skipped for a jar that
// is not.
type KeyForgetter interface {
	// ForgetKey deletes op only if its record has key and is not pending.
	// It returns idem.ErrNotFound when op has no record, and
	// idem.ErrNotForgotten, deleting nothing, when its record has another
	// key or is pending.
	ForgetKey(ctx context.Context, op, key string) error
}

func keyForgetter(t *testing.T, j Jar) KeyForgetter {
	t.Helper()
	kf, ok := j.(KeyForgetter)
	if !ok {
		t.Skip("the jar has no ForgetKey method")
	}
	return kf
}

func testForgetKey(t *testing.T, j Jar) {
	kf := keyForgetter(t, j)
	ctx := t.Context()
	begin(t, j, record("keep"))
	if err := kf.ForgetKey(ctx, "unknown", "key-unknown"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("ForgetKey of an unknown op: err = %v; want ErrNotFound", err)
	}

	// A pending record is kept, whatever the key.
	begin(t, j, record("op"))
	for _, key := range []string{"key-op", "another-key", ""} {
		if err := kf.ForgetKey(ctx, "op", key); !errors.Is(err, idem.ErrNotForgotten) {
			t.Errorf("ForgetKey(op, %q) of a pending op: err = %v; want ErrNotForgotten", key, err)
		}
	}
	expect(t, "pending record after ForgetKey", get(t, j, "op"), record("op"))

	// Each state but pending is forgotten under its key, and only under it.
	for _, s := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateReconcile, idem.StateAbandoned} {
		op := "op-" + string(s)
		begin(t, j, record(op))
		want := update(t, j, op, "", idem.Change{Now: t0.Add(time.Second), State: s, LastStatus: 201})
		for _, key := range []string{"key-op", "KEY-" + op, ""} {
			if err := kf.ForgetKey(ctx, op, key); !errors.Is(err, idem.ErrNotForgotten) {
				t.Errorf("ForgetKey(%s, %q): err = %v; want ErrNotForgotten", op, key, err)
			}
		}
		expect(t, string(s)+" record after ForgetKey with other keys", get(t, j, op), want)
		if err := kf.ForgetKey(ctx, op, "key-"+op); err != nil {
			t.Errorf("ForgetKey(%s) with its key: %v", op, err)
		}
		if _, err := j.Get(ctx, op); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get(%s) after ForgetKey: err = %v; want ErrNotFound", op, err)
		}
		if err := kf.ForgetKey(ctx, op, "key-"+op); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("second ForgetKey(%s): err = %v; want ErrNotFound", op, err)
		}
	}

	// The race it exists for: the abandoned operation read by the caller is
	// replaced by Begin under a new key before the deletion. The new
	// operation is kept, pending or not.
	update(t, j, "op", "", idem.Change{Now: t0.Add(time.Second), State: idem.StateAbandoned, Note: "did not happen"})
	again := record("op")
	again.Key = "second-key"
	begin(t, j, again)
	if err := kf.ForgetKey(ctx, "op", "key-op"); !errors.Is(err, idem.ErrNotForgotten) {
		t.Errorf("ForgetKey with the replaced key: err = %v; want ErrNotForgotten", err)
	}
	expect(t, "new operation after ForgetKey with the replaced key", get(t, j, "op"), again)
	done := update(t, j, "op", "", idem.Change{Now: t0.Add(2 * time.Second), State: idem.StateDone, LastStatus: 201})
	if err := kf.ForgetKey(ctx, "op", "key-op"); !errors.Is(err, idem.ErrNotForgotten) {
		t.Errorf("ForgetKey of the done new operation with the replaced key: err = %v; want ErrNotForgotten", err)
	}
	expect(t, "done new operation after ForgetKey with the replaced key", get(t, j, "op"), done)

	// It is ordered after the changes deferred before it: a pending
	// operation deferred done is forgotten.
	if d, ok := j.(idem.Deferrer); ok {
		begin(t, j, record("deferred"))
		if err := d.Defer("deferred", "", idem.Change{Now: t0.Add(time.Second), State: idem.StateDone, LastStatus: 201}); err != nil {
			t.Fatal(err)
		}
		if err := kf.ForgetKey(ctx, "deferred", "key-deferred"); err != nil {
			t.Errorf("ForgetKey after a deferred change to done: %v", err)
		}
		if _, err := j.Get(ctx, "deferred"); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get after ForgetKey of a deferred done: err = %v; want ErrNotFound", err)
		}
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	begin(t, j, record("done"))
	update(t, j, "done", "", idem.Change{Now: t0, State: idem.StateDone})
	if err := kf.ForgetKey(cancelled, "done", "key-done"); !errors.Is(err, context.Canceled) {
		t.Errorf("ForgetKey with a cancelled context: err = %v; want context.Canceled", err)
	}
	if _, err := j.Get(ctx, "done"); err != nil {
		t.Errorf("Get after a cancelled ForgetKey: %v; want the record kept", err)
	}
	expect(t, "untouched record", get(t, j, "keep"), record("keep"))
}

// AbandonKeyer is a Jar that abandons an operation in one statement that
// reads no header, as *keyjar.Jar and the PostgreSQL jar do for idemctl.
// The AbandonKey case is skipped for a jar that is not one.
type AbandonKeyer interface {
	// AbandonKey moves op to idem.StateAbandoned, with note as its Note
	// and now as its Updated, its lease released and its next attempt
	// cleared, only if its record has key, is pending or reconcile, and
	// its lease is free, expired at now or held by holder. It returns
	// idem.ErrNotFound when op has no record, and idem.ErrNotAbandoned,
	// changing nothing, when its key, state or lease keep it.
	AbandonKey(ctx context.Context, op, key, holder, note string, now time.Time) error
}

// testAbandonKey: AbandonKey abandons a pending or reconcile operation under
// its key whose lease is free, expired or held by the holder given, and
// changes nothing else of it; it changes nothing of any other.
func testAbandonKey(t *testing.T, j Jar) {
	ak, ok := j.(AbandonKeyer)
	if !ok {
		t.Skip("the jar has no AbandonKey method")
	}
	ctx := t.Context()
	now := t0.Add(time.Hour)
	if err := ak.AbandonKey(ctx, "unknown", "key-unknown", "", "gone", now); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("AbandonKey of an unknown op: err = %v; want ErrNotFound", err)
	}
	begin(t, j, record("done"))
	done := update(t, j, "done", "", idem.Change{Now: t0, State: idem.StateDone, LastStatus: 201})
	begin(t, j, record("leased"))
	leased, err := j.Acquire(ctx, "leased", "h1", now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pending := begin(t, j, record("pending"))
	for _, c := range []struct{ op, key, holder string }{
		{"done", "key-done", ""},
		{"pending", "another-key", ""},
		{"leased", "key-leased", ""},
		{"leased", "key-leased", "h2"},
	} {
		if err := ak.AbandonKey(ctx, c.op, c.key, c.holder, "gone", now); !errors.Is(err, idem.ErrNotAbandoned) {
			t.Errorf("AbandonKey(%s, %s, holder %q): err = %v; want ErrNotAbandoned", c.op, c.key, c.holder, err)
		}
	}
	if err := ak.AbandonKey(ctx, "pending", "key-pending", "", "", now); err == nil {
		t.Error("AbandonKey with an empty note: nil error")
	}
	expect(t, "done record after AbandonKey", get(t, j, "done"), done)
	expect(t, "leased record after AbandonKey", get(t, j, "leased"), leased)
	expect(t, "pending record after AbandonKey", get(t, j, "pending"), pending)

	abandoned := func(r idem.Record, at time.Time) idem.Record {
		r.State, r.Note, r.Updated, r.NextAttempt, r.Holder, r.LeaseUntil = idem.StateAbandoned, "gone", at, time.Time{}, "", time.Time{}
		return r
	}
	if err := ak.AbandonKey(ctx, "leased", "key-leased", "h1", "gone", now); err != nil {
		t.Errorf("AbandonKey of a record leased to the holder given: %v", err)
	}
	expect(t, "record leased to the holder given after AbandonKey", get(t, j, "leased"), abandoned(leased, now))
	later := now.Add(time.Minute) // the lease of h2 has just ended
	if _, err := j.Acquire(ctx, "pending", "h2", now, time.Minute); err != nil {
		t.Fatal(err)
	}
	pending = update(t, j, "pending", "h2", idem.Change{Now: now, State: idem.StateReconcile, Attempts: 1,
		LastStatus: 503, LastError: "busy", NextAttempt: later, Note: "past the horizon"})
	if err := ak.AbandonKey(ctx, "pending", "key-pending", "", "gone", later); err != nil {
		t.Errorf("AbandonKey of a reconcile record whose lease ended: %v", err)
	}
	expect(t, "reconcile record after AbandonKey", get(t, j, "pending"), abandoned(pending, later))
	if err := ak.AbandonKey(ctx, "pending", "key-pending", "", "gone", later); !errors.Is(err, idem.ErrNotAbandoned) {
		t.Errorf("second AbandonKey: err = %v; want ErrNotAbandoned", err)
	}
}

// testForgetKeyRacingBegin runs ForgetKey of an abandoned operation and a
// Begin of its name at once, many times: whichever comes first, the new
// operation is in the jar afterwards, pending under its key.
func testForgetKeyRacingBegin(t *testing.T, j Jar) {
	kf := keyForgetter(t, j)
	ctx := t.Context()
	const n = 32
	for i := range n {
		op := fmt.Sprintf("op-%d", i)
		begin(t, j, record(op))
		update(t, j, op, "", idem.Change{Now: t0, State: idem.StateAbandoned, Note: "did not happen"})
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		op := fmt.Sprintf("op-%d", i)
		wg.Go(func() {
			<-start
			if err := kf.ForgetKey(ctx, op, "key-"+op); err != nil && !errors.Is(err, idem.ErrNotForgotten) {
				t.Errorf("ForgetKey(%s): %v", op, err)
			}
		})
		wg.Go(func() {
			r := record(op)
			r.Key = "new-" + op
			<-start
			if _, created, err := j.Begin(ctx, r); err != nil || !created {
				t.Errorf("Begin(%s) over an abandoned or forgotten op: created = %v, %v; want true", op, created, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		op := fmt.Sprintf("op-%d", i)
		want := record(op)
		want.Key = "new-" + op
		expect(t, "after ForgetKey and Begin at once", get(t, j, op), want)
	}
}

func testPrune(t *testing.T, j Jar) {
	ctx := t.Context()
	before := t0.Add(time.Hour)
	type row struct {
		state   idem.State
		updated time.Time
		pruned  bool
	}
	rows := map[string]row{
		"done-old":        {idem.StateDone, before.Add(-time.Nanosecond), true},
		"failed-old":      {idem.StateFailed, t0, true},
		"abandoned-old":   {idem.StateAbandoned, t0, true},
		"done-zero":       {idem.StateDone, time.Time{}, true},
		"done-at":         {idem.StateDone, before, false},
		"done-new":        {idem.StateDone, before.Add(time.Hour), false},
		"pending-old":     {idem.StatePending, t0, false},
		"reconcile-old":   {idem.StateReconcile, t0, false},
		"abandoned-newer": {idem.StateAbandoned, before.Add(time.Second), false},
	}
	for op, r := range rows {
		begin(t, j, record(op))
		update(t, j, op, "", idem.Change{Now: r.updated, State: r.state})
	}
	n, err := j.Prune(ctx, before, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("Prune = %d; want 4", n)
	}
	for op, r := range rows {
		_, err := j.Get(ctx, op)
		if gone := errors.Is(err, idem.ErrNotFound); gone != r.pruned {
			t.Errorf("%s: pruned = %v (err %v); want %v", op, gone, err, r.pruned)
		}
	}
	if n, err := j.Prune(ctx, before, 0); n != 0 || err != nil {
		t.Errorf("second Prune = %d, %v; want 0", n, err)
	}
}

// testPruneFarTimes prunes before times a jar may not store (beyond 2262,
// before 1678, before the zero time): a before later than every record's
// Updated prunes them all, one earlier prunes none, and the zero time
// counts as the earliest.
func testPruneFarTimes(t *testing.T, j Jar) {
	first, last := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	for _, c := range []struct {
		before time.Time
		want   []string // the records pruned
	}{
		{time.Time{}.Add(-time.Hour), nil},
		{time.Time{}, nil},
		{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), []string{"zero"}},
		{first.Add(time.Nanosecond), []string{"first", "zero"}},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), []string{"first", "last", "now", "zero"}},
	} {
		for op, updated := range map[string]time.Time{"zero": {}, "first": first, "now": t0, "last": last} {
			if _, err := j.Get(t.Context(), op); errors.Is(err, idem.ErrNotFound) {
				begin(t, j, record(op))
			}
			update(t, j, op, "", idem.Change{Now: updated, State: idem.StateDone})
		}
		n, err := j.Prune(t.Context(), c.before, 0)
		var gone []string
		for _, op := range []string{"first", "last", "now", "zero"} {
			if _, err := j.Get(t.Context(), op); errors.Is(err, idem.ErrNotFound) {
				gone = append(gone, op)
			}
		}
		if err != nil || n != len(c.want) || !slices.Equal(gone, c.want) {
			t.Errorf("Prune before %v = %d, %v, pruning %v; want %d, pruning %v", c.before, n, err, gone, len(c.want), c.want)
		}
	}
}

func testPruneLimit(t *testing.T, j Jar) {
	ctx := t.Context()
	for i := range 5 {
		op := fmt.Sprintf("done-%d", i)
		begin(t, j, record(op))
		update(t, j, op, "", idem.Change{Now: t0, State: idem.StateDone})
	}
	begin(t, j, record("pending"))
	for i, want := range []int{2, 2, 1, 0} {
		n, err := j.Prune(ctx, t0.Add(time.Hour), 2)
		if err != nil || n != want {
			t.Fatalf("Prune #%d with limit 2 = %d, %v; want %d", i, n, err, want)
		}
	}
	all, err := j.List(ctx, idem.Filter{})
	if err != nil || !slices.Equal(ops(all), []string{"pending"}) {
		t.Errorf("after Prune: %v, %v; want [pending]", ops(all), err)
	}
}

func testSecretHeaders(t *testing.T, j Jar) {
	r := record("op")
	r.Header = http.Header{
		"Authorization":       {"Bearer sk_live_secret"},
		"Proxy-Authorization": {"Basic c2VjcmV0"},
		"Cookie":              {"session=secret"},
		"X-Api-Key":           {"secret-api-key"},
		"X-Auth-Token":        {"secret-token"},
		"x-session-id":        {"secret-session"}, // as a caller may set it, not canonical
		"Content-Type":        {"application/json"},
		"Accept":              {"application/json", "text/plain"},
		// What a client.Client with Options.Header records.
		idem.AddedCredentials: nil,
	}
	in := r.Header.Clone()
	// The credentials' names stay, without their values: a resume must
	// send them again.
	want := http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json", "text/plain"},
		"Authorization": nil, "Proxy-Authorization": nil, "Cookie": nil, "X-Api-Key": nil, "X-Auth-Token": nil, "x-session-id": nil,
		idem.AddedCredentials: nil}
	withheld := []string{"Authorization", "Cookie", idem.AddedCredentials, "Proxy-Authorization", "X-Api-Key", "X-Auth-Token", "X-Session-Id"}
	check := func(what string, h http.Header) {
		t.Helper()
		for k, vs := range h {
			if idem.SecretHeader(k) && len(vs) > 0 {
				t.Errorf("%s holds the value of secret header %s", what, k)
			}
		}
		if !headerEqual(h, want) {
			t.Errorf("%s header = %v; want %v", what, h, want)
		}
		if got := (idem.Record{Header: h}).Withheld(); !slices.Equal(got, withheld) {
			t.Errorf("%s: Withheld() = %q; want %q", what, got, withheld)
		}
	}
	got := begin(t, j, r)
	check("Begin", got.Header)
	check("Get", get(t, j, "op").Header)
	all, err := j.List(t.Context(), idem.Filter{})
	if err != nil || len(all) != 1 {
		t.Fatalf("List = %v, %v", ops(all), err)
	}
	check("List", all[0].Header)
	if !headerEqual(r.Header, in) {
		t.Errorf("Begin modified the caller's header: %v; want %v", r.Header, in)
	}
}

func testRoundTrip(t *testing.T, j Jar) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	for _, c := range []struct {
		name string
		edit func(r *idem.Record)
	}{
		{"nil body", func(r *idem.Record) { r.Body, r.BodySize = nil, 0 }},
		{"empty body", func(r *idem.Record) { r.Body, r.BodySize = []byte{}, 0 }},
		{"binary body", func(r *idem.Record) { r.Body, r.BodySize = binary, int64(len(binary)) }},
		{"body not stored", func(r *idem.Record) { r.Body, r.BodySize = nil, 100<<20 }},
		{"nil header", func(r *idem.Record) { r.Header = nil }},
		{"odd header", func(r *idem.Record) {
			r.Header = http.Header{
				"X-Empty":          {""},
				"X-Many":           {"1", "2", "3", "2"},
				"x-not-canonical":  {"kept as is"},
				"X-Unicode":        {"日本語 \"quoted\" \\ \n"},
				"Idempotency-Key":  {"key-op"},
				"Content-Encoding": {"gzip"},
				// A name without values: net/http sends no User-Agent
				// for it, where it sends its own for no name.
				"User-Agent": nil,
			}
		}},
		{"header bytes that are not UTF-8", func(r *idem.Record) {
			r.Header = http.Header{
				"Content-Disposition": {"attachment; filename=caf\xe9.txt"}, // Latin-1, HTTP's obs-text
				"X-Nul":               {"\x00base64:"},
				"X-Caf\xe9":           {"names too"},
				"X-Caf\xe8":           {"each its own"},
			}
		}},
		{"every field", func(r *idem.Record) {
			r.State, r.Attempts, r.LastStatus, r.LastError = idem.StateReconcile, 7, 503, "dial tcp: connection refused"
			r.NextAttempt, r.Note = t0.Add(time.Minute), "note ✓"
			r.Holder, r.LeaseUntil = "host:1234", t0.Add(30*time.Second)
			r.URL = "http://[::1]:8080/a%20b?q=1&q=2#frag"
			r.Fingerprint = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := record("op:" + c.name)
			c.edit(&want)
			got := begin(t, j, want)
			if want.Header == nil {
				want.Header = http.Header{}
			}
			expect(t, "Begin", got, want)
			stored := get(t, j, want.Op)
			expect(t, "Get", stored, want)
			// expect takes a nil Header for an empty one; the jars do not:
			// Begin and Get return a Header that is not nil.
			if got.Header == nil || stored.Header == nil {
				t.Errorf("Header is nil: %v from Begin, %v from Get; want an empty Header from both", got.Header == nil, stored.Header == nil)
			}
			if stored.BodyStored() != want.BodyStored() {
				t.Errorf("BodyStored = %v; want %v", stored.BodyStored(), want.BodyStored())
			}
		})
	}
}

func testTimes(t *testing.T, j Jar) {
	zone := time.FixedZone("UTC+5:30", 5*3600+30*60)
	now := time.Now() // has a monotonic reading, which a jar cannot keep
	r := record("op")
	r.Created = time.Date(2024, 2, 29, 23, 59, 59, 999999999, zone)
	r.Updated = now
	r.NextAttempt = time.Date(1999, 12, 31, 23, 59, 59, 1, time.UTC)
	r.LeaseUntil = time.Date(2200, 1, 1, 0, 0, 0, 1, zone)
	got := begin(t, j, r)
	expect(t, "Begin", got, r)
	expect(t, "Get", get(t, j, "op"), r)

	// Zero times stay zero.
	got = update(t, j, "op", "", idem.Change{Now: now.Add(time.Nanosecond), Release: true})
	if !got.NextAttempt.IsZero() || !got.LeaseUntil.IsZero() {
		t.Errorf("cleared times: NextAttempt %v, LeaseUntil %v; want zero", got.NextAttempt, got.LeaseUntil)
	}
	stored := get(t, j, "op")
	if !stored.NextAttempt.IsZero() || !stored.LeaseUntil.IsZero() || !stored.Updated.Equal(now.Add(time.Nanosecond)) {
		t.Errorf("stored times: NextAttempt %v, LeaseUntil %v, Updated %v; want zero, zero, %v",
			stored.NextAttempt, stored.LeaseUntil, stored.Updated, now.Add(time.Nanosecond))
	}
}

func testNoAliasing(t *testing.T, j Jar) {
	r := record("op")
	got := begin(t, j, r)
	// Changing what Begin was given or returned changes nothing stored.
	r.Header.Set("Content-Type", "text/plain")
	r.Body[0] = 'X'
	got.Header.Set("X-Request-Tag", "changed")
	got.Body[1] = 'Y'
	stored := get(t, j, "op")
	expect(t, "after changing Begin's argument and result", stored, record("op"))
	stored.Header.Del("Content-Type")
	stored.Body[2] = 'Z'
	expect(t, "after changing Get's result", get(t, j, "op"), record("op"))
}

func testCancelledContext(t *testing.T, j Jar) {
	begin(t, j, record("op"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := j.Begin(ctx, record("new")); !errors.Is(err, context.Canceled) {
		t.Errorf("Begin: err = %v; want context.Canceled", err)
	}
	if _, err := j.Get(ctx, "op"); !errors.Is(err, context.Canceled) {
		t.Errorf("Get: err = %v; want context.Canceled", err)
	}
	if _, err := j.Acquire(ctx, "op", "a", t0, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire: err = %v; want context.Canceled", err)
	}
	if _, err := j.Update(ctx, "op", "", idem.Change{Now: t0, State: idem.StateDone}); !errors.Is(err, context.Canceled) {
		t.Errorf("Update: err = %v; want context.Canceled", err)
	}
	if _, err := j.List(ctx, idem.Filter{}); !errors.Is(err, context.Canceled) {
		t.Errorf("List: err = %v; want context.Canceled", err)
	}
	if err := j.Forget(ctx, "op"); !errors.Is(err, context.Canceled) {
		t.Errorf("Forget: err = %v; want context.Canceled", err)
	}
	if _, err := j.Prune(ctx, t0.Add(time.Hour), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Prune: err = %v; want context.Canceled", err)
	}
	// Nothing happened.
	if _, err := j.Get(t.Context(), "new"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(new) after a cancelled Begin: err = %v; want ErrNotFound", err)
	}
	expect(t, "after cancelled calls", get(t, j, "op"), record("op"))
}
