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
// timeout and the size of one of Prune's batches.
type Limits struct {
	QueryTimeout time.Duration
	PruneBatch   int
}

// WithDefaults returns l with each zero field set to that of defaults, or
// errOptions, wrapped with the field and its value, for a field out of
// range: a negative one, or a QueryTimeout above MaxQueryTimeout.
func (l Limits) WithDefaults(defaults Limits, errOptions error) (Limits, error) {
	switch {
	case l.QueryTimeout < 0:
		return l, fmt.Errorf("%w: QueryTimeout %v is negative", errOptions, l.QueryTimeout)
	case l.QueryTimeout > MaxQueryTimeout:
		return l, fmt.Errorf("%w: QueryTimeout %v is above %v", errOptions, l.QueryTimeout, MaxQueryTimeout)
	case l.PruneBatch < 0:
		return l, fmt.Errorf("%w: PruneBatch %d is negative", errOptions, l.PruneBatch)
	}
	if l.QueryTimeout == 0 {
		l.QueryTimeout = defaults.QueryTimeout
	}
	if l.PruneBatch == 0 {
		l.PruneBatch = defaults.PruneBatch
	}
	return l, nil
}
