package ctlesc_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/ctlesc"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain text, é, 日本, 👍", "plain text, é, 日本, 👍"},
		// Nothing to escape: backslashes and quotes stay as they are.
		{`plain "quoted" back\slash \x1b`, `plain "quoted" back\slash \x1b`},
		// C0, DEL and C1.
		{"a\x1b[2Jb", `a\x1b[2Jb`},
		{"\x00\a\b\t\n\v\f\r\x1f", `\x00\a\b\t\n\v\f\r\x1f`},
		{"del\x7f", `del\x7f`},
		{"c1\u0080\u009b31m\u009f", `c1\u0080\u009b31m\u009f`},
		// Bidi format characters: embeddings, overrides, isolates, marks.
		{"\u202a\u202b\u202c\u202d\u202e", `\u202a\u202b\u202c\u202d\u202e`},
		{"if admin\u2066\u2067\u2068\u2069", `if admin\u2066\u2067\u2068\u2069`},
		{"\u200e\u200f\u061c", `\u200e\u200f\u061c`},
		// Invalid UTF-8, byte by byte; a valid U+FFFD is shown as it is.
		{"bad \xff\xc3 byte \ufffd", `bad \xff\xc3 byte ` + "\ufffd"},
		// Once anything is escaped, so are backslashes and quotes: the
		// result reads back as the string.
		{"\"\x1b\"", `\"\x1b\"`},
		{"back\\slash\x00", `back\\slash\x00`},
		{`literal \x1b` + "\u202e", `literal \\x1b\u202e`},
		// Other format and space characters are shown as they are.
		{"zero\u200bwidth\u200djoiner\u00a0nbsp\u2028", "zero\u200bwidth\u200djoiner\u00a0nbsp\u2028"},
	} {
		got := ctlesc.Escape(tc.in)
		if got != tc.want {
			t.Errorf("Escape(%q) = %s; want %s", tc.in, got, tc.want)
		}
		if got == tc.in {
			continue
		}
		if back, err := strconv.Unquote(`"` + got + `"`); err != nil || back != tc.in {
			t.Errorf("Escape(%q) = %s, which reads back as %q (%v); want the string", tc.in, got, back, err)
		}
	}
}

// TestQuote: a string Escape changes, and one that begins with a double
// quote, is quoted whole, so that no two strings are printed alike (an
// operation named with an ESC and one with the characters \x1b).
func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"charge:1", "charge:1"},
		{`a\x1bb`, `a\x1bb`},
		{"a\x1bb", `"a\x1bb"`},
		{`"a\x1bb"`, `"\"a\\x1bb\""`},
		{`say "hi"`, `say "hi"`},
		{"back\\slash\u202e", `"back\\slash\u202e"`},
		{"bad\xff", `"bad\xff"`},
		// What a terminal shows as nothing, or as a plain space: a name
		// holding one would print as the one without it.
		{"zw:\u200bzero", `"zw:\u200bzero"`},
		{"soft\u00adhyphen", `"soft\u00adhyphen"`},
		{"\ufeffbom", `"\ufeffbom"`},
		{"join\u200d", `"join\u200d"`},
		{"heart\u2764\ufe0f", `"heart` + "\u2764" + `\ufe0f"`},
		{"filler\u3164", `"filler\u3164"`},
		{"tag\U000e0041", `"tag\U000e0041"`},
		{"no\u00a0break", `"no\u00a0break"`},
		{"line\u2028sep", `"line\u2028sep"`},
		{"braille\u2800blank", `"braille\u2800blank"`},
		// A space at either end, which shows as nothing at the end of a
		// line; one inside shows.
		{"trailing ", `"trailing "`},
		{" leading", `" leading"`},
		{"a b", "a b"},
	} {
		got := ctlesc.Quote(tc.in)
		if got != tc.want {
			t.Errorf("Quote(%q) = %s; want %s", tc.in, got, tc.want)
		}
		if got == tc.in {
			continue
		}
		if back, err := strconv.Unquote(got); err != nil || back != tc.in {
			t.Errorf("Quote(%q) = %s, which reads back as %q (%v); want the string", tc.in, got, back, err)
		}
	}
}

// FuzzQuote: Quote's result never holds a character that a terminal acts
// on or shows as nothing, nor a byte that is not UTF-8; it is s itself, or
// a literal that strconv.Unquote reads back as s, and only the latter
// begins with a double quote.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"charge:1", "a\x1bb", `"x"`, "zw:\u200bzero", "pay:1 ", "bad\xff", "\u2764\ufe0f", "tag\U000e0041"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := ctlesc.Quote(s)
		if !utf8.ValidString(q) {
			t.Fatalf("Quote(%q) = %q: not UTF-8", s, q)
		}
		for _, r := range q {
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Variation_Selector, r) ||
				unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) || (unicode.IsSpace(r) && r != ' ') {
				t.Fatalf("Quote(%q) = %q holds %U", s, q, r)
			}
		}
		if q == s {
			if strings.HasPrefix(s, `"`) || strings.HasPrefix(s, " ") || strings.HasSuffix(s, " ") {
				t.Fatalf("Quote(%q) left it as it is", s)
			}
			return
		}
		if back, err := strconv.Unquote(q); err != nil || back != s {
			t.Fatalf("Quote(%q) = %s, which reads back as %q (%v)", s, q, back, err)
		}
	})
}
