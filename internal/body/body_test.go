package body

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
)

func TestReadAtMost(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tt := range []struct {
		name        string
		r           io.Reader
		limit, size int64
		want        string
		err         error
	}{
		{"exact size", strings.NewReader("hello"), 10, 5, "hello", nil},
		{"size too small", strings.NewReader("hello world"), 100, 3, "hello world", nil},
		{"size too large", strings.NewReader("hi"), 100, 50, "hi", nil},
		{"unknown size", iotest.OneByteReader(strings.NewReader(strings.Repeat("x", 2000))), 4096, -1, strings.Repeat("x", 2000), nil},
		{"empty", strings.NewReader(""), 10, 0, "", nil},
		{"at the limit", strings.NewReader("12345"), 5, -1, "12345", nil},
		{"over the limit", strings.NewReader("123456789"), 5, 5, "123456", ErrTooLarge},
		{"over the limit, size beyond it", strings.NewReader("123456789"), 5, 9, "123456", ErrTooLarge},
		{"reader error", io.MultiReader(strings.NewReader("ab"), iotest.ErrReader(errBoom)), 10, 2, "ab", errBoom},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadAtMost(tt.r, tt.limit, tt.size)
			if !errors.Is(err, tt.err) || !bytes.Equal(got, []byte(tt.want)) {
				t.Errorf("ReadAtMost = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
		})
	}
}

// An exact size allocates once.
func TestReadAtMostAllocatesOnce(t *testing.T) {
	data := bytes.Repeat([]byte("k"), 1000)
	r := bytes.NewReader(data)
	n := testing.AllocsPerRun(100, func() {
		r.Reset(data)
		if _, err := ReadAtMost(r, 1<<20, int64(len(data))); err != nil {
			t.Fatal(err)
		}
	})
	if n != 1 {
		t.Errorf("%v allocations; want 1", n)
	}
}

// ReadAtMostContext stops once its context is done, with the bytes read
// before and the context's error, without reading again.
func TestReadAtMostContextStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	reads := 0
	r := iotest.OneByteReader(readFunc(func(p []byte) (int, error) {
		reads++
		if reads == 3 {
			cancel()
		}
		p[0] = 'x'
		return 1, nil
	}))
	got, err := ReadAtMostContext(ctx, r, 100, -1)
	if !errors.Is(err, context.Canceled) || string(got) != "xxx" || reads != 3 {
		t.Fatalf("got %q, %v after %d reads; want \"xxx\", context.Canceled after 3", got, err, reads)
	}
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// stalled is a body whose Read blocks until Close, as a connection's does.
type stalled struct {
	closed chan struct{}
	once   sync.Once
}

func (s *stalled) Read([]byte) (int, error) { <-s.closed; return 0, errors.New("read on closed body") }
func (s *stalled) Close() error             { s.once.Do(func() { close(s.closed) }); return nil }

// TestDrainStalledBody: Drain gives up on a body that stalls after
// DrainTimeout, closing it, rather than wait for it forever.
func TestDrainStalledBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		Drain(&stalled{closed: make(chan struct{})})
		if d := time.Since(start); d != DrainTimeout {
			t.Fatalf("Drain returned after %v; want %v", d, DrainTimeout)
		}
	})
}

// TestDrainReadsAndCloses: a body that ends is read to its end at once,
// and closed.
func TestDrainReadsAndCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingBody{Reader: strings.NewReader(strings.Repeat("x", 1000))}
		start := time.Now()
		Drain(r)
		if r.n != 1000 || !r.closed || time.Since(start) != 0 {
			t.Fatalf("read %d bytes, closed %v, after %v; want 1000, true, at once", r.n, r.closed, time.Since(start))
		}
	})
}

type countingBody struct {
	io.Reader
	n      int
	closed bool
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.Reader.Read(p)
	c.n += n
	return n, err
}
func (c *countingBody) Close() error { c.closed = true; return nil }

// TestInMemory: the bodies http.NewRequest makes of bytes and strings, and
// the copies their GetBody gives, are known to read from memory; any other
// reader may block, and is watched while it is read.
func TestInMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    io.Reader
	}{
		{"bytes.Buffer", bytes.NewBufferString(`{}`)},
		{"bytes.Reader", bytes.NewReader([]byte(`{}`))},
		{"strings.Reader", strings.NewReader(`{}`)},
	} {
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/", tc.r)
		if err != nil {
			t.Fatal(err)
		}
		copy, err := req.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []io.Reader{req.Body, copy, tc.r} {
			if !InMemory(r) {
				t.Errorf("%s: InMemory(%T) = false; want true", tc.name, r)
			}
		}
	}
	if !InMemory(http.NoBody) {
		t.Error("InMemory(http.NoBody) = false; want true")
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	for _, r := range []io.Reader{nil, pr, io.NopCloser(pr), io.NopCloser(nil), &stalled{},
		io.NopCloser(bufio.NewReader(pr)), io.NopCloser(iotest.HalfReader(strings.NewReader("x")))} {
		if InMemory(r) {
			t.Errorf("InMemory(%T) = true; want false", r)
		}
	}
}

// TestLen: the bytes left in a reader of memory, as io.NopCloser gives
// it, read in part or not; none for any other reader.
func TestLen(t *testing.T) {
	part := strings.NewReader("hello")
	part.Read(make([]byte, 2))
	for _, tc := range []struct {
		r    io.Reader
		want int64
	}{
		{io.NopCloser(bytes.NewReader([]byte("hello"))), 5},
		{io.NopCloser(part), 3},
		{bytes.NewBufferString("hi"), 2},
		{http.NoBody, 0},
	} {
		if n, ok := Len(tc.r); !ok || n != tc.want {
			t.Errorf("Len(%T) = %d, %v; want %d, true", tc.r, n, ok, tc.want)
		}
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	for _, r := range []io.Reader{nil, pr, io.NopCloser(iotest.HalfReader(strings.NewReader("x")))} {
		if n, ok := Len(r); ok {
			t.Errorf("Len(%T) = %d, true; want false", r, n)
		}
	}
}

// TestReadAtMostContextWatchesOnlyWhatMayBlock: a body of memory is read
// under a context that can end at the cost of one under one that cannot:
// no watch on the context, whose registration allocates.
func TestReadAtMostContextWatchesOnlyWhatMayBlock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	data := []byte(`{"amount":1000}`)
	allocs := func(ctx context.Context, open func() io.Reader) float64 {
		return testing.AllocsPerRun(100, func() {
			if _, err := ReadAtMostContext(ctx, open(), 100, int64(len(data))); err != nil {
				t.Fatal(err)
			}
		})
	}
	inMemory := func() io.Reader { return io.NopCloser(bytes.NewReader(data)) }
	if bg, timed := allocs(context.Background(), inMemory), allocs(ctx, inMemory); timed != bg {
		t.Errorf("a body of memory: %v allocations under a deadline, %v without; want as many", timed, bg)
	}
	other := func() io.Reader { return io.NopCloser(iotest.OneByteReader(bytes.NewReader(data))) }
	if bg, timed := allocs(context.Background(), other), allocs(ctx, other); timed <= bg {
		t.Errorf("another body: %v allocations under a deadline, %v without; want the watch's more", timed, bg)
	}
}
