// Package bench holds the benchmarks that compare idem.Transport with
// other retrying HTTP clients. It is a module of its own, so that the
// library never depends on them: see BENCHMARKS.md at the repository root.
//
//	cd bench && go test -run='^$' -bench=. -count=6
package bench
