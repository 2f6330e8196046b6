package pgtext

import "testing"

func TestHolds(t *testing.T) {
	for s, want := range map[string]bool{
		"":             true,
		"charge:o1":    true,
		"straße-ü":     true,
		"a\x00b":       false,
		"caf\xe9":      false,
		"\xff":         false,
		"tab\tok\n":    true,
		"\uFFFD":       true,
		"\xed\xa0\x80": false, // a surrogate's UTF-8 encoding
	} {
		if got := Holds(s); got != want {
			t.Errorf("Holds(%q) = %v; want %v", s, got, want)
		}
	}
}
