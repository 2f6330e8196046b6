package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// model is the Jar contract in its plainest form, a map of records: what a
// MemoryJar must answer.
type model map[string]idem.Record

func clone(r idem.Record) idem.Record {
	r.Header, r.Body = r.Header.Clone(), bytes.Clone(r.Body)
	if r.Header == nil {
		r.Header = http.Header{}
	}
	return r
}

// FuzzMemoryJar runs a sequence of calls, decoded from the input, on a
// MemoryJar and on model, and compares every answer. The names have
// different lengths and the jar's hash may be forced to collide (by the
// first byte), so that records move between the index and the collision
// map; large bodies make deletions copy the chunks.
func FuzzMemoryJar(f *testing.F) {
	f.Add([]byte("\x00\x00\x10\x21\x32\x43\x54\x65\x76\x07\x18"))
	f.Add([]byte("\x01\x00\x01\x02\x03\x40\x41\x42\x50\x51\x60\x70\x80\x00\x01"))
	f.Add([]byte("\x02\x00\x08\x10\x18\x20\x28\x51\x59\x61\x69\x00\x08\x10\x50\x58"))
	f.Add(bytes.Repeat([]byte("\x02\x0b\x53\x16\x5d"), 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		ctx := context.Background()
		j := new(idem.MemoryJar)
		switch data[0] % 3 {
		case 1:
			idem.SetMemoryJarHash(j, func(string) uint64 { return 7 })
		case 2:
			idem.SetMemoryJarHash(j, func(op string) uint64 { return uint64(len(op)) })
		}
		m := model{}
		names := []string{"a", "bb", "cc", "ddd", "e", "ffff"}
		holders := []string{"", "h1", "h2"}
		t0 := time.Unix(1_700_000_000, 0)
		for step, c := range data[1:min(len(data), 400)] {
			op := names[int(c>>3)%len(names)]
			holder := holders[int(c>>5)%len(holders)]
			now := t0.Add(time.Duration(step) * time.Second)
			what := fmt.Sprintf("step %d (%#02x) on %q", step, c, op)
			switch c % 8 {
			case 0, 1: // Begin, sometimes with a large body, sometimes with a secret header
				r := idem.Record{Op: op, Key: fmt.Sprintf("k%d", step), Fingerprint: "fp", State: idem.StatePending,
					Method: http.MethodPost, URL: "http://127.0.0.1/" + op,
					Header:  http.Header{"Content-Type": {"application/json"}, "X-Step": {fmt.Sprint(step)}},
					Body:    bytes.Repeat([]byte{c}, 1+int(c&0x1f)*int(c&0x1f)*64), // up to 60 KiB
					Created: now, Updated: now, Attempts: 1, Holder: holder, LeaseUntil: now.Add(time.Minute)}
				if c&0x40 != 0 {
					r.Header.Set("Authorization", "secret")
				}
				if c&0x80 != 0 {
					r.Body = nil
				}
				r.BodySize = int64(len(r.Body))
				got, created, err := j.Begin(ctx, r)
				old, ok := m[op]
				wantCreated := !ok || old.State == idem.StateAbandoned
				if err != nil || created != wantCreated {
					t.Fatalf("%s: Begin created %v, %v; want %v", what, created, err, wantCreated)
				}
				if wantCreated {
					r.Header = idem.PublicHeader(r.Header)
					m[op] = clone(r)
				}
				same(t, what+": Begin", got, m[op])
			case 2: // Acquire
				got, err := j.Acquire(ctx, op, holders[1+int(c>>5)%2], now, time.Duration(c%5)*time.Second)
				r, ok := m[op]
				switch {
				case !ok:
					wantErr(t, what+": Acquire", err, idem.ErrNotFound)
					continue
				case !r.CanLease(holders[1+int(c>>5)%2], now):
					wantErr(t, what+": Acquire", err, idem.ErrLeased)
				default:
					wantErr(t, what+": Acquire", err, nil)
					r.Holder, r.LeaseUntil = holders[1+int(c>>5)%2], now.Add(time.Duration(c%5)*time.Second)
					m[op] = r
				}
				same(t, what+": Acquire", got, m[op])
			case 3, 4: // Update, or Defer
				ch := idem.Change{Now: now, Attempts: int(c % 3), LastStatus: 200 + int(c), Release: c&0x10 != 0}
				switch c % 5 {
				case 0:
					ch.State = idem.StateDone
				case 1:
					ch.State = idem.StateAbandoned
				case 2:
					ch.LastError, ch.Note, ch.NextAttempt = "reset", "why", now.Add(time.Hour)
				case 3:
					ch.State = idem.State("custom")
				}
				r, ok := m[op]
				fenced := ok && holder != "" && r.Holder != holder
				if ok && !fenced {
					ch.Apply(&r)
					m[op] = r
				}
				if c%8 == 4 {
					if err := j.Defer(op, holder, ch); err != nil {
						t.Fatalf("%s: Defer: %v", what, err)
					}
					continue
				}
				got, err := j.Update(ctx, op, holder, ch)
				switch {
				case !ok:
					wantErr(t, what+": Update", err, idem.ErrNotFound)
				case fenced:
					wantErr(t, what+": Update", err, idem.ErrLeaseLost)
					same(t, what+": Update", got, m[op])
				default:
					wantErr(t, what+": Update", err, nil)
					same(t, what+": Update", got, m[op])
				}
			case 5: // Forget
				err := j.Forget(ctx, op)
				if _, ok := m[op]; ok {
					wantErr(t, what+": Forget", err, nil)
					delete(m, op)
				} else {
					wantErr(t, what+": Forget", err, idem.ErrNotFound)
				}
			case 6: // Prune, limited to c>>6 records (0: no limit)
				limit := int(c >> 6)
				before := now.Add(-time.Duration(c>>3%4) * time.Second)
				n, err := j.Prune(ctx, before, limit)
				eligible := 0
				for _, r := range m {
					if idem.Prunable(r.State) && r.Updated.Before(before) {
						eligible++
					}
				}
				want := eligible
				if limit > 0 && limit < want {
					want = limit
				}
				if err != nil || n != want {
					t.Fatalf("%s: Prune = %d, %v; want %d", what, n, err, want)
				}
				// Which ones went depends on the jar's order: learn it.
				for _, name := range slices.Sorted(maps.Keys(m)) {
					if _, err := j.Get(ctx, name); errors.Is(err, idem.ErrNotFound) {
						r := m[name]
						if !idem.Prunable(r.State) || !r.Updated.Before(before) {
							t.Fatalf("%s: Prune deleted %q, state %s, updated %v", what, name, r.State, r.Updated)
						}
						delete(m, name)
					}
				}
			case 7: // Get and List
				got, err := j.Get(ctx, op)
				if r, ok := m[op]; ok {
					wantErr(t, what+": Get", err, nil)
					same(t, what+": Get", got, r)
				} else {
					wantErr(t, what+": Get", err, idem.ErrNotFound)
				}
				f := idem.Filter{State: []idem.State{"", idem.StatePending, idem.StateDone}[int(c>>3)%3], Limit: int(c >> 6)}
				list, err := j.List(ctx, f)
				var want []idem.Record
				for _, r := range m {
					if f.Match(r) {
						want = append(want, r)
					}
				}
				slices.SortFunc(want, func(a, b idem.Record) int {
					if c := a.Created.Compare(b.Created); c != 0 {
						return c
					}
					return strings.Compare(a.Op, b.Op)
				})
				if f.Limit > 0 && len(want) > f.Limit {
					want = want[:f.Limit]
				}
				if err != nil || len(list) != len(want) {
					t.Fatalf("%s: List(%+v) = %d records, %v; want %d", what, f, len(list), err, len(want))
				}
				for i := range list {
					same(t, what+": List", list[i], want[i])
				}
			}
		}
	})
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
		t.Fatalf("%s: err = %v; want %v", what, err, want)
	}
}

// same fails unless got is want, times compared with Equal.
func same(t *testing.T, what string, got, want idem.Record) {
	t.Helper()
	eq := func(a, b time.Time) bool { return a.Equal(b) }
	g, w := got, want
	if !eq(g.Created, w.Created) || !eq(g.Updated, w.Updated) || !eq(g.NextAttempt, w.NextAttempt) || !eq(g.LeaseUntil, w.LeaseUntil) {
		t.Fatalf("%s: times %v %v %v %v; want %v %v %v %v", what, g.Created, g.Updated, g.NextAttempt, g.LeaseUntil,
			w.Created, w.Updated, w.NextAttempt, w.LeaseUntil)
	}
	g.Created, g.Updated, g.NextAttempt, g.LeaseUntil = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	w.Created, w.Updated, w.NextAttempt, w.LeaseUntil = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !bytes.Equal(g.Body, w.Body) || (g.Body == nil) != (w.Body == nil) {
		t.Fatalf("%s: body of %d bytes (nil %v); want %d (nil %v)", what, len(g.Body), g.Body == nil, len(w.Body), w.Body == nil)
	}
	g.Body, w.Body = nil, nil
	if len(g.Header) == 0 && len(w.Header) == 0 {
		g.Header, w.Header = nil, nil
	}
	if fmt.Sprint(g) != fmt.Sprint(w) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}
