package keyjar_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// TestListPagePlan: a page of List, after a cursor or from the start, is
// read in its order from an index, from the cursor on, and stops at the
// limit: no step sorts the matching records (a temporary B-tree) or reads
// the whole table. Without a State the index is the one on (created, op);
// with one, the one on (state, created, op), which reads the records of
// that state alone: a walk of the few pending ones among many done reads
// no done one.
func TestListPagePlan(t *testing.T) {
	j, _ := openTemp(t, nil)
	ctx := t.Context()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 200 {
		r := idem.Record{Op: fmt.Sprintf("op-%03d", i), Key: fmt.Sprint("k", i), State: idem.StatePending, Method: "POST",
			URL: "http://127.0.0.1/", Created: t0.Add(time.Duration(i%7) * time.Second), Updated: t0}
		if _, _, err := j.Begin(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.Update(ctx, "op-100", "", idem.Change{Now: t0, State: idem.StateDone}); err != nil {
		t.Fatal(err)
	}
	cursor := idem.Cursor{Created: t0.Add(3 * time.Second), Op: "op-100"}
	for _, c := range []struct {
		f    idem.Filter
		want string // in the plan's only step
	}{
		{idem.Filter{Limit: 1000}, "SCAN operations USING INDEX operations_by_created"},
		{idem.Filter{Limit: 1000, State: idem.StateDone}, "SEARCH operations USING INDEX operations_by_state_created (state=?)"},
		{idem.Filter{State: idem.StatePending}, "SEARCH operations USING INDEX operations_by_state_created (state=?)"},
		{idem.Filter{Limit: 1000, After: cursor}, "SEARCH operations USING INDEX operations_by_created ((created,op)>(?,?))"},
		{idem.Filter{Limit: 1000, After: cursor, State: idem.StatePending},
			"SEARCH operations USING INDEX operations_by_state_created (state=? AND (created,op)>(?,?))"},
		{idem.Filter{Limit: 1000, After: idem.Cursor{Op: "op-1"}}, "SCAN operations USING INDEX operations_by_created"},
		{idem.Filter{Limit: 1000, After: idem.Cursor{Op: "op-1"}, State: idem.StatePending},
			"SEARCH operations USING INDEX operations_by_state_created (state=?)"},
	} {
		plan, err := keyjar.ListPlan(ctx, j, c.f)
		if err != nil {
			t.Fatalf("plan of List(%+v): %v", c.f, err)
		}
		if len(plan) != 1 || plan[0] != c.want {
			t.Errorf("plan of List(%+v):\n\t%s\nwant one step: %s", c.f, strings.Join(plan, "\n\t"), c.want)
		}
	}
}

// TestRecordThatDoesNotDecode: Begin, Get, List, ByKey and Acquire of a
// record whose header is not the JSON the jar writes, or whose state is
// none of idem's (the table has no CHECK on it; another program may write
// one), return an *idem.RecordError holding the fields that decode (name,
// key, state and creation time), which matches ErrCorrupt, and ForgetKey
// deletes the record under that key. Under another key ForgetKey returns
// idem.ErrNotForgotten, as for any record, and keeps it; before, it
// returned the RecordError of the read that tells why nothing was deleted.
func TestRecordThatDoesNotDecode(t *testing.T) {
	for _, damage := range []struct {
		set   string
		state idem.State
	}{{"header = 'not json'", idem.StateDone}, {"state = 'bogus'", "bogus"}} {
		t.Run(damage.set, func(t *testing.T) {
			j, path := openTemp(t, nil)
			ctx := t.Context()
			t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
			r := idem.Record{Op: "op-1", Key: "k1", State: idem.StateDone, Method: "POST", URL: "http://127.0.0.1/",
				Header: http.Header{"Content-Type": {"application/json"}}, Created: t0, Updated: t0}
			if _, _, err := j.Begin(ctx, r); err != nil {
				t.Fatal(err)
			}
			if _, err := rawDB(t, path, "").Exec("UPDATE operations SET " + damage.set); err != nil {
				t.Fatal(err)
			}
			_, _, berr := j.Begin(ctx, r)
			_, gerr := j.Get(ctx, "op-1")
			_, lerr := j.List(ctx, idem.Filter{})
			_, kerr := j.ByKey(ctx, "k1")
			_, aerr := j.Acquire(ctx, "op-1", "h", t0, time.Minute)
			for what, err := range map[string]error{"Begin": berr, "Get": gerr, "List": lerr, "ByKey": kerr, "Acquire": aerr} {
				var re *idem.RecordError
				if !errors.As(err, &re) || !errors.Is(err, keyjar.ErrCorrupt) {
					t.Fatalf("%s of a record that does not decode: %v; want an *idem.RecordError matching ErrCorrupt", what, err)
				}
				if got := re.Record; got.Op != r.Op || got.Key != r.Key || got.State != damage.state || !got.Created.Equal(t0) || got.Header != nil {
					t.Errorf("%s: RecordError.Record = %+v; want op, key, state %q and creation time, no header", what, got, damage.state)
				}
			}
			if err := j.ForgetKey(ctx, "op-1", "other"); !errors.Is(err, idem.ErrNotForgotten) {
				t.Errorf("ForgetKey under another key of a record that does not decode: %v; want ErrNotForgotten", err)
			}
			if err := j.ForgetKey(ctx, "op-1", "k1"); err != nil {
				t.Fatalf("ForgetKey of a record that does not decode: %v", err)
			}
			if _, err := j.Get(ctx, "op-1"); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Get after ForgetKey: %v; want ErrNotFound", err)
			}
		})
	}
}
