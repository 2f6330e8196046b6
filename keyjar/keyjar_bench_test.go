package keyjar_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// grownRows is the size of the grown jar of BenchmarkJarGrowth.
const grownRows = 1_000_000

// grownStart is the Created time of the grown jar's first row; the rows
// follow each other by a microsecond, so all are older than time.Now.
var grownStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// BenchmarkJarGrowth: Begin on an empty jar and on one holding 1M done
// operations, in turns; ByKey on the grown jar; and Prune of 100k and of 1M
// rows, with the peak memory each Prune takes. The 1M-row file is built once per run, only when
// a sub-benchmark that needs it is selected, in a temporary directory
// removed at the end.
func BenchmarkJarGrowth(b *testing.B) {
	dir := b.TempDir()
	grown := sync.OnceValues(func() (string, error) {
		return buildGrown(filepath.Join(dir, "grown.db"), grownRows)
	})
	grownCopy := func(b *testing.B, name string) string {
		b.Helper()
		src, err := grown()
		if err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := copyFile(dst, src); err != nil {
			b.Fatal(err)
		}
		return dst
	}

	var beginCopy sync.Once
	b.Run("Begin", func(b *testing.B) {
		// One working copy for every round: Begin adds b.N pending rows to
		// the 1M, which does not change the picture, and the pristine file
		// stays for Prune.
		beginCopy.Do(func() { grownCopy(b, "begin.db") })
		benchBegin(b, filepath.Join(b.TempDir(), "empty.db"), filepath.Join(dir, "begin.db"))
	})
	b.Run("ByKey", func(b *testing.B) {
		// The key of the oldest row, looked up among the 1M (and the
		// pending rows Begin added): a scan of the whole table.
		beginCopy.Do(func() { grownCopy(b, "begin.db") })
		ctx := context.Background()
		j, err := keyjar.Open(ctx, filepath.Join(dir, "begin.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer j.Close()
		first, err := j.List(ctx, idem.Filter{Limit: 1})
		if err != nil || len(first) != 1 {
			b.Fatalf("List = %d records, %v", len(first), err)
		}
		for b.Loop() {
			recs, err := j.ByKey(ctx, first[0].Key)
			if err != nil || len(recs) != 1 {
				b.Fatalf("ByKey = %d records, %v; want 1", len(recs), err)
			}
		}
	})
	for _, p := range []struct {
		name  string
		limit int
	}{{"rows=100k", 100_000}, {"rows=1M", 0}} {
		b.Run("Prune/"+p.name, func(b *testing.B) {
			want := p.limit
			if want == 0 {
				want = grownRows
			}
			var peak memPeak
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				path := grownCopy(b, "prune.db")
				j, err := keyjar.Open(context.Background(), path, nil)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				stop := peak.sample(b)
				start := time.Now()
				b.StartTimer()
				n, err := j.Prune(context.Background(), time.Now(), p.limit)
				b.StopTimer()
				elapsed += time.Since(start)
				stop()
				if err != nil {
					b.Fatal(err)
				}
				if n != want {
					b.Fatalf("Prune deleted %d rows; want %d", n, want)
				}
				if err := j.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*want), "ns/row")
			peak.report(b)
		})
	}
}

// benchBegin times Begin of new operations, one caller, on the empty jar
// at emptyPath and on the grown jar at grownPath, in turns: each iteration
// begins one operation in each, so that both meet the same disk. It reports
// the mean latency of each (empty-ns/begin, 1M-ns/begin) and their ratio
// (1M/empty); ns/op is the sum of the two.
func benchBegin(b *testing.B, emptyPath, grownPath string) {
	ctx := context.Background()
	var jars [2]*keyjar.Jar // empty, grown
	for i, path := range []string{emptyPath, grownPath} {
		j, err := keyjar.Open(ctx, path, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer j.Close()
		jars[i] = j
	}
	header := http.Header{"Content-Type": {"application/json"}}
	body := []byte(`{"amount":1000,"currency":"eur","order":"order-42"}`)
	var took [2]time.Duration
	i := 0
	for b.Loop() {
		for k := range 2 {
			which := (i + k) % 2 // alternate which jar goes first
			key := rand.Text()
			now := time.Now()
			r := idem.Record{Op: key, Key: key, Fingerprint: strings.Repeat("f", 64), State: idem.StatePending,
				Method: http.MethodPost, URL: "http://127.0.0.1:8080/charges", Header: header,
				Body: body, BodySize: int64(len(body)), Created: now, Updated: now,
				Holder: "bench", LeaseUntil: now.Add(time.Minute)}
			if _, created, err := jars[which].Begin(ctx, r); err != nil || !created {
				b.Fatalf("Begin = %v, %v; want created", created, err)
			}
			took[which] += time.Since(now)
		}
		i++
	}
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "empty-ns/begin")
	b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "1M-ns/begin")
	b.ReportMetric(float64(took[1])/float64(took[0]), "1M/empty")
}

// buildGrown writes a jar at path holding rows done operations, such as
// idem.Transport leaves behind, in one transaction of one statement.
func buildGrown(path string, rows int) (string, error) {
	ctx := context.Background()
	j, err := keyjar.Open(ctx, path, nil) // the schema, exactly as the jar makes it
	if err != nil {
		return "", err
	}
	if err := j.Close(); err != nil {
		return "", err
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=synchronous(OFF)&_pragma=cache_size(-262144)")
	if err != nil {
		return "", err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	body := `{"amount":1000,"currency":"eur","order":"order-42"}`
	start := grownStart.UnixNano()
	_, err = tx.ExecContext(ctx, `
		WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1),
		ids(i, u) AS MATERIALIZED (
			SELECT i, lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2)
				|| '-' || hex(randomblob(2)) || '-' || hex(randomblob(6))) FROM n)
		INSERT INTO operations (op, key, fingerprint, state, method, url, header, body, body_size,
			created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until)
		SELECT u, u, lower(hex(randomblob(32))), 'done', 'POST', 'http://127.0.0.1:8080/charges',
			'{"Content-Type":["application/json"]}', CAST(?2 AS BLOB), length(?2),
			?3 + i * 1000, ?3 + i * 1000 + 5000000, 1, 201, '', NULL, '', '', NULL
		FROM ids`, rows, body, start)
	if err != nil {
		return "", fmt.Errorf("filling %s: %w", path, err)
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	// Leave one self-contained file: the WAL folded into it.
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return "", err
	}
	return path, nil
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	// On disk before anything is timed: otherwise the first fsyncs of the
	// jar would also write back the copy's dirty pages.
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// memPeak is the highest memory seen while Prune runs: the Go heap in use
// (runtime.MemStats.HeapInuse, sampled every 2 ms), which includes garbage
// not yet collected; the live heap as the last GC found it
// (/gc/heap/live:bytes), which does not; and the process's resident set
// (VmHWM, whose mark is reset before each run; it covers SQLite's page
// cache, which modernc.org/sqlite keeps outside the Go heap).
type memPeak struct {
	heapInuse, live, rss uint64
}

// sample resets the resident-set mark and samples the heap until the
// returned function is called.
func (p *memPeak) sample(b *testing.B) (stop func()) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak resident set (%v); peak-rss-B is the process's", err)
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			runtime.ReadMemStats(&ms)
			p.heapInuse = max(p.heapInuse, ms.HeapInuse)
			metrics.Read(live)
			if live[0].Value.Kind() == metrics.KindUint64 {
				p.live = max(p.live, live[0].Value.Uint64())
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		p.rss = max(p.rss, peakRSS(b))
	}
}

func (p *memPeak) report(b *testing.B) {
	b.ReportMetric(float64(p.heapInuse), "peak-heapinuse-B")
	b.ReportMetric(float64(p.live), "peak-live-B")
	if p.rss > 0 {
		b.ReportMetric(float64(p.rss), "peak-rss-B")
	}
}

// peakRSS returns VmHWM of /proc/self/status in bytes, or 0 when it cannot
// be read.
func peakRSS(b *testing.B) uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				b.Logf("VmHWM %q: %v", rest, err)
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
