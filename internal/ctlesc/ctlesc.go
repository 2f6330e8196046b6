// Package ctlesc escapes what a terminal would act on rather than show,
// in text that comes from a server's answer or a jar's record: client's
// StatusError message, idemctl's output and examples/charge's.
package ctlesc

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Escape returns s with its C0 controls, DEL, C1 controls and bidi format
// characters (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069, which
// reorder what a terminal shows, as in "Trojan Source") escaped as in a Go
// string literal (\x1b, \a, \u009b, \u202e), and its bytes that are not
// UTF-8 as \xff. A string with none of them is returned as it is. Once it
// escapes anything, Escape escapes backslashes and double quotes too, as
// strconv.Quote does, so that the result reads back as s: no escape can
// be told from characters that only look like one.
func Escape(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, escaped) {
		return s
	}
	return escape(s)
}

// Quote returns s as it is when Escape leaves it as it is and it does not
// begin with a double quote; otherwise Escape's escaping of s, between
// double quotes: a Go string literal that strconv.Unquote reads back as s.
// Unlike Escape's, its result tells every string from every other: a
// name holding an ESC prints as "a\x1bb", the six characters a\x1bb as
// they are, and only a quoted string begins with a double quote. For
// idemctl's output of a record, whose names an operator types back.
func Quote(s string) string {
	if !strings.HasPrefix(s, `"`) && Escape(s) == s {
		return s
	}
	return `"` + escape(s) + `"`
}

// escape escapes s as Escape does when s has anything to escape, backslashes
// and double quotes included.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case escaped(r):
			q := strconv.QuoteRune(r) // '\x1b', '\a', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// escaped reports whether Escape escapes r: C0, DEL, C1 or a bidi format
// character.
func escaped(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }
