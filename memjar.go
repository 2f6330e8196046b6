package idem

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Filter selects records for a jar's List method.
type Filter struct {
	State State // only this state; "" means every state
	Limit int   // at most this many; 0 means no limit
}

// Match reports whether r passes the filter's state test.
func (f Filter) Match(r Record) bool { return f.State == "" || r.State == f.State }

// Prunable reports whether a record in state s may be deleted by Prune:
// only operations whose outcome is known or given up (done, failed,
// abandoned). Pending and reconcile records are kept until resolved.
func Prunable(s State) bool {
	return s == StateDone || s == StateFailed || s == StateAbandoned
}

// MemoryJar is a Jar that keeps records in memory: for tests, benchmarks and
// programs that accept losing their keys on exit. The zero value is ready to
// use. It is safe for concurrent use.
type MemoryJar struct {
	mu  sync.Mutex
	ops map[string]*memRecord
}

var _ Jar = (*MemoryJar)(nil)

// memRecord is a Record as a MemoryJar keeps it: Header is nil and the
// header is flattened to name, value pairs in header. A map per record,
// kept for as long as the jar, is several objects that the garbage
// collector marks again in every cycle; one slice is one.
type memRecord struct {
	Record
	header []string
}

// newMemRecord keeps a copy of r without the headers SecretHeader names,
// and reports whether it dropped any.
func newMemRecord(r Record) (m *memRecord, dropped bool) {
	m = &memRecord{Record: r}
	m.Header, m.Body = nil, slices.Clone(r.Body)
	n := 0
	for _, vs := range r.Header {
		n += 2 * len(vs)
	}
	m.header = make([]string, 0, n)
	for name, vs := range r.Header {
		if SecretHeader(name) {
			dropped = true
			continue
		}
		for _, v := range vs {
			m.header = append(m.header, name, v)
		}
	}
	return m, dropped
}

// record returns a copy of the record that its caller owns.
func (m *memRecord) record() Record {
	r := m.Record
	r.Body = slices.Clone(r.Body)
	r.Header = make(http.Header, len(m.header)/2)
	for i := 0; i+1 < len(m.header); i += 2 {
		r.Header[m.header[i]] = append(r.Header[m.header[i]], m.header[i+1])
	}
	return r
}

// Begin implements Jar.
func (j *MemoryJar) Begin(ctx context.Context, r Record) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if old, ok := j.ops[r.Op]; ok && old.State != StateAbandoned {
		return old.record(), false, nil
	}
	if j.ops == nil {
		j.ops = make(map[string]*memRecord)
	}
	m, dropped := newMemRecord(r)
	j.ops[r.Op] = m
	if dropped {
		r.Header = PublicHeader(r.Header) // the record as kept
	}
	r.Body = slices.Clone(r.Body)
	return r, true, nil
}

// Get implements Jar.
func (j *MemoryJar) Get(ctx context.Context, op string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.ops[op]
	if !ok {
		return Record{}, ErrNotFound
	}
	return r.record(), nil
}

// Acquire implements Jar.
func (j *MemoryJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.ops[op]
	if !ok {
		return Record{}, ErrNotFound
	}
	if !r.CanLease(holder, now) {
		return r.record(), ErrLeased
	}
	r.Holder, r.LeaseUntil = holder, now.Add(ttl)
	return r.record(), nil
}

// Update implements Jar.
func (j *MemoryJar) Update(ctx context.Context, op, holder string, c Change) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.ops[op]
	if !ok {
		return Record{}, ErrNotFound
	}
	if holder != "" && r.Holder != holder {
		return r.record(), ErrLeaseLost
	}
	c.Apply(&r.Record)
	return r.record(), nil
}

// List returns the records that pass f, oldest Created first.
func (j *MemoryJar) List(ctx context.Context, f Filter) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	j.mu.Lock()
	var out []Record
	for _, r := range j.ops {
		if f.Match(r.Record) {
			out = append(out, r.record())
		}
	}
	j.mu.Unlock()
	slices.SortFunc(out, func(a, b Record) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Op, b.Op)
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Forget deletes op, whatever its state. It returns ErrNotFound for an
// unknown op.
func (j *MemoryJar) Forget(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.ops[op]; !ok {
		return ErrNotFound
	}
	delete(j.ops, op)
	return nil
}

// Prune deletes at most limit records whose state is Prunable and that were
// last updated before before, and returns how many it deleted. limit <= 0
// means no limit.
func (j *MemoryJar) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for op, r := range j.ops {
		if limit > 0 && n >= limit {
			break
		}
		if Prunable(r.State) && r.Updated.Before(before) {
			delete(j.ops, op)
			n++
		}
	}
	return n, nil
}
