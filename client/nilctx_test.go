package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

// TestNilContext: every method that takes a context, given a nil one,
// returns an error matching ErrNilContext, as http.NewRequestWithContext
// refuses a nil Context, and panics not; nothing is sent, and the jar, a
// SQLite one whose queries would panic on a nil Context, keeps its
// operations as they were. New creates no jar file; Do closes the
// request's body, as http.Client.Do does on any error.
func TestNilContext(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := newShop()
	s.failNext(http.StatusServiceUnavailable)
	c, err := client.New(ctx, filepath.Join(dir, "jar.db"), &client.Options{Base: inProcess{s}, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want the 503 as a pending error", err)
	}
	if _, err := c.PostJSON(ctx, "charge:o2", chargesURL, chargeReq{Order: "o2", Amount: 100}, nil); err != nil {
		t.Fatal(err)
	}
	before, err := c.Jar().List(ctx, idem.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	sends := s.sends()

	var nilCtx context.Context
	newJar := filepath.Join(dir, "new.db")
	var open []*closeCounter // the bodies given to Do, which it must close
	newReq := func() *http.Request {
		b := &closeCounter{Reader: strings.NewReader(`{"order":"o3","amount":1}`)}
		open = append(open, b)
		req, err := http.NewRequest(http.MethodPost, chargesURL, b)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	getBody := func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(`{"order":"o1","amount":100}`)), nil
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"New with a path", func() error {
			c, err := client.New(nilCtx, newJar, nil)
			if c != nil {
				c.Close()
			}
			return err
		}},
		{"New with Options.Jar", func() error {
			c, err := client.New(nilCtx, "", &client.Options{Jar: &idem.MemoryJar{}})
			if c != nil {
				c.Close()
			}
			return err
		}},
		{"Do", func() error { _, err := c.Do(nilCtx, "charge:o3", newReq()); return err }},
		{"Do of a pending operation", func() error { _, err := c.Do(nilCtx, "charge:o1", newReq()); return err }},
		{"PostJSON", func() error {
			_, err := c.PostJSON(nilCtx, "charge:o3", chargesURL, chargeReq{Order: "o3", Amount: 1}, nil)
			return err
		}},
		{"Pending", func() error { _, err := c.Pending(nilCtx); return err }},
		{"Resume", func() error { _, err := c.Resume(nilCtx, "charge:o1"); return err }},
		{"ResumeJSON", func() error { _, err := c.ResumeJSON(nilCtx, "charge:o1", nil); return err }},
		{"ResumeWithBody", func() error { _, err := c.ResumeWithBody(nilCtx, "charge:o1", getBody); return err }},
		{"Abandon", func() error { return c.Abandon(nilCtx, "charge:o1", "checked") }},
		{"Forget", func() error { return c.Forget(nilCtx, "charge:o2") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				return tc.call()
			}()
			if !errors.Is(err, client.ErrNilContext) {
				t.Fatalf("%s(nil Context): %v; want an error matching ErrNilContext", tc.name, err)
			}
		})
	}

	for i, b := range open {
		if b.closed != 1 {
			t.Errorf("the body of Do's request %d was closed %d times; want once, as http.Client.Do closes it", i, b.closed)
		}
	}
	if s.sends() != sends {
		t.Errorf("%d requests sent with a nil Context; want none", s.sends()-sends)
	}
	after, err := c.Jar().List(ctx, idem.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, before) {
		t.Errorf("the jar holds %+v after the calls with a nil Context; want %+v, as before", after, before)
	}
	if _, err := os.Stat(newJar); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New with a nil Context: stat of its jar: %v; want no file created", err)
	}
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closed int
}

func (b *closeCounter) Close() error { b.closed++; return nil }

// TestNilRequest: Do given a nil request returns an error matching
// ErrNilRequest, and panics not, named or not; nothing is sent or
// stored. After Close it is ErrClosed, whatever the request.
func TestNilRequest(t *testing.T) {
	ctx := context.Background()
	s := newShop()
	jar := &idem.MemoryJar{}
	c, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{s}})
	if err != nil {
		t.Fatal(err)
	}
	do := func(op string) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		_, err = c.Do(ctx, op, nil)
		return err
	}
	for _, op := range []string{"charge:o1", ""} {
		if err := do(op); !errors.Is(err, client.ErrNilRequest) {
			t.Errorf("Do(%q, nil): %v; want an error matching ErrNilRequest", op, err)
		}
	}
	if recs, err := jar.List(ctx, idem.Filter{}); err != nil || len(recs) != 0 || s.sends() != 0 {
		t.Errorf("after Do with a nil request: %d sent, jar %v, %v; want nothing sent or stored", s.sends(), recs, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := do("charge:o1"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Do(nil) after Close: %v; want an error matching ErrClosed", err)
	}
}
