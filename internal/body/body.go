// Package body reads request bodies boundedly, so that they can be sent
// again, and disposes of response bodies that are superseded by a retry.
package body

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"
)

// DrainLimit is the largest superseded response body Drain reads to its
// end before closing it. Reading a small body to EOF lets the connection be
// reused; a larger one is cheaper to close.
const DrainLimit = 64 << 10

// Drain reads rc, for at most DrainTimeout, to its end when it holds at
// most DrainLimit bytes, and closes it: it reads at most DrainLimit+1
// bytes, since the end of a chunked body of DrainLimit bytes shows only
// past them. A body that stalls is closed when the time is up, which ends
// a read blocked in it (as it does an http.Response's). A nil rc is a
// no-op.
func Drain(rc io.ReadCloser) {
	if rc == nil {
		return
	}
	stop := time.AfterFunc(DrainTimeout, func() { _ = rc.Close() })
	_, _ = io.CopyN(io.Discard, rc, DrainLimit+1)
	stop.Stop()
	_ = rc.Close()
}

// DrainTimeout bounds Drain: reusing a connection is not worth waiting for
// a server that stalls in the middle of a body nobody reads.
const DrainTimeout = time.Second

// ErrTooLarge is returned by ReadAtMost when the body is longer than the
// limit.
var ErrTooLarge = errors.New("body: longer than the limit")

// ReadAtMost reads r up to limit bytes. It returns ErrTooLarge, and the
// bytes read so far, when r holds more. size, when in 0..limit, is the
// expected length (a request's ContentLength): the buffer is allocated
// once at that size.
func ReadAtMost(r io.Reader, limit, size int64) ([]byte, error) {
	return ReadAtMostContext(context.Background(), r, limit, size)
}

// ReadAtMostContext is ReadAtMost that fails with ctx's error, and the
// bytes read so far, once ctx is done, as a reader made by WithContext
// does, without making one: it checks ctx before each read, and closes r,
// when r is an io.Closer, once ctx is done, which ends a Read blocked in it.
// A reader of memory (InMemory) is not watched: its Read cannot block.
func ReadAtMostContext(ctx context.Context, r io.Reader, limit, size int64) ([]byte, error) {
	if c, ok := r.(io.Closer); ok && ctx.Done() != nil && !InMemory(r) {
		stop := closeOnDone(ctx, c)
		buf, err := readAtMost(ctx, r, limit, size)
		stop()
		return buf, closedErr(ctx, err)
	}
	return readAtMost(ctx, r, limit, size)
}

func readAtMost(ctx context.Context, r io.Reader, limit, size int64) ([]byte, error) {
	if size < 0 || size > limit {
		size = min(limit, 512)
	}
	// One byte more than expected: reading it is how EOF shows at the end
	// of a buffer of the exact size.
	buf := make([]byte, 0, size+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grows the buffer
		}
		if err := ctx.Err(); err != nil {
			return buf, err
		}
		n, err := r.Read(buf[len(buf):min(int64(cap(buf)), limit+1)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, ErrTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// OnClose wraps rc so that fn runs once, after rc is closed or read to its
// end (io.EOF), as net/http stops http.Client.Timeout's timer: it is used
// to release an attempt's context with its response body, which a caller
// that reads a body whole and never closes it would otherwise hold until
// the context it derives from ends. An rc that is also an io.Writer (the
// Body of a 101 Switching Protocols answer, the upgraded connection) is
// wrapped in an io.ReadWriteCloser that writes to it, and runs fn only
// once closed: the connection stays open to writes after its peer ended
// its own.
func OnClose(rc io.ReadCloser, fn func()) io.ReadCloser {
	c := &onClose{ReadCloser: rc, fn: fn}
	if w, ok := rc.(io.Writer); ok {
		return &onCloseWriter{onClose: c, w: w}
	}
	return c
}

type onCloseWriter struct {
	*onClose
	w io.Writer
}

func (c *onCloseWriter) Write(p []byte) (int, error) { return c.w.Write(p) }

func (c *onCloseWriter) Read(p []byte) (int, error) { return c.onClose.ReadCloser.Read(p) }

type onClose struct {
	io.ReadCloser
	fn   func()
	once sync.Once
}

func (c *onClose) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err == io.EOF {
		c.once.Do(c.fn)
	}
	return n, err
}

func (c *onClose) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.fn)
	return err
}

// WithContext returns a reader of rc that fails with ctx's error once ctx
// is done, so that reading a slow, stalled or endless body ends with its
// request: it checks ctx before each read, and closes rc once ctx is done,
// which ends a Read blocked in it (a pipe's, a connection's). Its Close
// closes rc.
func WithContext(ctx context.Context, rc io.ReadCloser) io.ReadCloser {
	c := &ctxReader{ctx: ctx, rc: rc}
	if ctx.Done() != nil {
		c.stop = closeOnDone(ctx, rc)
	}
	return c
}

type ctxReader struct {
	ctx  context.Context
	rc   io.ReadCloser
	stop func() // nil for a ctx that is never done
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.rc.Read(p)
	return n, closedErr(c.ctx, err)
}

func (c *ctxReader) Close() error {
	if c.stop != nil {
		c.stop()
	}
	return c.rc.Close()
}

// closeOnDone closes c once ctx is done, until the function it returns is
// called: a Read blocked in a pipe or a connection does not return when ctx
// ends, but does when its reader is closed. That function waits for a
// Close that began, so that the caller's own Close comes after it.
func closeOnDone(ctx context.Context, c io.Closer) (stop func()) {
	closed := make(chan struct{})
	after := context.AfterFunc(ctx, func() {
		_ = c.Close()
		close(closed)
	})
	return func() {
		if !after() {
			<-closed
		}
	}
}

// closedErr is the error of a read that returned err, once ctx may have
// closed its reader: ctx's error when the read failed and ctx is done,
// since closing the reader is what failed it.
func closedErr(ctx context.Context, err error) error {
	if err != nil && err != io.EOF && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// InMemory reports whether r reads from memory, so that its Read never
// blocks: http.NoBody, a *bytes.Reader, *bytes.Buffer or *strings.Reader,
// or io.NopCloser of one, which is what the Body and GetBody of
// http.NewRequest give for those three. Watching the context while such a
// body is read (context.AfterFunc) would cost a call five allocations and
// about a microsecond for nothing.
func InMemory(r io.Reader) bool { return inMemory(r) != nil }

// Len returns how many bytes are left to read in r when it reads from
// memory (InMemory), and false for any other reader.
func Len(r io.Reader) (int64, bool) {
	switch m := inMemory(r).(type) {
	case nil:
		return 0, false
	case interface{ Len() int }:
		return int64(m.Len()), true
	}
	return 0, true // http.NoBody
}

// inMemory returns the reader of memory that r is or wraps, or nil.
func inMemory(r io.Reader) io.Reader {
	for range 2 { // r, then the reader io.NopCloser wraps
		switch r.(type) {
		case *bytes.Reader, *bytes.Buffer, *strings.Reader:
			return r
		}
		if r == http.NoBody {
			return r
		}
		t := reflect.TypeOf(r)
		if t == nil || t != nopCloser && t != nopCloserWriterTo {
			return nil
		}
		r, _ = reflect.ValueOf(r).Field(0).Interface().(io.Reader)
	}
	return nil
}

// nopCloser and nopCloserWriterTo are the types io.NopCloser returns:
// structs whose one exported field is the io.Reader they wrap. Should they
// ever be otherwise, they are nil, and InMemory knows only the readers
// themselves.
var (
	nopCloser         = wrapper(io.NopCloser(struct{ io.Reader }{}))
	nopCloserWriterTo = wrapper(io.NopCloser(strings.NewReader("")))
)

func wrapper(rc io.ReadCloser) reflect.Type {
	t := reflect.TypeOf(rc)
	if t.Kind() != reflect.Struct || t.NumField() != 1 || !t.Field(0).IsExported() ||
		t.Field(0).Type != reflect.TypeFor[io.Reader]() {
		return nil
	}
	return t
}
