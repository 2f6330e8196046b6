// Package sqliteopt turns the options of this module's SQLite files
// (keyjar, sqlitestore) into what SQLite accepts.
package sqliteopt

import (
	"math"
	"time"
)

// BusyTimeoutMillis returns the busy_timeout pragma's value for a wait of d,
// which must be positive: SQLite reads it as a 32-bit count of
// milliseconds, where 0 (and so a wait under 1 ms, or one truncated to 32
// bits) means not to wait at all. A wait under 1 ms is 1 ms, and one above
// 2^31-1 ms (about 24.8 days), the longest SQLite can wait, is that.
func BusyTimeoutMillis(d time.Duration) int64 {
	return min(max(d.Milliseconds(), 1), math.MaxInt32)
}
