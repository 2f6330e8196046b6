package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar"
)

// TestCloseWaitsForCallsInFlight: Close while a call is being answered
// waits for it, so that the jar New opened writes its outcome before it
// closes. A Close that closed the jar at once would leave the operation
// pending, leased, in the file, while its caller got the answer.
func TestCloseWaitsForCallsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		path := filepath.Join(t.TempDir(), "keys.db")
		s := newShop()
		arrived, release := make(chan struct{}), make(chan struct{})
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			close(arrived)
			<-release
			return inProcess{s}.RoundTrip(r)
		})
		c, err := client.New(ctx, path, &client.Options{Base: slow, Header: withAuth, Policy: fastPolicy})
		if err != nil {
			t.Fatal(err)
		}
		called := make(chan error, 1)
		go func() {
			_, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
			called <- err
		}()
		<-arrived
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		synctest.Wait()
		select {
		case err := <-closed:
			t.Errorf("Close returned (%v) while a call was in flight", err)
			closed <- err
		default:
		}
		close(release)
		if err := <-called; err != nil {
			t.Fatalf("the call: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		j, err := keyjar.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		rec, err := j.Get(ctx, "charge:o1")
		if err != nil || rec.State != idem.StateDone || rec.Holder != "" {
			t.Fatalf("after Close: %s, holder %q, %v; want done, its lease given back", rec.State, rec.Holder, err)
		}
	})
}

// TestCallsAfterCloseAreRefused: once Close began, a call through the
// Client, its HTTPClient or a resume sends nothing, and it and the other
// methods that use the jar return an error matching ErrClosed, also over a
// jar of the caller's, which Close leaves open; a second Close returns
// ErrClosed too.
func TestCallsAfterCloseAreRefused(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	sent := s.sends()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PostJSON(ctx, "charge:o2", chargesURL, chargeReq{Order: "o2"}, nil); !errors.Is(err, client.ErrClosed) {
		t.Errorf("PostJSON after Close: %v; want ErrClosed", err)
	}
	req, err := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o3"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.HTTPClient().Do(req); !errors.Is(err, client.ErrClosed) {
		t.Errorf("HTTPClient().Do after Close: %v; want ErrClosed", err)
	}
	if _, err := c.Resume(ctx, "charge:o1"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Resume after Close: %v; want ErrClosed", err)
	}
	if _, err := c.Pending(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Pending after Close: %v; want ErrClosed", err)
	}
	if err := c.Abandon(ctx, "charge:o1", "checked"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Abandon after Close: %v; want ErrClosed", err)
	}
	// The other methods, and ones whose arguments are wrong besides: the
	// Client is closed whatever they are given.
	getBody := func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(`{}`)), nil }
	for name, call := range map[string]func() error{
		"Do": func() error {
			req, err := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o4"}`))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Do(ctx, "charge:o4", req)
			return err
		},
		"ResumeJSON":     func() error { _, err := c.ResumeJSON(ctx, "charge:o1", nil); return err },
		"ResumeWithBody": func() error { _, err := c.ResumeWithBody(ctx, "charge:o1", getBody); return err },
		"Forget":         func() error { return c.Forget(ctx, "charge:o1") },
		"PostJSON of what JSON cannot encode": func() error {
			_, err := c.PostJSON(ctx, "charge:o5", chargesURL, make(chan int), nil)
			return err
		},
		"PostJSON to a URL that does not parse": func() error {
			_, err := c.PostJSON(ctx, "charge:o6", "://nowhere", chargeReq{Order: "o6"}, nil)
			return err
		},
		"ResumeWithBody with a nil getBody": func() error { _, err := c.ResumeWithBody(ctx, "charge:o1", nil); return err },
		"Abandon without a reason":          func() error { return c.Abandon(ctx, "charge:o1", "") },
	} {
		if err := call(); !errors.Is(err, client.ErrClosed) {
			t.Errorf("%s after Close: %v; want ErrClosed", name, err)
		}
	}
	if s.sends() != sent {
		t.Errorf("%d requests sent after Close; want none", s.sends()-sent)
	}
	if err := c.Close(); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Close twice: %v; want ErrClosed", err)
	}
}
