package dropped_test

import (
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dropped"
)

// TestCount: no change dropped is no error; one or more is idem.ErrDropped,
// counting them and naming the last one's error, its password masked.
func TestCount(t *testing.T) {
	var c dropped.Count
	if err := c.Err(); err != nil {
		t.Fatalf("Err with nothing dropped = %v; want nil", err)
	}
	c.Add(errors.New("first"))
	if err := c.Err(); !errors.Is(err, idem.ErrDropped) || err.Error() != "idem: deferred changes were dropped: 1 since the jar was opened, on: first" {
		t.Errorf("Err after one = %q; want idem.ErrDropped, counting one", err)
	}
	c.Add(errors.New(`failed to connect to postgres://u:s3cret@db/x`))
	err := c.Err()
	want := "idem: deferred changes were dropped: 2 since the jar was opened, the last on: failed to connect to postgres://u:xxxxx@db/x"
	if !errors.Is(err, idem.ErrDropped) || err.Error() != want {
		t.Errorf("Err after two = %q; want %q", err, want)
	}
}
