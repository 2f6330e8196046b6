// Package cutoff encodes a time for the queries that keep what is older
// than it, over times stored in Unix nanoseconds: "t <= n".
package cutoff

import (
	"math"
	"time"
)

// Nanos returns n, the last Unix nanosecond before before, for "t <= n",
// clamped into the range an int64 holds: after its last nanosecond (past
// 2262), that last, which every stored time is at or before. It returns
// false for a time at or before its first nanosecond (before 1678), which
// no stored time is before.
func Nanos(before time.Time) (n int64, ok bool) {
	if !before.After(time.Unix(0, math.MinInt64)) {
		return 0, false
	}
	if before.After(time.Unix(0, math.MaxInt64)) {
		return math.MaxInt64, true
	}
	return before.UnixNano() - 1, true
}
