#!/bin/sh
# run.sh runs every benchmark of BENCHMARKS.md the way its figures were
# measured, from the repository root:
#
#	bench/run.sh [out-dir]      # default out-dir: bench/results/<UTC date>
#
# Each package's benchmarks run ROUNDS times (default 20) with -count=1, in
# turns, so that every benchmark and its baseline meet the same load of a
# shared machine; the grown-jar benchmarks run once with -count=6 (they
# build a 1M-row file first). Then it prints benchstat tables and the
# per-round ratios. benchstat must be on PATH:
#
#	go install golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
set -eu
command -v benchstat >/dev/null || {
	echo "run.sh: benchstat is not on PATH (see the comment at the top)" >&2
	exit 1
}
cd "$(dirname "$0")/.."
out=${1:-bench/results/$(date -u +%F)}
rounds=${ROUNDS:-20}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/transport.txt "$out"/clients.txt "$out"/sqlitestore.txt "$out"/pgstore.txt "$out"/middleware.txt "$out"/growth.txt
quick='-run=^$ -count=1 -benchtime=300ms'
i=0
while [ "$i" -lt "$rounds" ]; do
	i=$((i + 1))
	go test $quick -bench='^BenchmarkTransport' . >>"$out/transport.txt"
	(cd bench && go test $quick -bench=. .) >>"$out/clients.txt"
	go test $quick -bench=. ./testserver/sqlitestore >>"$out/sqlitestore.txt"
	go test $quick -bench=. ./testserver/pgstore >>"$out/pgstore.txt"
	go test $quick -bench='^BenchmarkMiddleware$' ./testserver >>"$out/middleware.txt"
	echo "round $i of $rounds done" >&2
done
go test -run='^$' -bench='^BenchmarkJarGrowth/Begin' -benchtime=1000x -count=6 -timeout=2h ./keyjar >>"$out/growth.txt"
go test -run='^$' -bench='^BenchmarkJarGrowth/ByKey' -benchtime=10x -count=6 -timeout=2h ./keyjar >>"$out/growth.txt"
go test -run='^$' -bench='^BenchmarkJarGrowth/Prune' -count=6 -timeout=2h ./keyjar >>"$out/growth.txt"

for f in transport clients; do
	benchstat -col /client "$out/$f.txt"
done
benchstat -col /impl "$out/sqlitestore.txt" "$out/pgstore.txt"
benchstat -col /path "$out/middleware.txt"
benchstat "$out/growth.txt"
ratio() { (cd bench && go run ./cmd/benchratio "$@"); }
ratio -col client -base plain "$out/transport.txt" "$out/clients.txt"
ratio -col client -base plain -unit cpu-ns/op "$out/transport.txt"
ratio -col client -base fdatasync+plain "$out/transport.txt"
ratio -col client -base retryablehttp "$out/clients.txt"
ratio -col pool -base tuned "$out/transport.txt"
ratio -col impl -base rawsql "$out/sqlitestore.txt" "$out/pgstore.txt"
ratio -col path -base bare "$out/middleware.txt"
