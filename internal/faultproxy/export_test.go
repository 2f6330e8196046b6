package faultproxy

import (
	"context"
	"time"
)

// SetWait replaces the timer that holds a Delay fault. Call it before Start.
func (p *Proxy) SetWait(f func(ctx context.Context, d time.Duration) error) { p.wait = f }
