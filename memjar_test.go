package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar/jartest"
)

func TestMemoryJar(t *testing.T) {
	jartest.Run(t, func(t *testing.T) jartest.Jar { return new(idem.MemoryJar) })
}

// TestMemoryJarCollisions runs the conformance suite with hashes that
// collide: every operation but the first (constant), or those of one
// length (length), is found through the collision map.
func TestMemoryJarCollisions(t *testing.T) {
	for name, h := range map[string]func(string) uint64{
		"constant": func(string) uint64 { return 42 },
		"length":   func(op string) uint64 { return uint64(len(op)) },
	} {
		t.Run(name, func(t *testing.T) {
			jartest.Run(t, func(t *testing.T) jartest.Jar {
				j := new(idem.MemoryJar)
				idem.SetMemoryJarHash(j, h)
				return j
			})
		})
	}
}

// TestMemoryJarZeroValue: a new MemoryJar answers every method before its
// first Begin.
func TestMemoryJarZeroValue(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	for name, call := range map[string]func(j *idem.MemoryJar) error{
		"Get":     func(j *idem.MemoryJar) error { _, err := j.Get(ctx, "op"); return err },
		"Acquire": func(j *idem.MemoryJar) error { _, err := j.Acquire(ctx, "op", "h", now, time.Minute); return err },
		"Update":  func(j *idem.MemoryJar) error { _, err := j.Update(ctx, "op", "", idem.Change{Now: now}); return err },
		"Forget":  func(j *idem.MemoryJar) error { return j.Forget(ctx, "op") },
	} {
		if err := call(new(idem.MemoryJar)); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("%s on a new jar: %v; want ErrNotFound", name, err)
		}
	}
	j := new(idem.MemoryJar)
	if err := j.Defer("op", "", idem.Change{Now: now}); err != nil {
		t.Errorf("Defer on a new jar: %v", err)
	}
	if rs, err := j.List(ctx, idem.Filter{}); err != nil || len(rs) != 0 {
		t.Errorf("List on a new jar: %d, %v", len(rs), err)
	}
	if n, err := j.Prune(ctx, now, 0); err != nil || n != 0 {
		t.Errorf("Prune on a new jar: %d, %v", n, err)
	}
}

// TestMemoryJarInvalid: what the conformance suite's Invalid case refuses,
// the MemoryJar refuses with ErrInvalidRecord.
func TestMemoryJarInvalid(t *testing.T) {
	ctx := t.Context()
	j := new(idem.MemoryJar)
	if _, _, err := j.Begin(ctx, memRecord(0)); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(r *idem.Record){
		"empty op":      func(r *idem.Record) { r.Op = "" },
		"empty key":     func(r *idem.Record) { r.Key = "" },
		"unknown state": func(r *idem.Record) { r.State = "sent" },
		"existing op":   func(r *idem.Record) { r.Op, r.State = "op-0", "sent" },
	} {
		r := memRecord(1)
		edit(&r)
		if _, _, err := j.Begin(ctx, r); !errors.Is(err, idem.ErrInvalidRecord) {
			t.Errorf("Begin with %s: err = %v; want ErrInvalidRecord", name, err)
		}
	}
	bad := idem.Change{Now: time.Unix(1_700_000_001, 0), State: "sent"}
	if _, err := j.Update(ctx, "op-0", "", bad); !errors.Is(err, idem.ErrInvalidRecord) {
		t.Errorf("Update with an unknown state: err = %v; want ErrInvalidRecord", err)
	}
	for _, op := range []string{"op-0", "unknown"} {
		if err := j.Defer(op, "", bad); !errors.Is(err, idem.ErrInvalidRecord) {
			t.Errorf("Defer(%q) with an unknown state: err = %v; want ErrInvalidRecord", op, err)
		}
	}
	if rs, err := j.List(ctx, idem.Filter{}); err != nil || len(rs) != 1 || rs[0].State != idem.StatePending || !rs[0].Updated.Equal(memRecord(0).Updated) {
		t.Errorf("List after refused calls = %+v, %v; want op-0 as begun", rs, err)
	}
}

// TestMemoryJarSlotReuse: an operation kept in the collision map, in the
// slot of a deleted one, is deleted from there too, and its slot used again.
func TestMemoryJarSlotReuse(t *testing.T) {
	ctx := context.Background()
	j := new(idem.MemoryJar)
	idem.SetMemoryJarHash(j, func(op string) uint64 { return uint64(len(op)) })
	rec := func(op string) idem.Record {
		r := memRecord(0)
		r.Op, r.Key = op, "key-"+op
		return r
	}
	begin := func(op string) {
		if _, created, err := j.Begin(ctx, rec(op)); err != nil || !created {
			t.Fatalf("Begin(%q): created %v, %v", op, created, err)
		}
	}
	forget := func(op string) {
		if err := j.Forget(ctx, op); err != nil {
			t.Fatalf("Forget(%q): %v", op, err)
		}
	}
	begin("a")  // first slot, by its hash
	begin("bb") // second slot, by its hash
	forget("a")
	begin("cc") // the first slot again, in the collision map: "bb" has its hash
	forget("bb")
	forget("cc")
	if _, err := j.Get(ctx, "cc"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get(cc) after Forget: %v; want ErrNotFound", err)
	}
	begin("d")
	begin("ee")
	for _, op := range []string{"d", "ee"} {
		if r, err := j.Get(ctx, op); err != nil || r.Op != op || r.Key != "key-"+op {
			t.Errorf("Get(%q) = %q, %q, %v", op, r.Op, r.Key, err)
		}
	}
	if _, err := j.Get(ctx, "cc"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(cc) once its slot is used again: %v; want ErrNotFound", err)
	}
	if rs, _ := j.List(ctx, idem.Filter{}); len(rs) != 2 {
		t.Errorf("List: %d records; want 2", len(rs))
	}
}

func memRecord(i int) idem.Record {
	now := time.Unix(1_700_000_000, int64(i)).UTC()
	body := []byte(fmt.Sprintf(`{"order":%d}`, i))
	return idem.Record{
		Op: fmt.Sprintf("op-%d", i), Key: fmt.Sprintf("key-%d", i), Fingerprint: "fp", State: idem.StatePending,
		Method: http.MethodPost, URL: "http://127.0.0.1/charge", Header: http.Header{"Content-Type": {"application/json"}},
		Body: body, BodySize: int64(len(body)), Created: now, Updated: now, Attempts: 1,
	}
}

// TestMemoryJarCompacts: an update writes no bytes, those of deleted
// records are reclaimed, and the records that stay are intact after the
// copy.
func TestMemoryJarCompacts(t *testing.T) {
	for name, h := range map[string]func(string) uint64{
		"maphash":  nil,
		"constant": func(string) uint64 { return 42 },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			j := new(idem.MemoryJar)
			if h != nil {
				idem.SetMemoryJarHash(j, h)
			}
			const n = 5000
			for i := range n {
				if _, _, err := j.Begin(ctx, memRecord(i)); err != nil {
					t.Fatal(err)
				}
			}
			full, _ := idem.MemoryJarBytes(j)
			// An update changes fields kept apart from the bytes.
			for round := range 20 {
				for i := range n {
					if _, err := j.Update(ctx, fmt.Sprintf("op-%d", i), "", idem.Change{Now: time.Unix(0, 0), Attempts: 1, LastStatus: 500 + round}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if data, _ := idem.MemoryJarBytes(j); data != full {
				t.Errorf("after 20 updates of each record: %d bytes of data; want %d as before", data, full)
			}
			for i := range n - 10 {
				if err := j.Forget(ctx, fmt.Sprintf("op-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			data, dead := idem.MemoryJarBytes(j)
			fresh := new(idem.MemoryJar) // the 10 records alone
			for i := n - 10; i < n; i++ {
				fresh.Begin(ctx, memRecord(i))
			}
			live, _ := idem.MemoryJarBytes(fresh)
			// What is dead is copied away once it is more than both the
			// live bytes and a chunk (256 KiB).
			if data-dead != live || dead > max(live, 256<<10) {
				t.Errorf("10 records left: %d bytes of data, %d dead; want %d live and at most %d dead", data, dead, live, max(live, 256<<10))
			}
			for i := n - 10; i < n; i++ {
				got, err := j.Get(ctx, fmt.Sprintf("op-%d", i))
				want := memRecord(i)
				if err != nil || got.Attempts != 21 || got.LastStatus != 519 || string(got.Body) != string(want.Body) ||
					got.Key != want.Key || got.Header.Get("Content-Type") != "application/json" || !got.Created.Equal(want.Created) {
					t.Errorf("op-%d after compaction: %+v, %v; want %+v with 21 attempts, last status 519", i, got, err, want)
				}
			}
			if rs, _ := j.List(ctx, idem.Filter{}); len(rs) != 10 {
				t.Errorf("List: %d records; want 10", len(rs))
			}
		})
	}
}

// TestMemoryJarLongRecordsKeepTheChunkOpen: records longer than half a
// chunk (256 KiB), each followed by a short one, take the memory of their
// bytes and of one chunk that the short ones share, not a chunk each that
// a short one begins.
func TestMemoryJarLongRecordsKeepTheChunkOpen(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{129 << 10, 300 << 10} {
		j := new(idem.MemoryJar)
		for i := range 20 {
			long := memRecord(2 * i)
			long.Body = make([]byte, size)
			long.BodySize = int64(size)
			for _, r := range []idem.Record{long, memRecord(2*i + 1)} {
				if _, _, err := j.Begin(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
		}
		data, _ := idem.MemoryJarBytes(j)
		if taken := idem.MemoryJarChunkBytes(j); taken > data+256<<10 {
			t.Errorf("20 records of %d KiB and 20 short ones: %d KiB of chunks for %d KiB of data; want at most one chunk more",
				size>>10, taken>>10, data>>10)
		}
		for i := range 40 {
			want := memRecord(i)
			if i%2 == 0 {
				want.Body = make([]byte, size)
			}
			if got, err := j.Get(ctx, want.Op); err != nil || got.Key != want.Key || string(got.Body) != string(want.Body) {
				t.Errorf("Get(%s) = key %q, %d bytes of body, %v; want %q, %d bytes", want.Op, got.Key, len(got.Body), err, want.Key, len(want.Body))
			}
		}
	}
}

// TestMemoryJarHoldsNoObjectPerRecord: the records do not add objects for
// the garbage collector to mark, so a large jar does not slow every
// collection of the program that holds it.
func TestMemoryJarHoldsNoObjectPerRecord(t *testing.T) {
	ctx := context.Background()
	j := new(idem.MemoryJar)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 20000
	for i := range n {
		if _, _, err := j.Begin(ctx, memRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(j)
	// A map of Records held about five objects per record (the record, its
	// strings, body and header): 100,000 here.
	if grown := int64(after.HeapObjects) - int64(before.HeapObjects); grown > n/10 {
		t.Errorf("%d records added %d heap objects; want at most %d", n, grown, n/10)
	}
}

// TestMemoryJarListDecodesOnlyWhatItReturns: a page of one record from a
// jar of thousands, with several headers each, allocates about what that
// record needs, not what decoding all of them would.
func TestMemoryJarListDecodesOnlyWhatItReturns(t *testing.T) {
	const n = 2000
	ctx := context.Background()
	j := new(idem.MemoryJar)
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range n {
		r := idem.Record{Op: fmt.Sprintf("op-%04d", i), Key: fmt.Sprintf("key-%04d", i), Fingerprint: "fp", Method: "POST",
			URL: "http://127.0.0.1/v1/charges", Body: []byte(`{"amount":1}`), BodySize: 12, Created: t0.Add(time.Duration(n-i) * time.Second),
			Header: http.Header{"Content-Type": {"application/json"}, "X-A": {"a"}, "X-B": {"b"}}}
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var page []idem.Record
	allocs := testing.AllocsPerRun(5, func() {
		var err error
		if page, err = j.List(ctx, idem.Filter{Limit: 1, After: idem.Cursor{Created: t0}}); err != nil {
			t.Fatal(err)
		}
	})
	if len(page) != 1 || page[0].Op != fmt.Sprintf("op-%04d", n-1) {
		t.Fatalf("List = %d records, the first %+v; want op-%04d, the oldest", len(page), page, n-1)
	}
	// One record's strings, body and header take about 10; the page's
	// positions, one. Sorting every record's position would take a slice
	// that grows about 20 times, to n positions.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := j.List(ctx, idem.Filter{Limit: 1, After: idem.Cursor{Created: t0}}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if allocs > 20 || after.TotalAlloc-before.TotalAlloc > 8<<10 {
		t.Errorf("List of 1 of %d records: %.0f allocations, %d bytes; want about 10 and 1 KiB, as it decodes one and keeps one position",
			n, allocs, after.TotalAlloc-before.TotalAlloc)
	}
}
