// Command benchratio reads `go test -bench` output and prints, for each
// benchmark, its ratio to a baseline measured in the same round: the median
// of the per-round ratios and their range.
//
// Benchmarks are compared when their names differ only in one key=value
// element, the column (-col): BenchmarkTransport/callers=1/client=memjar is
// compared with BenchmarkTransport/callers=1/client=plain when -col is client
// and -base is plain. A round is one occurrence of each name: run the
// benchmarks several times with -count=1 (interleaved) or -count=N, and the
// k-th result of a benchmark is paired with the k-th result of its baseline.
// Pairing results of the same round cancels much of the drift of a shared
// machine that a ratio of medians keeps.
//
//	for i in $(seq 10); do go test -run='^$' -bench=. -count=1 .; done > out.txt
//	go run ./cmd/benchratio -col client -base plain out.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	col := flag.String("col", "client", "the name element `key` whose values are compared")
	base := flag.String("base", "plain", "the `value` of the column that is the baseline")
	unit := flag.String("unit", "ns/op", "the `unit` compared (ns/op, cpu-ns/op, B/op, ...)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchratio [-col key] [-base value] [-unit unit] [file ...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	var in []io.Reader
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchratio:", err)
			os.Exit(1)
		}
		defer f.Close()
		in = append(in, f)
	}
	if len(in) == 0 {
		in = append(in, os.Stdin)
	}
	results, err := parse(io.MultiReader(in...), *unit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchratio:", err)
		os.Exit(1)
	}
	for _, line := range compare(results, *col, *base) {
		fmt.Println(line)
	}
}

// procs is the -N suffix go test adds to a benchmark's name.
var procs = regexp.MustCompile(`-\d+$`)

// parse returns, for each benchmark, its values in unit, one per round. A
// benchmark is named by the last element of its package ("pkg:" line) and
// its name without the -N suffix.
func parse(r io.Reader, unit string) (map[string][]float64, error) {
	out := map[string][]float64{}
	pkg := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "pkg: "); ok {
			pkg = path.Base(strings.TrimSpace(p)) + "."
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := pkg + procs.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), "")
		for i := 2; i+1 < len(f); i += 2 {
			if f[i+1] != unit {
				continue
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", f[0], err)
			}
			out[name] = append(out[name], v)
		}
	}
	return out, sc.Err()
}

// compare pairs each benchmark whose name has col=v (v not base) with the
// one that has col=base instead, round by round.
func compare(results map[string][]float64, col, base string) []string {
	names := make([]string, 0, len(results))
	for name := range results {
		names = append(names, name)
	}
	slices.Sort(names)
	var lines []string
	for _, name := range names {
		elems := strings.Split(name, "/")
		i := slices.IndexFunc(elems, func(e string) bool { return strings.HasPrefix(e, col+"=") })
		if i < 0 || elems[i] == col+"="+base {
			continue
		}
		elems[i] = col + "=" + base
		baseline, ok := results[strings.Join(elems, "/")]
		if !ok {
			continue
		}
		got := results[name]
		n := min(len(got), len(baseline))
		var ratios []float64
		for k := range n {
			if baseline[k] > 0 {
				ratios = append(ratios, got[k]/baseline[k])
			}
		}
		if len(ratios) == 0 {
			continue
		}
		slices.Sort(ratios)
		lines = append(lines, fmt.Sprintf("%-60s ×%.2f  (range %.2f–%.2f, n=%d)",
			name+" vs "+base, median(ratios), ratios[0], ratios[len(ratios)-1], len(ratios)))
	}
	return lines
}

// median returns the median of sorted values.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
