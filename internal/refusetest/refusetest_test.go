//go:build linux || darwin

package refusetest_test

import (
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/refusetest"
)

// TestAddr: a connection to the address is refused, and the port stays
// taken: a listener on it fails, on 127.0.0.1 and (on Linux, where a
// wildcard address overlaps every other) on all addresses. A listener
// closed at once, as tests used before, would let both listen.
func TestAddr(t *testing.T) {
	addr := refusetest.Addr(t)
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial(%s) = %v; want ECONNREFUSED", addr, err)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	others := []string{addr}
	if runtime.GOOS == "linux" {
		others = append(others, ":"+port)
	}
	for _, other := range others {
		ln, err := net.Listen("tcp", other)
		if err == nil {
			ln.Close()
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("Listen(%s) = %v; want EADDRINUSE: the port is kept", other, err)
		}
	}
}
