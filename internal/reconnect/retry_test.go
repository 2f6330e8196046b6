package reconnect

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

var errLost = errors.New("connection lost")

// attempts records when each attempt started, relative to start, and fails
// the first failures of them with err.
type attempts struct {
	start    time.Time
	at       []time.Duration
	failures int
	err      error
	again    bool
}

func (a *attempts) attempt() (bool, error) {
	a.at = append(a.at, time.Since(a.start))
	if len(a.at) <= a.failures {
		return a.again, a.err
	}
	return false, nil
}

func ms(d ...int) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}

func TestRetry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bound    time.Duration
		failures int
		again    bool
		want     []time.Duration // when each attempt started
		wantErr  bool
	}{
		{"first attempt succeeds", time.Second, 0, true, ms(0), false},
		{"lost three times, then succeeds", time.Minute, 3, true, ms(0, 50, 150, 350), false},
		{"an error that is not a loss is final", time.Minute, 1, false, ms(0), true},
		// 50, 100, 200, 400, 800 ms, then a second at most, and never past
		// the bound: the last attempt starts at it.
		{"lost until the bound passes", 3 * time.Second, 100, true, ms(0, 50, 150, 350, 750, 1550, 2550, 3000), true},
		{"no time left", 0, 100, true, ms(0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := &attempts{start: time.Now(), failures: tc.failures, err: errLost, again: tc.again}
				err := Retry(t.Context(), a.start.Add(tc.bound), a.attempt)
				if !slices.Equal(a.at, tc.want) {
					t.Errorf("attempts at %v; want %v", a.at, tc.want)
				}
				if tc.wantErr && err != errLost || !tc.wantErr && err != nil {
					t.Errorf("Retry = %v; want the last attempt's error: %v", err, tc.wantErr)
				}
			})
		})
	}
}

// TestRetryContextEnds: a context that ends during a wait stops Retry at
// once, with an error that wraps the context's and the last attempt's.
func TestRetryContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 120*time.Millisecond)
		defer cancel()
		a := &attempts{start: time.Now(), failures: 100, err: errLost, again: true}
		err := Retry(ctx, a.start.Add(time.Minute), a.attempt)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errLost) {
			t.Errorf("Retry = %v; want the context's error and the last attempt's", err)
		}
		if want := ms(0, 50); !slices.Equal(a.at, want) {
			t.Errorf("attempts at %v; want %v", a.at, want)
		}
		if d := time.Since(a.start); d != 120*time.Millisecond {
			t.Errorf("Retry returned after %v; want 120ms, when the context ended", d)
		}
	})
}

// TestOutage: the writes of one outage share the bound of its first, and
// one that gets through ends it.
func TestOutage(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const bound = 10 * time.Second
	var o Outage
	for i, step := range []struct {
		start     int  // when the write starts, in seconds
		wantUntil int  // when its retries end
		lost      bool // how it ends
	}{
		{0, 10, false}, // no outage
		{1, 11, true},  // an outage begins at 1
		{12, 11, true}, // its time is spent
		{13, 11, true},
		{14, 11, false}, // its first attempt gets through: the outage ends
		{20, 30, true},  // a new outage
		{25, 30, true},
	} {
		if got := o.Until(at(step.start), bound); !got.Equal(at(step.wantUntil)) {
			t.Errorf("write %d at %ds: Until = %v; want %ds", i, step.start, got.Sub(t0), step.wantUntil)
		}
		o.Note(at(step.start), step.lost)
	}
}
