package main

import "testing"

// TestEscape checks that escape keeps every character of what it escapes:
// the quotes QuoteToGraphic adds are taken off, not the string's own.
func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain \"quoted\" text", "plain \"quoted\" text"},
		{"a\x1b[2Jb", `a\x1b[2Jb`},
		{"bad \xff byte", `bad \xff byte`},
		{"\"\x1b\"", `\"\x1b\"`},
		{"ends in a quote\a\"", `ends in a quote\a\"`},
		{"back\\slash\x00", `back\\slash\x00`},
	} {
		if got := escape(tc.in); got != tc.want {
			t.Errorf("escape(%q) = %s; want %s", tc.in, got, tc.want)
		}
	}
}
