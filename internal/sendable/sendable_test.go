package sendable_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/sendable"
)

// TestHeadAsNetHTTP: for every byte in a method, a field name and a field
// value, Head refuses what net/http itself refuses unsent: NewRequest's
// method check and the Transport's header check, which it makes before it
// dials. A Host it leaves to net/http.
func TestHeadAsNetHTTP(t *testing.T) {
	errDial := errors.New("dialled")
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, errDial }}
	newReq := func() *http.Request {
		r, err := http.NewRequest(http.MethodPost, "http://pay.example/v1/charges", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// headerSent reports whether the Transport goes on to dial for r.
	headerSent := func(r *http.Request) bool {
		_, err := tr.RoundTrip(r)
		if !errors.Is(err, errDial) && !strings.Contains(err.Error(), "invalid header") {
			t.Fatalf("RoundTrip: %v; want the dial's error or an invalid header", err)
		}
		return errors.Is(err, errDial)
	}
	for i := range 256 {
		b := string([]byte{byte(i)})

		_, err := http.NewRequest("P"+b+"T", "http://pay.example/", nil)
		r := newReq()
		r.Method = "P" + b + "T"
		if got := sendable.Head(r) == ""; got != (err == nil) {
			t.Errorf("method with byte %#x: Head sends it %v; NewRequest: %v", i, got, err)
		}

		// A Host net/http sends empty over HTTP/1 (a Unix socket's
		// path, go.dev/issue/61431) is left to it, whatever its bytes.
		r = newReq()
		r.Host = "a" + b + "b"
		if what := sendable.Head(r); what != "" {
			t.Errorf("Host with byte %#x: Head refuses it (%s); want it left to net/http", i, what)
		}

		r = newReq()
		r.Header["X-A"+b] = []string{"v"}
		if got, sent := sendable.Head(r) == "", headerSent(r); got != sent {
			t.Errorf("field name with byte %#x: Head sends it %v; the Transport %v", i, got, sent)
		}
		r = newReq()
		r.Header["X-A"] = []string{"a" + b + "b"}
		if got, sent := sendable.Head(r) == "", headerSent(r); got != sent {
			t.Errorf("field value with byte %#x: Head sends it %v; the Transport %v", i, got, sent)
		}
	}
}

// TestHeadAllocatesNothing: Head runs on every keyed call over an
// http.Transport; a request it sends costs it no allocation.
func TestHeadAllocatesNothing(t *testing.T) {
	r, _ := http.NewRequest(http.MethodPost, "http://pay.example:8080/v1/charges", nil)
	r.Header.Set("Authorization", "Bearer x")
	r.Header.Set("Content-Type", "application/json")
	if n := testing.AllocsPerRun(100, func() {
		if what := sendable.Head(r); what != "" {
			t.Fatal(what)
		}
	}); n != 0 {
		t.Errorf("%v allocations; want none", n)
	}
}
