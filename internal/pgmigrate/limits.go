package pgmigrate

import (
	"fmt"
	"math"
	"time"
)

// MaxQueryTimeout is the longest statement_timeout PostgreSQL takes,
// 2^31-1 ms (about 24.8 days); the waits of twice as long that pgjar and
// pgstore add stay far from overflow.
const MaxQueryTimeout = math.MaxInt32 * time.Millisecond

// Limits are the options pgjar and pgstore share: each statement's
// timeout, the size of one of Prune's batches, and the timeout of a
// migration (see Timeouts.Migration).
type Limits struct {
	QueryTimeout     time.Duration
	PruneBatch       int
	MigrationTimeout time.Duration
}

// WithDefaults returns l with each zero field set to that of defaults (a
// MigrationTimeout to the longer of defaults' and l's QueryTimeout), or
// errOptions, wrapped with the field and its value, for a field out of
// range: a negative one, or a timeout above MaxQueryTimeout.
func (l Limits) WithDefaults(defaults Limits, errOptions error) (Limits, error) {
	switch {
	case l.QueryTimeout < 0:
		return l, fmt.Errorf("%w: QueryTimeout %v is negative", errOptions, l.QueryTimeout)
	case l.QueryTimeout > MaxQueryTimeout:
		return l, fmt.Errorf("%w: QueryTimeout %v is above %v", errOptions, l.QueryTimeout, MaxQueryTimeout)
	case l.PruneBatch < 0:
		return l, fmt.Errorf("%w: PruneBatch %d is negative", errOptions, l.PruneBatch)
	case l.MigrationTimeout < 0:
		return l, fmt.Errorf("%w: MigrationTimeout %v is negative", errOptions, l.MigrationTimeout)
	case l.MigrationTimeout > MaxQueryTimeout:
		return l, fmt.Errorf("%w: MigrationTimeout %v is above %v", errOptions, l.MigrationTimeout, MaxQueryTimeout)
	}
	if l.QueryTimeout == 0 {
		l.QueryTimeout = defaults.QueryTimeout
	}
	if l.PruneBatch == 0 {
		l.PruneBatch = defaults.PruneBatch
	}
	if l.MigrationTimeout == 0 {
		l.MigrationTimeout = max(defaults.MigrationTimeout, l.QueryTimeout)
	}
	return l, nil
}
