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

// Quote returns s as it is when Escape leaves it as it is, it holds no
// character that shows as nothing or as a plain space (see invisible) and
// neither begins with a space or a double quote nor ends with a space;
// otherwise Escape's escaping of s, the invisible characters escaped too,
// between double quotes: a Go string literal that strconv.Unquote reads
// back as s. Unlike Escape's, its result tells every string from every
// other: a name holding an ESC prints as "a\x1bb", the six characters
// a\x1bb as they are, one holding a zero-width space as "a\u200bb", not as
// ab, and only a quoted string begins with a double quote. For idemctl's
// output of a record, whose names an operator types back.
func Quote(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, invisible) &&
		!strings.HasPrefix(s, `"`) && !strings.HasPrefix(s, " ") && !strings.HasSuffix(s, " ") {
		return s
	}
	return `"` + escapeFunc(s, invisible) + `"`
}

// escape escapes s as Escape does when s has anything to escape, backslashes
// and double quotes included.
func escape(s string) string { return escapeFunc(s, escaped) }

// escapeFunc is escape, escaping the runes for which esc is true (a
// superset of escaped's) as \x, \u or \U escapes.
func escapeFunc(s string, esc func(rune) bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case esc(r):
			q := strconv.QuoteRune(r) // '\x1b', '\a', '\u202e'
			q = q[1 : len(q)-1]
			if q == string(r) { // one strconv prints as it is: U+FE0F
				q = fmt.Sprintf(`\u%04x`, r)
				if r > 0xffff {
					q = fmt.Sprintf(`\U%08x`, r)
				}
			}
			b.WriteString(q)
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

// invisible reports whether Quote escapes r: what escaped does, and the
// characters a terminal shows as nothing or as a plain space, so that two
// names that differ by them would print alike: the other format characters
// (U+200B zero-width space, U+200D joiner, U+00AD soft hyphen, U+FEFF),
// variation selectors, the other default-ignorable code points (U+034F,
// U+3164), every white space but U+0020 (U+00A0 no-break space, U+2028)
// and U+2800, the blank Braille pattern, a symbol drawn as a space.
func invisible(r rune) bool {
	return escaped(r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Variation_Selector, r) ||
		unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) || (unicode.IsSpace(r) && r != ' ') || r == '\u2800'
}
