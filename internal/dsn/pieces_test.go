package dsn

import (
	"fmt"
	"strings"
	"testing"
)

// manyPasswords returns a text of at least n bytes that quotes, again and
// again, URLs, each with a password of its own 40 bytes long, and strings
// that are pieces of none, as a log of many errors may: MaskPasswords
// finds a password for each URL, and each quoted string is a piece that
// it checks against the passwords. It also returns the passwords.
func manyPasswords(n int) (string, []string) {
	var b strings.Builder
	var passwords []string
	for i := 0; b.Len() < n; i++ {
		p := fmt.Sprintf("pw%038d", i)
		passwords = append(passwords, p)
		fmt.Fprintf(&b, `Post "https://ops:%s@api.example/v1?order=%d": EOF; retried "%d" `, p, i, i)
		fmt.Fprintf(&b, "parse `host=db password=%s_` failed \"z%d\"\n", p, i)
	}
	return b.String(), passwords
}

// TestMaskPasswordsLarge: a text of 1 MiB with thousands of quoted strings
// and of passwords is masked whole, with a few allocations for each URL at
// the most. Comparing each quoted string with each password made one
// allocation for each pair (the password, longer than 32 bytes, put after
// a ':'), some 28,000 for each URL of this text, and took a time that
// grew as the square of its length.
func TestMaskPasswordsLarge(t *testing.T) {
	s, passwords := manyPasswords(1 << 20)
	var got string
	allocs := testing.AllocsPerRun(1, func() { got = MaskPasswords(s) })
	for _, p := range passwords {
		if strings.Contains(got, p) {
			t.Fatalf("MaskPasswords of a text of %d bytes holds the password %q", len(s), p)
		}
	}
	if want := strings.Count(got, `"https://ops:xxxxx@api.example/v1?order=`); want != len(passwords) {
		t.Errorf("MaskPasswords of a text of %d bytes masks %d URLs' passwords; want %d", len(s), want, len(passwords))
	}
	if limit := 4 * len(passwords); allocs > float64(limit) {
		t.Errorf("MaskPasswords of a text of %d bytes, with %d passwords, makes %.0f allocations; want at most %d", len(s), len(passwords), allocs, limit)
	}
}

func BenchmarkMaskPasswords(b *testing.B) {
	for _, n := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		s, _ := manyPasswords(n)
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			b.ReportAllocs()
			for b.Loop() {
				MaskPasswords(s)
			}
		})
	}
}

// TestPieceIndex: a string is found that is part of a password, a ':'
// before it counted, and no other, not even one that spans two passwords
// and the separator between them; but where every byte is in some
// password, and no separator is left, such a string is found too (more
// masked, never less).
func TestPieceIndex(t *testing.T) {
	x := newPieceIndex([]string{"s3cret", "%zz"})
	for u, want := range map[string]bool{
		":s3": true, "cret": true, ":%zz": true, "%zz": true,
		"s3cret:": false, "zz:": false, "t\x00:%": false, "\x00": false, "cret\x00:%zz": false, "x": false,
	} {
		if got := x.has(u); got != want {
			t.Errorf("has(%q) = %v; want %v", u, got, want)
		}
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	x = newPieceIndex([]string{string(all), "s3cret"})
	for u, want := range map[string]bool{
		"s3cret": true, ":s3": true, "\xfe\xff": true, "\xff\x00:s3": true, "s3cret:": false,
	} {
		if got := x.has(u); got != want {
			t.Errorf("with every byte in a password: has(%q) = %v; want %v", u, got, want)
		}
	}
}
