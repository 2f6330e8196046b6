// Package unwritten lets a jar of this module tell the Transport that a
// write it failed was never made, without exported API for it: a write
// withdrawn before it ran (keyjar's, whose caller's context ended while it
// waited for the committer or for another process's write lock). Any
// other failed write may have been made, its answer lost (pgjar's, whose
// connection dropped after the statement ran): after such an Acquire the
// Transport gives back a lease it may hold, and after a marked one it has
// none to give back.
package unwritten

import "errors"

// marked is an error that Mark marked: its text and its chain are err's.
type marked struct{ err error }

func (m *marked) Error() string { return m.err.Error() }
func (m *marked) Unwrap() error { return m.err }

// Mark returns err marked as a write that was not made, or nil for nil.
func Mark(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err}
}

// Is reports whether err, or an error in its chain, was marked by Mark.
func Is(err error) bool {
	var m *marked
	return errors.As(err, &m)
}
