package main

import (
	"slices"
	"strings"
	"testing"
)

// Three interleaved rounds: each ratio is taken within its round, so the
// drift between rounds (round 3 is twice as slow) cancels.
const rounds = `pkg: github.com/idemkit/idem
BenchmarkT/callers=1/client=plain-2   100  1000 ns/op  1200 cpu-ns/op
BenchmarkT/callers=1/client=idem-2    100  1500 ns/op  1800 cpu-ns/op
BenchmarkT/callers=1/client=plain-2   100  1000 ns/op  1200 cpu-ns/op
BenchmarkT/callers=1/client=idem-2    100  1200 ns/op  1300 cpu-ns/op
BenchmarkT/callers=1/client=plain-2   100  2000 ns/op  2400 cpu-ns/op
BenchmarkT/callers=1/client=idem-2    100  2600 ns/op  2400 cpu-ns/op
BenchmarkT/callers=1/client=other-2   100  3000 ns/op
BenchmarkU/client=idem-2              100  1000 ns/op
`

func TestCompare(t *testing.T) {
	for _, tt := range []struct {
		unit string
		want []string
	}{
		{"ns/op", []string{
			"idem.T/callers=1/client=idem vs plain", "×1.30  (range 1.20–1.50, n=3)",
			"idem.T/callers=1/client=other vs plain", "×3.00  (range 3.00–3.00, n=1)",
		}},
		{"cpu-ns/op", []string{"idem.T/callers=1/client=idem vs plain", "×1.08  (range 1.00–1.50, n=3)"}},
	} {
		results, err := parse(strings.NewReader(rounds), tt.unit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range compare(results, "client", "plain") {
			name, ratio, _ := strings.Cut(line, " ×")
			got = append(got, strings.TrimSpace(name), "×"+ratio)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q; want %q", tt.unit, got, tt.want)
		}
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{1, 2, 3, 10}); m != 2.5 {
		t.Errorf("median of 4 = %v; want 2.5", m)
	}
	if m := median([]float64{1, 2, 10}); m != 2 {
		t.Errorf("median of 3 = %v; want 2", m)
	}
}
