package sqliteopt

import (
	"math"
	"testing"
	"time"
)

func TestBusyTimeoutMillis(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{5 * time.Second, 5000},
		{24 * 24 * time.Hour, 24 * 24 * 3600 * 1000},
		{30 * 24 * time.Hour, math.MaxInt32},
		{math.MaxInt64, math.MaxInt32},
	} {
		if got := BusyTimeoutMillis(tt.d); got != tt.want {
			t.Errorf("BusyTimeoutMillis(%v) = %d; want %d", tt.d, got, tt.want)
		}
	}
}
