package testserver

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// MemoryStore is a Store in memory, for tests and single-process servers
// that may lose their keys on restart. The zero value is ready to use.
type MemoryStore struct {
	mu      sync.Mutex
	entries map[memKey]Entry
}

type memKey struct{ scope, key string }

var _ Store = (*MemoryStore)(nil)

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, scope, key, fingerprint string, f Fence, now time.Time) (Entry, bool, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{scope, key}
	if e, ok := s.entries[k]; ok {
		return cloneEntry(e), false, nil
	}
	if s.entries == nil {
		s.entries = make(map[memKey]Entry)
	}
	e := Entry{Scope: scope, Key: key, Fingerprint: fingerprint, Status: StatusInFlight, Fence: f, Created: now}
	s.entries[k] = e
	return e, true, nil
}

// TakeOver implements Store.
func (s *MemoryStore) TakeOver(ctx context.Context, scope, key string, old, new Fence) (bool, error) {
	return s.fenced(ctx, scope, key, old, func(e Entry) (Entry, bool) { e.Fence = new; return e, true })
}

// Save implements Store.
func (s *MemoryStore) Save(ctx context.Context, scope, key string, f Fence, resp Response) error {
	ok, err := s.fenced(ctx, scope, key, f, func(e Entry) (Entry, bool) {
		e.Status = StatusDone
		e.Response = cloneResponse(&resp)
		return e, true
	})
	if err == nil && !ok {
		err = ErrFenced
	}
	return err
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, scope, key string, f Fence) (bool, error) {
	return s.fenced(ctx, scope, key, f, func(e Entry) (Entry, bool) { return e, false })
}

// fenced replaces the entry by what f returns from it if it is in flight
// with fence; f returns false to delete the entry instead of keeping it.
// (Given a pointer, f would move every entry it reads to the heap.)
func (s *MemoryStore) fenced(ctx context.Context, scope, key string, fence Fence, f func(Entry) (Entry, bool)) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{scope, key}
	e, ok := s.entries[k]
	if !ok || e.Status != StatusInFlight || e.Fence != fence {
		return false, nil
	}
	if e, keep := f(e); keep {
		s.entries[k] = e
	} else {
		delete(s.entries, k)
	}
	return true, nil
}

// Prune implements Store.
func (s *MemoryStore) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, e := range s.entries {
		if n >= limit {
			break
		}
		if e.Created.Before(before) && (e.Status == StatusDone || e.LockedAt().Before(before)) {
			delete(s.entries, k)
			n++
		}
	}
	return n, nil
}

func cloneEntry(e Entry) Entry {
	e.Response = cloneResponse(e.Response)
	return e
}

func cloneResponse(r *Response) *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = nil // an empty body is nil, as every Store reads it back
	if len(r.Body) > 0 {
		c.Body = bytes.Clone(r.Body)
	}
	return &c
}
