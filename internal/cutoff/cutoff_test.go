package cutoff

import (
	"math"
	"testing"
	"time"
)

func TestNanos(t *testing.T) {
	first, last := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	for _, c := range []struct {
		before time.Time
		n      int64
		ok     bool
	}{
		{time.Time{}, 0, false},
		{first, 0, false},
		{first.Add(time.Nanosecond), math.MinInt64, true},
		{time.Unix(1_700_000_000, 0), 1_700_000_000_000_000_000 - 1, true},
		{last, math.MaxInt64 - 1, true},
		{last.Add(time.Nanosecond), math.MaxInt64, true},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64, true},
	} {
		if n, ok := Nanos(c.before); n != c.n || ok != c.ok {
			t.Errorf("Nanos(%v) = %d, %v; want %d, %v", c.before, n, ok, c.n, c.ok)
		}
	}
}
