package jartest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/secrethdr"
)

// testSequences runs Sequence with steps drawn from fixed seeds, on one jar
// that it empties after each.
func testSequences(t *testing.T, j Jar) {
	for seed := range uint64(6) {
		steps := make([]byte, 150)
		r := rand.New(rand.NewPCG(seed, 0x69646d6a))
		for i := range steps {
			steps[i] = byte(r.Uint32())
		}
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			sequence(t, j, steps, fmt.Sprintf("s%d-", seed))
			all, err := j.List(t.Context(), idem.Filter{})
			for _, r := range all {
				if err == nil {
					err = j.Forget(t.Context(), r.Op)
				}
			}
			if err != nil {
				t.Fatalf("emptying the jar: %v", err)
			}
		})
	}
}

// Sequence makes one call on j per byte of steps, the same on a plain map
// of records (the Jar contract at its simplest), and fails t at the first
// answer that differs: Begin, Acquire, Update, Defer (when j is an
// idem.Deferrer; Update otherwise), Forget, ForgetKey (when j is a
// KeyForgetter; Forget otherwise), Prune, Get and List (by state, after a
// position, with a limit), on six names of different lengths, with bodies
// of up to 60 KiB. j must be empty. A fuzz target can hand it its input.
func Sequence(t *testing.T, j Jar, steps []byte) { sequence(t, j, steps, "") }

func sequence(t *testing.T, j Jar, steps []byte, prefix string) {
	ctx := context.Background()
	m := map[string]idem.Record{}
	names := []string{"a", "bb", "cc", "ddd", "e", "ffff"}
	holders := []string{"", "h1", "h2"}
	base := time.Unix(1_700_000_000, 0)
	for step, c := range steps {
		op := prefix + names[int(c>>3)%len(names)]
		holder := holders[int(c>>5)%len(holders)]
		now := base.Add(time.Duration(step) * time.Second)
		what := fmt.Sprintf("step %d (%#02x) on %q", step, c, op)
		switch c % 8 {
		case 0, 1: // Begin, with a body of 1 B to 60 KiB, or none, and maybe a secret header
			r := idem.Record{Op: op, Key: fmt.Sprintf("k%d", step), Fingerprint: "fp", State: idem.StatePending,
				Method: http.MethodPost, URL: "http://127.0.0.1/" + op,
				Header:  http.Header{"Content-Type": {"application/json"}, "X-Step": {fmt.Sprint(step)}},
				Body:    bytes.Repeat([]byte{c}, 1+int(c&0x1f)*int(c&0x1f)*64),
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
			if want := !ok || old.State == idem.StateAbandoned; err != nil || created != want {
				t.Fatalf("%s: Begin created %v, %v; want %v", what, created, err, want)
			}
			if !ok || old.State == idem.StateAbandoned {
				r.Header = secrethdr.Withhold(r.Header)
				r.Body = bytes.Clone(r.Body)
				m[op] = r
			}
			expectSame(t, what+": Begin", got, m[op])
		case 2: // Acquire, for 0 to 4 s
			holder := holders[1+int(c>>5)%2]
			ttl := time.Duration(c%5) * time.Second
			got, err := j.Acquire(ctx, op, holder, now, ttl)
			r, ok := m[op]
			switch {
			case !ok:
				wantErr(t, what+": Acquire", err, idem.ErrNotFound)
				continue
			case !r.CanLease(holder, now):
				wantErr(t, what+": Acquire", err, idem.ErrLeased)
			default:
				wantErr(t, what+": Acquire", err, nil)
				r.Holder, r.LeaseUntil = holder, now.Add(ttl)
				m[op] = r
			}
			expectSame(t, what+": Acquire", got, m[op])
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
				ch.State = idem.StateFailed
			}
			r, ok := m[op]
			fenced := ok && holder != "" && r.Holder != holder
			if ok && !fenced {
				ch.Apply(&r)
				m[op] = r
			}
			if d, isDeferrer := j.(idem.Deferrer); isDeferrer && c%8 == 4 {
				if err := d.Defer(op, holder, ch); err != nil {
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
				expectSame(t, what+": Update", got, m[op])
			default:
				wantErr(t, what+": Update", err, nil)
				expectSame(t, what+": Update", got, m[op])
			}
		case 5: // Forget, or ForgetKey with the record's key or another
			if kf, isKF := j.(KeyForgetter); isKF && c&0x40 != 0 {
				r, ok := m[op]
				key := r.Key
				if c&0x80 != 0 {
					key = "another key"
				}
				err := kf.ForgetKey(ctx, op, key)
				switch {
				case !ok:
					wantErr(t, what+": ForgetKey", err, idem.ErrNotFound)
				case key != r.Key || r.State == idem.StatePending:
					wantErr(t, what+": ForgetKey", err, idem.ErrNotForgotten)
				default:
					wantErr(t, what+": ForgetKey", err, nil)
					delete(m, op)
				}
				continue
			}
			err := j.Forget(ctx, op)
			if _, ok := m[op]; ok {
				wantErr(t, what+": Forget", err, nil)
				delete(m, op)
			} else {
				wantErr(t, what+": Forget", err, idem.ErrNotFound)
			}
		case 6: // Prune at most c>>6 records (0: no limit) updated before now - 0 to 3 s
			limit := int(c >> 6)
			before := now.Add(-time.Duration(c>>3%4) * time.Second)
			n, err := j.Prune(ctx, before, limit)
			want := 0
			for _, r := range m {
				if idem.Prunable(r.State) && r.Updated.Before(before) {
					want++
				}
			}
			if limit > 0 && limit < want {
				want = limit
			}
			if err != nil || n != want {
				t.Fatalf("%s: Prune = %d, %v; want %d", what, n, err, want)
			}
			// Which ones, when limited, depends on the jar's order: learn it.
			for _, name := range slices.Sorted(maps.Keys(m)) {
				if _, err := j.Get(ctx, name); errors.Is(err, idem.ErrNotFound) {
					if r := m[name]; !idem.Prunable(r.State) || !r.Updated.Before(before) {
						t.Fatalf("%s: Prune deleted %q, state %s, updated %v", what, name, r.State, r.Updated)
					}
					delete(m, name)
				}
			}
		case 7: // Get, and List by state, at most c>>6 records, after op's position or a step's time
			got, err := j.Get(ctx, op)
			r, ok := m[op]
			if ok {
				wantErr(t, what+": Get", err, nil)
				expectSame(t, what+": Get", got, r)
			} else {
				wantErr(t, what+": Get", err, idem.ErrNotFound)
			}
			f := idem.Filter{State: []idem.State{"", idem.StatePending, idem.StateDone}[int(c>>3)%3], Limit: int(c >> 6)}
			switch {
			case c&0x20 == 0:
			case ok:
				f.After = r.Cursor()
			default:
				f.After = idem.Cursor{Created: base.Add(time.Duration(step/2) * time.Second), Op: op}
			}
			list, err := j.List(ctx, f)
			var want []idem.Record
			for _, r := range m {
				if f.Match(r) {
					want = append(want, r)
				}
			}
			slices.SortFunc(want, func(a, b idem.Record) int { return a.Cursor().Compare(b.Cursor()) })
			if f.Limit > 0 && len(want) > f.Limit {
				want = want[:f.Limit]
			}
			if err != nil || len(list) != len(want) {
				t.Fatalf("%s: List(%+v) = %d records, %v; want %d", what, f, len(list), err, len(want))
			}
			for i := range list {
				expectSame(t, what+": List", list[i], want[i])
			}
		}
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
		t.Fatalf("%s: err = %v; want %v", what, err, want)
	}
}

// expectSame fails t at once unless got is want, as diff compares them.
func expectSame(t *testing.T, what string, got, want idem.Record) {
	t.Helper()
	if d := diff(got, want); d != "" {
		if len(d) > 2000 {
			d = d[:2000] + "…"
		}
		t.Fatalf("%s: %s", what, d)
	}
}
