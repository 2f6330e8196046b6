package storetest

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/testserver"
)

// RunCallers times op in a benchmark, with callers concurrent callers: a
// serial loop for 1, b.RunParallel with callers goroutines otherwise (rounded
// up to a multiple of GOMAXPROCS). Each call gets a key never used before in
// this run ("key-1", "key-2", …) and a fence unique to it, so that a claim
// always inserts. ns/op is wall time per call, the inverse of throughput.
func RunCallers(b *testing.B, callers int, op func(ctx context.Context, key string, f testserver.Fence) error) {
	b.Helper()
	ctx := context.Background()
	var seq atomic.Int64
	next := func() error {
		n := seq.Add(1)
		return op(ctx, "key-"+strconv.FormatInt(n, 10), testserver.Fence{Token: n, ClaimID: "claim-" + strconv.FormatInt(n, 10)})
	}
	if callers <= 1 {
		for b.Loop() {
			if err := next(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((callers + procs - 1) / procs)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := next(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
