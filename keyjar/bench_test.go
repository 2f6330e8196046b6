package keyjar_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/keyjar"
)

// BenchmarkBegin measures a durable key creation, alone and with 32
// concurrent callers, with group commit and without it (MaxBatch 1).
func BenchmarkBegin(b *testing.B) {
	for _, c := range []struct {
		name     string
		callers  int
		maxBatch int
	}{
		{"callers=1", 1, 0},
		{"callers=32", 32, 0},
		{"callers=32/no-group-commit", 32, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			j, err := keyjar.Open(b.Context(), b.TempDir()+"/keys.db", &keyjar.Options{MaxBatch: c.maxBatch})
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			var n atomic.Int64
			begin := func() bool {
				op := fmt.Sprint("op-", n.Add(1))
				if _, _, err := j.Begin(b.Context(), newRecord(op)); err != nil {
					b.Error(err)
					return false
				}
				return true
			}
			b.ResetTimer()
			if c.callers == 1 {
				for b.Loop() {
					if !begin() {
						return
					}
				}
				return
			}
			// RunParallel starts parallelism × GOMAXPROCS goroutines.
			b.SetParallelism(max(1, c.callers/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() && begin() {
				}
			})
		})
	}
}
