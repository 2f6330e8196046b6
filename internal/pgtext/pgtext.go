// Package pgtext says which strings PostgreSQL's text type can hold.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Holds reports whether a PostgreSQL text value can hold s: valid UTF-8
// without a NUL byte. The server refuses any other (SQLSTATE 22021), where
// SQLite stores it as it is.
func Holds(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}
