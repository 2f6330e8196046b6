package storetest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
)

// failingT records the failures of a test that is meant to fail, in place
// of t, whose test passes.
type failingT struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (ft *failingT) Errorf(format string, args ...any) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.failures = append(ft.failures, fmt.Sprintf(format, args...))
}

func (ft *failingT) Fatalf(format string, args ...any) {
	ft.Errorf(format, args...)
	runtime.Goexit()
}

func (ft *failingT) recorded() []string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return append([]string(nil), ft.failures...)
}

// hangingStore never claims key: its Claim returns only when its request
// ends.
type hangingStore struct {
	testserver.Store
	key string
}

func (s hangingStore) Claim(ctx context.Context, scope, key, fp string, f testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	if key == s.key {
		<-ctx.Done()
		return testserver.Entry{}, false, ctx.Err()
	}
	return s.Store.Claim(ctx, scope, key, fp, f, now)
}

// TestFleetEndsItsCallersWhenAStepFails: a step that fails (here the
// callers of an operation whose claim hangs) ends RunFleet's test at once,
// and its caller goroutines end before it: none is left to fail the test
// after it ended, which panics and hides the first failure. The failure
// reported is that step's alone.
func TestFleetEndsItsCallersWhenAStepFails(t *testing.T) {
	ft := &failingT{TB: t}
	store := hangingStore{Store: new(testserver.MemoryStore), key: "op-0"}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		runFleet(ft, func() testserver.Store { return store }, 200*time.Millisecond)
	}()
	<-returned
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, g := range strings.Split(stacks, "\n\n") {
		for _, frame := range []string{"storetest.(*fleet).call(", "storetest.(*fleet).inFlight(", "storetest.(*fleet).post("} {
			if strings.Contains(g, frame) {
				t.Errorf("a caller of the fleet still runs after its test ended:\n%s", g)
				break
			}
		}
	}
	failures := ft.recorded()
	if len(failures) != 1 || !strings.Contains(failures[0], "for the callers") {
		t.Errorf("failures %q; want the one of the callers' step", failures)
	}
}
