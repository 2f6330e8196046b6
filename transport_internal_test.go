package idem

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/internal/keyhdr"
)

// Keys are random UUIDs, version 4, RFC 9562 variant, in the canonical
// text form; the names of unnamed operations are UUIDs version 7 that
// begin with the time in milliseconds, so that they sort by it. No two
// are alike.
func TestNewKeyIsUUIDv4(t *testing.T) {
	seen := make(map[string]bool)
	start := time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	prevOp := ""
	for i := range 100 {
		now := start.Add(time.Duration(i) * time.Millisecond)
		k, op, err := newKey(now)
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil || u.String() != k {
			t.Fatalf("key %q: not a canonical UUID (%v)", k, err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("key %q: version %d, variant %v; want 4, RFC 4122", k, u.Version(), u.Variant())
		}
		o, err := uuid.Parse(op)
		if err != nil || o.String() != op {
			t.Fatalf("op %q: not a canonical UUID (%v)", op, err)
		}
		if o.Version() != 7 || o.Variant() != uuid.RFC4122 {
			t.Fatalf("op %q: version %d, variant %v; want 7, RFC 4122", op, o.Version(), o.Variant())
		}
		if sec, nsec := o.Time().UnixTime(); time.Unix(sec, nsec).UnixMilli() != now.UnixMilli() {
			t.Fatalf("op %q holds the time %v; want %v", op, time.Unix(sec, nsec).UTC(), now)
		}
		if op <= prevOp {
			t.Fatalf("op %q, made a millisecond after %q, sorts before it", op, prevOp)
		}
		prevOp = op
		if seen[k] || seen[op] {
			t.Fatalf("key %q or op %q drawn twice", k, op)
		}
		seen[k], seen[op] = true, true
	}
}

// Holder ids are the process prefix, a random id and a counter that grows
// by one per call.
func TestNewHolderCountsCalls(t *testing.T) {
	a, err := NewHolder()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewHolder()
	if err != nil {
		t.Fatal(err)
	}
	// A call that generates its key takes its holder id with it.
	key, op, c, err := newIDs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(key); err != nil || u.String() != key || u.Version() != 4 {
		t.Fatalf("newIDs's key %q: want a UUID v4 (%v)", key, err)
	}
	if u, err := uuid.Parse(op); err != nil || u.String() != op || u.Version() != 7 {
		t.Fatalf("newIDs's name %q: want a UUID v7 (%v)", op, err)
	}
	prefix, _ := holderPrefix()
	if !strings.HasPrefix(prefix, processPrefix()+"/") || !strings.HasSuffix(prefix, ".") {
		t.Fatalf("prefix %q; want %q, a random id and a dot", prefix, processPrefix()+"/")
	}
	var last uint64
	for _, h := range []string{a, b, c} {
		n, err := strconv.ParseUint(strings.TrimPrefix(h, prefix), 10, 64)
		if !strings.HasPrefix(h, prefix) || err != nil || n <= last {
			t.Fatalf("holders %q, %q, %q; want %q followed by a growing counter", a, b, c, prefix)
		}
		last = n
	}
}

// TestKeyHeaderIsKeyhdrName: the header the Transport writes is the one
// keyhdr.Is and keyhdr.Delete recognise.
func TestKeyHeaderIsKeyhdrName(t *testing.T) {
	if KeyHeader != keyhdr.Name || !keyhdr.Is("idempotency-KEY") || keyhdr.Is("Idempotency-Keys") {
		t.Fatalf("KeyHeader %q, keyhdr.Name %q: want the same name, matched in any case and only whole", KeyHeader, keyhdr.Name)
	}
}
