package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
)

// TestUnnamedNeverConnectedIsAbandoned: a call without a name whose every
// attempt failed to connect through net/http's Transport (the Client's
// default Base, or an *http.Transport given as Options.Base, with or without
// Options.Header) sent nothing, and no call can name it: it is abandoned,
// as the Transport abandons it over an *http.Transport of its own, not left
// pending for Pending and Resume to send once the host answers, after its
// caller was told it failed. A named one stays pending, and so does an
// unnamed one whose first attempt reached the server before the dials of
// its retries were refused.
func TestUnnamedNeverConnectedIsAbandoned(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	dialing := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, refused }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/charges" // nothing listens there
	ln.Close()
	// A server that reads the request and drops the connection, reached
	// by the first dial alone.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		panic(http.ErrAbortHandler)
	}))
	defer srv.Close()
	var dials atomic.Int32
	onceThenRefused := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) > 1 {
			return nil, refused
		}
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}
	for _, c := range []struct {
		name   string
		base   http.RoundTripper
		header func(*http.Request) error
		op     string
		state  idem.State
	}{
		{"default Base", nil, nil, "", idem.StateAbandoned},
		{"an http.Transport", dialing, nil, "", idem.StateAbandoned},
		{"an http.Transport, Options.Header", dialing, withAuth, "", idem.StateAbandoned},
		{"default Base, named", nil, nil, "charge:o1", idem.StatePending},
		{"sent, then refused", onceThenRefused, nil, "", idem.StatePending},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			cl, err := client.New(ctx, filepath.Join(t.TempDir(), "keys.db"), &client.Options{Base: c.base, Header: c.header, Policy: fastPolicy})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			_, err = cl.PostJSON(ctx, c.op, closed, chargeReq{Order: "o1"}, nil)
			if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, idem.ErrPending) != (c.state == idem.StatePending) {
				t.Errorf("PostJSON: %v; want the dial's error, pending: %v", err, c.state == idem.StatePending)
			}
			all, err := cl.Jar().List(ctx, idem.Filter{})
			if err != nil || len(all) != 1 || all[0].State != c.state || all[0].Holder != "" {
				t.Fatalf("jar: %+v, %v; want one record, %s, no holder", all, err, c.state)
			}
			pending, err := cl.Pending(ctx)
			if err != nil || len(pending) != map[bool]int{true: 1}[c.state == idem.StatePending] {
				t.Errorf("Pending: %d, %v", len(pending), err)
			}
		})
	}
}
