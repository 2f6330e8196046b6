package idem

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/idemkit/idem/internal/secrethdr"
)

// Filter selects records for a jar's List method, which returns them in
// List's order: oldest Created first (the zero time first), then by Op,
// bytewise.
//
// List pages through a jar with After, as a database's seek method does: a
// page ends with a record, and the next page begins after its position.
//
//	f := idem.Filter{State: idem.StatePending, Limit: 1000}
//	for {
//		page, err := jar.List(ctx, f)
//		if err != nil {
//			return err
//		}
//		for _, r := range page {
//			// …
//		}
//		if len(page) < f.Limit {
//			break
//		}
//		f.After = page[len(page)-1].Cursor()
//	}
//
// A position is not a record: a record that is deleted (forgotten, pruned)
// between two pages, the one the cursor was taken from included, leaves the
// walk as it is, and one created meanwhile is listed when its position is
// after the cursor. A record whose state changes between two pages is
// listed, or not, as it is when its page is read.
type Filter struct {
	// State keeps only the records of this state; "" keeps every state.
	// The jars of this module refuse one that is neither "" nor Valid
	// (ErrInvalidRecord, keyjar.ErrInvalid, pgjar.ErrInvalid) rather than
	// list nothing: "Pending" is a typo, not a state without records.
	State State
	Limit int // at most this many; 0 or less means no limit
	// After keeps only the records strictly after this position in
	// List's order; the zero Cursor keeps them all. Record.Cursor gives a
	// record's position, and a Cursor with a Created and no Op (which no
	// record has) begins at that time: it keeps the records created then
	// or later.
	After Cursor
}

// Match reports whether r passes the filter's state test and comes after
// its After. Limit is not a test of one record.
func (f Filter) Match(r Record) bool {
	return (f.State == "" || r.State == f.State) && (f.After.IsZero() || f.After.Compare(r.Cursor()) < 0)
}

// A Cursor is a position in List's order (see Filter): a record's Created
// and Op. A record returned by any jar's List is exactly at its Cursor in
// that jar, which keeps Created to the nanosecond.
type Cursor struct {
	Created time.Time
	Op      string
}

// Cursor returns r's position in List's order, for Filter.After.
func (r Record) Cursor() Cursor { return Cursor{Created: r.Created, Op: r.Op} }

// IsZero reports whether c is the zero Cursor, before every record.
func (c Cursor) IsZero() bool { return c.Created.IsZero() && c.Op == "" }

// Compare compares c and d in List's order: -1 when c comes first, +1 when
// d does, 0 when they are the same position. Times are compared as
// instants (time.Time.Compare: the zero time, in the year 1, comes before
// every later one), names bytewise (strings.Compare).
func (c Cursor) Compare(d Cursor) int {
	if n := c.Created.Compare(d.Created); n != 0 {
		return n
	}
	return strings.Compare(c.Op, d.Op)
}

// Prunable reports whether a record in state s may be deleted by Prune:
// only operations whose outcome is known or given up (done, failed,
// abandoned). Pending and reconcile records are kept until resolved.
func Prunable(s State) bool {
	return s == StateDone || s == StateFailed || s == StateAbandoned
}

// MemoryJar is a Jar that keeps records in memory: for tests, benchmarks and
// programs that accept losing their keys on exit. The zero value is ready to
// use. It is safe for concurrent use. It is also a Deferrer, whose changes
// are applied before Defer returns.
//
// A MemoryJar keeps every operation until Forget, ForgetKey or Prune
// deletes it, in a form the garbage collector does not walk: a map without
// pointers, from a hash of the operation's name to a slot in arrays of the
// changeable fields, and the fields Begin sets once encoded in large byte
// slices. A map of Records would make each collection mark about five
// objects per operation kept. The strings that change (LastError, Note,
// Holder) are kept apart, for the operations that have any, which are
// mostly those being sent. The bytes of deleted records are given back
// once they outnumber the live ones; the index and the slots, as a Go map
// does, keep the size of the most records the jar held at once (about 200
// bytes a record).
type MemoryJar struct {
	mu     sync.Mutex
	seed   maphash.Seed
	hash   func(op string) uint64 // nil: maphash with seed; tests set it to force collisions
	index  map[uint64]uint32      // the hash of an op → its slot
	spill  map[string]uint32      // ops whose hash another op holds in index: rare
	slots  [][]memRecord          // the records, in blocks of blockSize
	used   uint32                 // slots ever used: the others are past it in the last block
	free   []uint32               // slots of deleted records, to use again
	extra  map[uint32]memStrings  // the changeable strings of the slots that have any
	chunks [][]byte               // the records' fixed fields; bytes once written never change
	open   int                    // the chunk that short records are added to while it has room; none when past the end
	live   int                    // bytes in chunks that belong to a record
	dead   int                    // bytes in chunks that belong to no record
}

var (
	_ Jar      = (*MemoryJar)(nil)
	_ Deferrer = (*MemoryJar)(nil)
)

// ErrInvalidRecord is returned by MemoryJar.Begin for a record without Op or
// Key or with a State that is not valid, and by MemoryJar.Update and
// MemoryJar.Defer for a Change whose State is neither "" nor valid. Nothing
// is written. The durable jars refuse the same input with their own
// ErrInvalid (and, unlike a MemoryJar, times they cannot store).
var ErrInvalidRecord = errors.New("idem: invalid record")

// memRecord is a record as a MemoryJar keeps it, without a pointer: the
// fields Begin sets once are encoded at head; the changeable ones are here,
// but for their strings, which are in MemoryJar.extra when any is not "". A
// free slot has a zero head.
type memRecord struct {
	head                 place
	state                uint8 // its index in states
	strings              bool  // the slot has an entry in MemoryJar.extra
	attempts, lastStatus int
	updated, next, lease stamp
}

// place is where bytes lie in MemoryJar.chunks.
type place struct{ chunk, off, n int }

// stamp is a time.Time without its location and monotonic reading.
type stamp struct {
	sec  int64
	nsec int32
}

func stampOf(t time.Time) stamp { return stamp{t.Unix(), int32(t.Nanosecond())} }

func (s stamp) time() time.Time {
	if t := time.Unix(s.sec, int64(s.nsec)); !t.IsZero() {
		return t
	}
	return time.Time{}
}

type memStrings struct{ lastError, note, holder string }

// states are the valid states, the only ones Begin and Update accept.
var states = [...]State{StatePending, StateDone, StateFailed, StateReconcile, StateAbandoned}

const (
	// chunkSize is the size of each slice of MemoryJar.chunks; a record
	// longer than half of it gets one of its own, of its size.
	chunkSize = 256 << 10
	// blockSize is the number of slots in each slice of MemoryJar.slots.
	blockSize = 1024
)

// lock takes j.mu and readies the zero value. The methods below, up to
// Begin, are called with j.mu held.
func (j *MemoryJar) lock() {
	j.mu.Lock()
	if j.index == nil {
		j.seed = maphash.MakeSeed()
		j.index = make(map[uint64]uint32)
		j.spill = make(map[string]uint32)
		j.extra = make(map[uint32]memStrings)
	}
}

func (j *MemoryJar) sum(op string) uint64 {
	if j.hash != nil {
		return j.hash(op)
	}
	return maphash.String(j.seed, op)
}

func (j *MemoryJar) slot(i uint32) *memRecord { return &j.slots[i/blockSize][i%blockSize] }

// find returns the slot of op's record.
func (j *MemoryJar) find(op string) (i uint32, m *memRecord, ok bool) {
	if i, ok := j.index[j.sum(op)]; ok {
		if m := j.slot(i); j.opAt(m.head) == op {
			return i, m, true
		}
	}
	if i, ok = j.spill[op]; ok {
		return i, j.slot(i), true
	}
	return 0, nil, false
}

// insert adds a record for op, which has none, at head, and returns its
// slot. Recently freed slots are used first: they are the likeliest to be
// in the processor's cache.
func (j *MemoryJar) insert(op string, head place) (uint32, *memRecord) {
	var i uint32
	if n := len(j.free); n > 0 {
		i, j.free = j.free[n-1], j.free[:n-1]
	} else {
		if j.used%blockSize == 0 {
			j.slots = append(j.slots, make([]memRecord, blockSize))
		}
		i = j.used
		j.used++
	}
	h := j.sum(op)
	if _, taken := j.index[h]; taken {
		j.spill[op] = i
	} else {
		j.index[h] = i
	}
	m := j.slot(i)
	*m = memRecord{head: head}
	return i, m
}

// remove deletes op's record, at slot i.
func (j *MemoryJar) remove(op string, i uint32) {
	if h := j.sum(op); j.holds(h, i) {
		delete(j.index, h)
	} else {
		delete(j.spill, op)
	}
	m := j.slot(i)
	if m.strings {
		delete(j.extra, i)
	}
	j.live -= m.head.n
	j.dead += m.head.n
	*m = memRecord{}
	j.free = append(j.free, i)
}

func (j *MemoryJar) holds(h uint64, i uint32) bool {
	k, ok := j.index[h]
	return ok && k == i
}

// setTail sets the changeable fields of the record at slot i from r.
func (j *MemoryJar) setTail(i uint32, m *memRecord, r *Record) {
	for k, s := range states {
		if r.State == s {
			m.state = uint8(k)
		}
	}
	m.attempts, m.lastStatus = r.Attempts, r.LastStatus
	m.updated, m.next, m.lease = stampOf(r.Updated), stampOf(r.NextAttempt), stampOf(r.LeaseUntil)
	had := m.strings
	m.strings = r.LastError != "" || r.Note != "" || r.Holder != ""
	switch {
	case m.strings:
		j.extra[i] = memStrings{lastError: r.LastError, note: r.Note, holder: r.Holder}
	case had:
		delete(j.extra, i)
	}
}

// tail sets r's changeable fields from the record at slot i.
func (j *MemoryJar) tail(i uint32, m *memRecord, r *Record) {
	var x memStrings
	if m.strings {
		x = j.extra[i]
	}
	r.State = states[m.state]
	r.Attempts, r.LastStatus = m.attempts, m.lastStatus
	r.Updated, r.NextAttempt, r.LeaseUntil = m.updated.time(), m.next.time(), m.lease.time()
	r.LastError, r.Note, r.Holder = x.lastError, x.note, x.holder
}

// record returns the record at slot i, as a copy that its caller owns.
func (j *MemoryJar) record(i uint32, m *memRecord) Record {
	var r Record
	d := decoder{b: j.bytes(m.head)}
	d.head(&r)
	j.tail(i, m, &r)
	return r
}

func (j *MemoryJar) bytes(p place) []byte { return j.chunks[p.chunk][p.off : p.off+p.n] }

// opAt returns the name of the record whose head is at p. The string shares
// the memory of chunks: it must not be kept after j.mu is released.
func (j *MemoryJar) opAt(p place) string {
	d := decoder{b: j.bytes(p)}
	b := d.bytes()
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// keyAt returns the key of the record whose head is at p, as opAt returns
// its op: valid while the chunk is, under the lock.
func (j *MemoryJar) keyAt(p place) string {
	d := decoder{b: j.bytes(p)}
	d.bytes() // the op
	b := d.bytes()
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// createdAt returns the Created of the record whose head is at p, without
// decoding its other fields (see decoder.head).
func (j *MemoryJar) createdAt(p place) stamp {
	d := decoder{b: j.bytes(p)}
	for range 5 { // Op, Key, Fingerprint, Method, URL
		d.bytes()
	}
	d.varint() // BodySize
	sec := d.varint()
	return stamp{sec, int32(d.uvarint())}
}

// place copies b, a record's fields that Begin sets once, into chunks. A
// record longer than half a chunk gets a chunk of its own, and the chunk
// that the shorter ones fill stays open: had the long record ended it,
// what the chunk had left would be lost, up to as much again as the jar
// holds.
func (j *MemoryJar) place(b []byte) place {
	n := len(b)
	at := j.open
	switch {
	case n > chunkSize/2:
		j.chunks = append(j.chunks, make([]byte, 0, n))
		at = len(j.chunks) - 1
	case at >= len(j.chunks) || cap(j.chunks[at])-len(j.chunks[at]) < n:
		j.chunks = append(j.chunks, make([]byte, 0, chunkSize))
		at = len(j.chunks) - 1
		j.open = at
	}
	p := place{chunk: at, off: len(j.chunks[at]), n: n}
	j.chunks[at] = append(j.chunks[at], b...)
	j.live += n
	return p
}

// compact copies the records into new chunks once most of the bytes of
// chunks belong to none: after deletions, so that the memory follows what
// the jar holds. A copy costs the bytes kept, and the deletions that
// trigger the next one are at least as many.
func (j *MemoryJar) compact() {
	if j.dead < chunkSize || j.dead < j.live {
		return
	}
	old := j.chunks
	j.chunks, j.open, j.live, j.dead = nil, 0, 0, 0
	for b := range j.slots {
		for k := range j.slots[b] {
			if m := &j.slots[b][k]; m.head.n > 0 {
				m.head = j.place(old[m.head.chunk][m.head.off : m.head.off+m.head.n])
			}
		}
	}
}

// each calls fn with the name, slot and record of each operation, until fn
// returns false. The name shares the memory of chunks. fn may remove the
// record it is given.
func (j *MemoryJar) each(fn func(op string, i uint32, m *memRecord) bool) {
	for b, block := range j.slots {
		for k := range block {
			i := uint32(b*blockSize + k)
			if i >= j.used {
				return
			}
			m := &block[k]
			if m.head.n == 0 {
				continue // free
			}
			if !fn(j.opAt(m.head), i, m) {
				return
			}
		}
	}
}

// The encoding of the fields Begin sets once: a string or byte slice is its
// length as a uvarint and its bytes; a nil body is length 0 and a body of n
// bytes n+1. A time is its Unix seconds as a varint and its nanoseconds as
// a uvarint. A header is its number of names (4 bytes, little-endian), then
// each name, its number of values as a uvarint and its values: a name
// without values is kept, as the other jars keep it (net/http sends no
// User-Agent for one, where it sends its own for no name), and a
// credential's name (SecretHeader) has none.

func encodeHead(b []byte, r *Record) (_ []byte, dropped bool) {
	b = appendString(b, r.Op)
	b = appendString(b, r.Key)
	b = appendString(b, r.Fingerprint)
	b = appendString(b, r.Method)
	b = appendString(b, r.URL)
	b = binary.AppendVarint(b, r.BodySize)
	c := stampOf(r.Created)
	b = binary.AppendUvarint(binary.AppendVarint(b, c.sec), uint64(c.nsec))
	if r.Body == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(r.Body))+1)
		b = append(b, r.Body...)
	}
	at := len(b)
	b = binary.LittleEndian.AppendUint32(b, 0) // the number of names, set below
	n := 0
	for name, vs := range r.Header {
		if SecretHeader(name) {
			// Its name, with no values (see Record.Withheld).
			dropped = dropped || len(vs) > 0
			vs = nil
		}
		b = binary.AppendUvarint(appendString(b, name), uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
		n++
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(n))
	return b, dropped
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// decoder reads what encodeHead wrote. It trusts its input, which only
// encodeHead produces.
type decoder struct{ b []byte }

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := int(d.uvarint())
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// string returns a copy of the next string.
func (d *decoder) string() string { return string(d.bytes()) }

func (d *decoder) head(r *Record) {
	r.Op, r.Key, r.Fingerprint = d.string(), d.string(), d.string()
	r.Method, r.URL = d.string(), d.string()
	r.BodySize = d.varint()
	sec := d.varint()
	r.Created = stamp{sec, int32(d.uvarint())}.time()
	if n := d.uvarint(); n > 0 {
		r.Body = slices.Clone(d.b[: n-1 : n-1])
		d.b = d.b[n-1:]
	}
	n := int(binary.LittleEndian.Uint32(d.b))
	d.b = d.b[4:]
	r.Header = make(http.Header, n)
	for range n {
		name := d.string()
		var vs []string
		if k := int(d.uvarint()); k > 0 {
			vs = make([]string, k)
			for i := range vs {
				vs[i] = d.string()
			}
		}
		r.Header[name] = vs
	}
}

// Begin implements Jar. An empty State means StatePending. It returns
// ErrInvalidRecord for a record without Op or Key or with a State that is not
// valid.
func (j *MemoryJar) Begin(ctx context.Context, r Record) (Record, bool, error) {
	if r.Op == "" || r.Key == "" {
		return Record{}, false, fmt.Errorf("%w: empty Op or Key (op %q)", ErrInvalidRecord, r.Op)
	}
	if r.State == "" {
		r.State = StatePending
	}
	if !r.State.Valid() {
		return Record{}, false, fmt.Errorf("%w: op %q: state %q", ErrInvalidRecord, r.Op, r.State)
	}
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	// Encoded before the lock is taken, to hold it for less time.
	var buf [512]byte
	b, dropped := encodeHead(buf[:0], &r)
	j.lock()
	defer j.mu.Unlock()
	if i, m, ok := j.find(r.Op); ok {
		if states[m.state] != StateAbandoned {
			return j.record(i, m), false, nil
		}
		j.remove(r.Op, i)
	}
	i, m := j.insert(r.Op, j.place(b))
	j.setTail(i, m, &r)
	j.compact()
	switch {
	case dropped:
		r.Header = secrethdr.Withhold(r.Header) // the record as kept
	case r.Header == nil:
		r.Header = http.Header{} // as Get returns it
	}
	return r, true, nil // its Header and Body are the caller's, as given
}

// Get implements Jar.
func (j *MemoryJar) Get(ctx context.Context, op string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.lock()
	defer j.mu.Unlock()
	i, m, ok := j.find(op)
	if !ok {
		return Record{}, ErrNotFound
	}
	return j.record(i, m), nil
}

// Acquire implements Jar.
func (j *MemoryJar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.lock()
	defer j.mu.Unlock()
	i, m, ok := j.find(op)
	if !ok {
		return Record{}, ErrNotFound
	}
	var r Record
	j.tail(i, m, &r)
	if !r.CanLease(holder, now) {
		return j.record(i, m), ErrLeased
	}
	r.Holder, r.LeaseUntil = holder, now.Add(ttl)
	j.setTail(i, m, &r)
	return j.record(i, m), nil
}

// Update implements Jar. It returns ErrInvalidRecord for a c.State that is
// neither "" nor valid.
func (j *MemoryJar) Update(ctx context.Context, op, holder string, c Change) (Record, error) {
	if err := checkChange(op, c); err != nil {
		return Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	j.lock()
	defer j.mu.Unlock()
	i, m, ok := j.find(op)
	if !ok {
		return Record{}, ErrNotFound
	}
	err := j.update(i, m, holder, c)
	return j.record(i, m), err
}

// Defer implements Deferrer: it applies c at once, as Update does. It
// returns ErrInvalidRecord for a c.State that is neither "" nor valid, and
// otherwise nil: a change that Update would refuse as fenced off or for an
// unknown op is dropped.
func (j *MemoryJar) Defer(op, holder string, c Change) error {
	if err := checkChange(op, c); err != nil {
		return err
	}
	j.lock()
	defer j.mu.Unlock()
	if i, m, ok := j.find(op); ok {
		_ = j.update(i, m, holder, c)
	}
	return nil
}

// checkChange returns ErrInvalidRecord for a change whose State is neither ""
// nor valid.
func checkChange(op string, c Change) error {
	if c.State != "" && !c.State.Valid() {
		return fmt.Errorf("%w: op %q: state %q", ErrInvalidRecord, op, c.State)
	}
	return nil
}

// update applies c to the record at slot i, fenced by holder.
func (j *MemoryJar) update(i uint32, m *memRecord, holder string, c Change) error {
	var r Record
	j.tail(i, m, &r)
	if holder != "" && r.Holder != holder {
		return ErrLeaseLost
	}
	c.Apply(&r)
	j.setTail(i, m, &r)
	return nil
}

// List returns the records that pass f, oldest Created first, then by Op.
// It has no index: each call reads the state, Created and Op of every
// record, under the jar's lock, and keeps the first f.Limit that pass (all
// of them without a limit, sorted); it decodes only the records it
// returns. A page of 1000 of 300 000 records takes a walk of them all.
func (j *MemoryJar) List(ctx context.Context, f Filter) ([]Record, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("%w: Filter.State %q is no state", ErrInvalidRecord, f.State)
	}
	return j.collect(ctx, f.After, f.Limit, func(_ uint32, m *memRecord) bool {
		return f.State == "" || states[m.state] == f.State
	})
}

// ByKey returns the records whose Key is key, oldest Created first, then
// by Op: usually one, more when a caller sent the same Idempotency-Key
// under several names. It reads every record: it is for tools that look up
// the key a server logged, not for a request's path.
func (j *MemoryJar) ByKey(ctx context.Context, key string) ([]Record, error) {
	return j.collect(ctx, Cursor{}, 0, func(_ uint32, m *memRecord) bool { return j.keyAt(m.head) == key })
}

// position is a record's place in List's order, and its slot: what
// collect sorts before it decodes any record. op shares the memory of
// chunks, as opAt's result does.
type position struct {
	created stamp
	op      string
	i       uint32
}

func (p position) compare(q position) int {
	if c := cmp.Compare(p.created.sec, q.created.sec); c != 0 {
		return c
	}
	if c := cmp.Compare(p.created.nsec, q.created.nsec); c != 0 {
		return c
	}
	return strings.Compare(p.op, q.op)
}

// siftDown moves h[k] down the max-heap h to its place.
func siftDown(h []position, k int) {
	for {
		c := 2*k + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].compare(h[c]) > 0 {
			c++
		}
		if h[k].compare(h[c]) >= 0 {
			return
		}
		h[k], h[c] = h[c], h[k]
		k = c
	}
}

// collect returns the records that keep accepts and that come after
// after, oldest Created first, then by Op; at most limit of them when limit
// > 0. keep sees a record before it is decoded, under the lock, and only
// the records returned are decoded.
func (j *MemoryJar) collect(ctx context.Context, after Cursor, limit int, keep func(i uint32, m *memRecord) bool) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	from := position{created: stampOf(after.Created), op: after.Op}
	j.lock()
	defer j.mu.Unlock()
	// With a limit, found keeps the first limit positions seen so far as a
	// heap whose root is the last of them: a page of a large jar costs a
	// walk, not a sort of every record.
	var found []position
	j.each(func(op string, i uint32, m *memRecord) bool {
		if !keep(i, m) {
			return true
		}
		p := position{created: j.createdAt(m.head), op: op, i: i}
		switch {
		case !after.IsZero() && from.compare(p) >= 0:
		case limit <= 0 || len(found) < limit:
			found = append(found, p)
			if len(found) == limit {
				for k := limit/2 - 1; k >= 0; k-- {
					siftDown(found, k)
				}
			}
		case p.compare(found[0]) < 0:
			found[0] = p
			siftDown(found, 0)
		}
		return true
	})
	slices.SortFunc(found, position.compare)
	var out []Record
	for _, p := range found {
		out = append(out, j.record(p.i, j.slot(p.i)))
	}
	return out, nil
}

// Forget deletes op, whatever its state. It returns ErrNotFound for an
// unknown op.
func (j *MemoryJar) Forget(ctx context.Context, op string) error {
	return j.forget(ctx, op, func(*memRecord) bool { return true })
}

// ForgetKey deletes op only if its record has key and is not pending: the
// check and the deletion are one step under the jar's lock, so a record
// that Begin put in place of an abandoned one, under a new key, is kept
// (client.KeyForgetter). It returns ErrNotFound for an unknown op and
// ErrNotForgotten, deleting nothing, for a record with another key or in
// StatePending.
func (j *MemoryJar) ForgetKey(ctx context.Context, op, key string) error {
	return j.forget(ctx, op, func(m *memRecord) bool {
		return j.keyAt(m.head) == key && states[m.state] != StatePending
	})
}

// forget deletes op when ok accepts its record, which it sees under the
// lock; otherwise it returns ErrNotForgotten.
func (j *MemoryJar) forget(ctx context.Context, op string, ok func(m *memRecord) bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.lock()
	defer j.mu.Unlock()
	i, m, found := j.find(op)
	if !found {
		return ErrNotFound
	}
	if !ok(m) {
		return ErrNotForgotten
	}
	j.remove(op, i)
	j.compact()
	return nil
}

// Prune deletes at most limit records whose state is Prunable and that were
// last updated before before, and returns how many it deleted. limit <= 0
// means no limit; under a limit, which records go first is not specified.
func (j *MemoryJar) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	j.lock()
	defer j.mu.Unlock()
	n := 0
	j.each(func(op string, i uint32, m *memRecord) bool {
		if limit > 0 && n >= limit {
			return false
		}
		var r Record
		j.tail(i, m, &r)
		if Prunable(r.State) && r.Updated.Before(before) {
			j.remove(op, i)
			n++
		}
		return true
	})
	j.compact()
	return n, nil
}
