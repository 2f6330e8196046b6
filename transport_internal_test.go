package idem

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// Keys are random UUIDs, version 4, RFC 9562 variant, in the canonical
// text form; no two are alike.
func TestNewKeyIsUUIDv4(t *testing.T) {
	seen := make(map[string]bool)
	for range 100 {
		k, err := newKey()
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
		if seen[k] {
			t.Fatalf("key %q drawn twice", k)
		}
		seen[k] = true
	}
}

// Holder ids are the process prefix, a random id and a counter that grows
// by one per call.
func TestNewHolderCountsCalls(t *testing.T) {
	a, err := newHolder()
	if err != nil {
		t.Fatal(err)
	}
	b, err := newHolder()
	if err != nil {
		t.Fatal(err)
	}
	prefix, _ := holderPrefix()
	if !strings.HasPrefix(prefix, processPrefix()+"/") || !strings.HasSuffix(prefix, ".") {
		t.Fatalf("prefix %q; want %q, a random id and a dot", prefix, processPrefix()+"/")
	}
	na, errA := strconv.ParseUint(strings.TrimPrefix(a, prefix), 10, 64)
	nb, errB := strconv.ParseUint(strings.TrimPrefix(b, prefix), 10, 64)
	if !strings.HasPrefix(a, prefix) || !strings.HasPrefix(b, prefix) || errA != nil || errB != nil || nb <= na {
		t.Fatalf("holders %q, %q; want %q followed by a growing counter", a, b, prefix)
	}
}
