//go:build linux

package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// The benchmarks below compare, against one loopback server in one run:
// a plain http.Client, a transport that only adds a key to a copy of the
// request, idem.Transport over a MemoryJar and over a keyjar file, and a raw
// fdatasync loop (the floor of a durable key). BENCHMARKS.md
// has the commands, the figures and the targets.

// benchBody is the request every benchmark sends: a small JSON charge.
var benchBody = []byte(`{"amount":1000,"currency":"eur","order":"order-42","customer":"cus_8f2a"}`)

// newBenchServer starts a loopback server that reads the request and
// answers a small JSON body, as a payments API would.
func newBenchServer(b *testing.B) *httptest.Server {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// tunedTransport is http.DefaultTransport with a pool that keeps a
// connection per caller: the default MaxIdleConnsPerHost (2) closes and
// redials most connections at 32 callers.
func tunedTransport(b *testing.B) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 64
	t.MaxIdleConnsPerHost = 64
	b.Cleanup(t.CloseIdleConnections)
	return t
}

// postCharge sends benchBody and reads the answer to the end.
func postCharge(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(benchBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d; want 200", resp.StatusCode)
	}
	return err
}

// runCallers times op with the given number of concurrent callers: a
// serial loop for 1, b.RunParallel with exactly that many goroutines
// otherwise. ns/op is then wall time per operation, the inverse of
// throughput.
func runCallers(b *testing.B, callers int, op func() error) {
	b.Helper()
	defer reportCPU(b)()
	if callers == 1 {
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	procs := runtime.GOMAXPROCS(0)
	if callers%procs != 0 {
		b.Fatalf("%d callers is not a multiple of GOMAXPROCS (%d)", callers, procs)
	}
	b.SetParallelism(callers / procs)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// reportCPU starts counting the process's CPU time (user and system, all
// goroutines, the server's included); the function it returns reports it
// per operation as cpu-ns/op. On a shared machine CPU time moves less with
// the other load than wall time does. Call it after the setup:
//
//	defer reportCPU(b)()
func reportCPU(b *testing.B) func() {
	start := cpuTime(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTransport: plain http.Client vs idem.Transport (MemoryJar and
// keyjar), 1 and 32 callers, with the same tuned base transport, beside a
// transport that only adds a key (keyOnly) and the floor under a durable
// key: a raw fdatasync loop at 1 caller, a group-committed one at 32.
func BenchmarkTransport(b *testing.B) {
	srv := newBenchServer(b)
	base := tunedTransport(b)
	clients := []struct {
		name string
		rt   func(b *testing.B) http.RoundTripper
	}{
		{"plain", func(*testing.B) http.RoundTripper { return base }},
		{"keyonly", func(*testing.B) http.RoundTripper { return keyOnly{base} }},
		{"memfloor", func(*testing.B) http.RoundTripper { return newMemFloor(base) }},
		{"memjar", func(*testing.B) http.RoundTripper {
			return &idem.Transport{Base: base, Jar: &idem.MemoryJar{}}
		}},
		{"keyjar", func(b *testing.B) http.RoundTripper {
			jar, err := keyjar.Open(context.Background(), filepath.Join(b.TempDir(), "keys.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { jar.Close() })
			return &idem.Transport{Base: base, Jar: jar}
		}},
	}
	for _, callers := range []int{1, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			for _, c := range clients {
				b.Run("client="+c.name, func(b *testing.B) {
					hc := &http.Client{Transport: c.rt(b)}
					ctx := context.Background()
					runCallers(b, callers, func() error { return postCharge(ctx, hc, srv.URL) })
				})
			}
			if callers == 1 {
				b.Run("client=fdatasync", benchFdatasync)
				b.Run("client=fdatasync+plain", func(b *testing.B) {
					hc := &http.Client{Transport: base}
					benchFdatasyncThen(b, func() error { return postCharge(context.Background(), hc, srv.URL) })
				})
				return
			}
			b.Run("client=fdatasync", func(b *testing.B) {
				g := newGroupSync(b)
				runCallers(b, callers, g.write)
			})
			b.Run("client=fdatasync+plain", func(b *testing.B) {
				g := newGroupSync(b)
				hc := &http.Client{Transport: base}
				runCallers(b, callers, func() error {
					if err := g.write(); err != nil {
						return err
					}
					return postCharge(context.Background(), hc, srv.URL)
				})
			})
		})
	}
}

// keyOnly is the least a RoundTripper that sends an Idempotency-Key does:
// it adds a fixed key to a copy of the request (the RoundTripper contract
// forbids changing the caller's) and sends it. Beside plain, it is the
// share of idem's cost that any key-sending transport pays.
type keyOnly struct{ base http.RoundTripper }

func (k keyOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.WithContext(req.Context())
	out.Header = make(http.Header, len(req.Header)+1)
	for name, v := range req.Header {
		out.Header[name] = v
	}
	out.Header[idem.KeyHeader] = []string{"6f1c2b7e-4a5d-4e8f-9b0a-1c2d3e4f5a6b"}
	return k.base.RoundTrip(out)
}

// memFloor is the least a RoundTripper that keeps its keys in memory
// before the first send does, beside keyOnly's copy: it reads the body once
// (kept for a retry), hashes it with SHA-256, draws a random UUID v4
// key, records both in a map under a lock before the send, and deletes the
// record once an answer came (a done operation needs nothing more, and the
// map stays small). Beside memjar, it is the share of idem's cost that
// any in-memory persist-before-send transport pays; what it leaves out is
// what idem does beside (canonical JSON, an operation's name and lease, a
// record's header without credentials, the retry policy, hooks). It never
// retries and is not safe to use outside this benchmark.
type memFloor struct {
	base http.RoundTripper
	mu   sync.Mutex
	ops  map[string]floorRecord
}

type floorRecord struct {
	fp   [sha256.Size]byte
	body []byte
}

func newMemFloor(base http.RoundTripper) *memFloor {
	return &memFloor{base: base, ops: make(map[string]floorRecord)}
}

func (f *memFloor) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	var err error
	if req.ContentLength > 0 {
		body = make([]byte, req.ContentLength)
		_, err = io.ReadFull(req.Body, body)
	} else {
		body, err = io.ReadAll(req.Body)
	}
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	key := uuid.NewString()
	f.mu.Lock()
	f.ops[key] = floorRecord{fp: sha256.Sum256(body), body: body}
	f.mu.Unlock()

	out := req.WithContext(req.Context())
	out.Header = make(http.Header, len(req.Header)+1)
	for name, v := range req.Header {
		out.Header[name] = v
	}
	out.Header[idem.KeyHeader] = []string{key}
	out.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := f.base.RoundTrip(out)
	if err == nil {
		f.mu.Lock()
		delete(f.ops, key) // done: nothing left to retry
		f.mu.Unlock()
	}
	return resp, err
}

// benchFdatasync appends 100 bytes to a file and fdatasyncs it: the cost of
// one durable write on this disk, the floor under a durable Begin.
func benchFdatasync(b *testing.B) { benchFdatasyncThen(b, nil) }

// benchFdatasyncThen is benchFdatasync followed, in each op, by then: with
// a plain POST, the floor under a call that persists its key before it
// sends. On a virtual machine the POST after an fsync costs more than one
// in a hot loop (the idle cores were parked), so this floor is higher than
// the sum of the two measured apart.
func benchFdatasyncThen(b *testing.B, then func() error) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "append"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rec := bytes.Repeat([]byte("k"), 100)
	fd := int(f.Fd())
	for b.Loop() {
		if _, err := f.Write(rec); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(fd); err != nil {
			b.Fatal(err)
		}
		if then != nil {
			if err := then(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// groupSync is the floor under a durable key with concurrent callers:
// each writes 100 bytes to one file and waits for an fdatasync that began
// after its write. One fdatasync serves every write made before it began,
// and the writes made during it wait for the next (group commit, with the
// next group gathering while a sync runs). The file is written and synced
// once before the timer starts and then written over, as a ring: on this
// disk a sync of blocks the file already has costs about half of one that
// appends (the file system's journal commits too), so this is the cheapest
// durable write there is, below what SQLite's WAL does.
type groupSync struct {
	f    *os.File
	rec  []byte
	size int64

	mu      sync.Mutex
	cond    *sync.Cond
	buf     []byte // written since the last sync began
	off     int64  // where buf goes
	written uint64 // writes so far
	synced  uint64 // writes covered by a finished fdatasync
	syncing bool
	err     error
}

func newGroupSync(b *testing.B) *groupSync {
	const size = 16 << 20
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "ring"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if _, err := f.Write(make([]byte, size)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	g := &groupSync{f: f, rec: bytes.Repeat([]byte("k"), 100), size: size}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// write returns once its 100 bytes are durable. The first caller to find
// no sync running leads one for every write made so far; the others wait.
func (g *groupSync) write() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf = append(g.buf, g.rec...)
	g.written++
	mine := g.written
	for g.synced < mine && g.err == nil {
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		buf, off, upTo := g.buf, g.off, g.written
		g.buf, g.off = nil, (off+int64(len(buf)))%(g.size-1<<20)
		g.mu.Unlock()
		_, err := g.f.WriteAt(buf, off)
		if err == nil {
			err = syscall.Fdatasync(int(g.f.Fd()))
		}
		g.mu.Lock()
		g.syncing = false
		g.synced, g.err = upTo, err
		g.cond.Broadcast()
	}
	return g.err
}

// BenchmarkTransportPool: a plain http.Client at 32 callers with
// http.DefaultTransport's pool (MaxIdleConnsPerHost 2) vs the tuned one.
func BenchmarkTransportPool(b *testing.B) {
	srv := newBenchServer(b)
	pools := []struct {
		name string
		rt   func(b *testing.B) *http.Transport
	}{
		{"default", func(b *testing.B) *http.Transport {
			t := http.DefaultTransport.(*http.Transport).Clone()
			b.Cleanup(t.CloseIdleConnections)
			return t
		}},
		{"tuned", tunedTransport},
	}
	for _, p := range pools {
		b.Run("pool="+p.name, func(b *testing.B) {
			hc := &http.Client{Transport: p.rt(b)}
			ctx := context.Background()
			runCallers(b, 32, func() error { return postCharge(ctx, hc, srv.URL) })
		})
	}
}

// cannedTransport answers every request at once with a small 200, without
// a network: BenchmarkTransportOverhead measures what idem.Transport adds
// to a round trip, free of the loopback's noise.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// BenchmarkTransportOverhead: the CPU time and allocations idem.Transport
// with a MemoryJar adds per call, over a base that answers at once; under
// a context that cannot end, and under one with a deadline, as a service's
// calls are made.
func BenchmarkTransportOverhead(b *testing.B) {
	for _, ctxCase := range []string{"background", "deadline"} {
		for _, c := range []struct {
			name string
			rt   func() http.RoundTripper
		}{
			{"plain", func() http.RoundTripper { return cannedTransport{} }},
			{"memfloor", func() http.RoundTripper { return newMemFloor(cannedTransport{}) }},
			{"memjar", func() http.RoundTripper {
				return &idem.Transport{Base: cannedTransport{}, Jar: &idem.MemoryJar{}}
			}},
		} {
			b.Run("ctx="+ctxCase+"/client="+c.name, func(b *testing.B) {
				hc := &http.Client{Transport: c.rt()}
				ctx := context.Background()
				if ctxCase == "deadline" {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
					defer cancel()
				}
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					if err := postCharge(ctx, hc, "http://127.0.0.1:1/charge"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
