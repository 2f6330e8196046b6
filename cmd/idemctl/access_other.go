//go:build !unix

package main

// mayWrite reports whether this user may write dir, and whether it could
// tell: here it cannot.
func mayWrite(string) (ok, known bool) { return false, false }
