// Package closetest races the Close of a store or jar against calls of
// every method, for the conformance suites keyjar/jartest and
// testserver/storetest.
package closetest

import (
	"errors"
	"sync"
	"testing"
)

// Racers is how many goroutines call while Close runs, and Rounds the most
// rounds of calls each makes before it sees the thing closed.
const (
	Racers = 8
	Rounds = 1000
)

// RacingClose calls close twice at once while Racers goroutines run
// round(g, i) for i = 0, 1, … until it fails; round returns nil after the
// usual results of every call it makes. It checks that one Close returns
// nil and the other errClosed, and that each goroutine stopped on
// errClosed: a call racing Close gets its usual result or errClosed,
// nothing else. what names the thing closed in messages.
func RacingClose(t *testing.T, what string, close func() error, round func(g, i int) error, errClosed error) {
	t.Helper()
	var started, done sync.WaitGroup
	errs := make(chan error, Racers)
	for g := range Racers {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			var err error
			for i := range Rounds {
				if err = round(g, i); i == 0 {
					started.Done()
				}
				if err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	started.Wait() // every goroutine is busy: Close comes among their calls
	closeErrs := make(chan error, 2)
	for range 2 {
		go func() { closeErrs <- close() }()
	}
	first, second := <-closeErrs, <-closeErrs
	if !(first == nil && errors.Is(second, errClosed) || second == nil && errors.Is(first, errClosed)) {
		t.Errorf("two Close calls at once = %v and %v; want nil and %v", first, second, errClosed)
	}
	done.Wait()
	for range Racers {
		switch err := <-errs; {
		case err == nil:
			t.Errorf("a goroutine made %d rounds of calls without seeing the %s closed", Rounds, what)
		case !errors.Is(err, errClosed):
			t.Errorf("a call racing Close: %v; want its usual result or %v", err, errClosed)
		}
	}
}
