// Package dropped counts the deferred changes a jar dropped on an error,
// for its Close to report (see idem.ErrDropped).
package dropped

import (
	"fmt"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dsn"
)

// Count counts dropped changes and keeps the error of the last. Its zero
// value is ready; it is safe for concurrent use.
type Count struct {
	mu   sync.Mutex
	n    uint64
	last string
}

// Add counts one change dropped on err.
func (c *Count) Add(err error) {
	c.mu.Lock()
	c.n++
	c.last = dsn.MaskPasswords(err.Error())
	c.mu.Unlock()
}

// Err returns nil when no change was dropped, and otherwise an error
// matching idem.ErrDropped that says how many were and the last one's
// error, its passwords masked.
func (c *Count) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.n {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: 1 since the jar was opened, on: %s", idem.ErrDropped, c.last)
	}
	return fmt.Errorf("%w: %d since the jar was opened, the last on: %s", idem.ErrDropped, c.n, c.last)
}
