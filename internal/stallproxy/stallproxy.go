// Package stallproxy is a TCP proxy on 127.0.0.1, for tests, whose
// connections can be made to stop carrying anything while they stay open,
// as under a lost route or a NAT that dropped its mapping: what a client's
// HTTP/2 health check exists to find.
package stallproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// A Proxy forwards the TCP connections it accepts to its target until
// Stall is called: from then on, the connections it has forwarded carry
// nothing more either way and stay open. Connections accepted later are
// forwarded.
type Proxy struct {
	ln       net.Listener
	accepted atomic.Int32

	mu      sync.Mutex
	stalled []*atomic.Bool
	conns   []net.Conn
}

// New starts a Proxy to target on 127.0.0.1, closed with its connections
// when t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.accepted.Add(1)
			stalled := new(atomic.Bool)
			p.mu.Lock()
			p.stalled = append(p.stalled, stalled)
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go forward(s, c, stalled)
			go forward(c, s, stalled)
		}
	}()
	return p
}

// Addr is the address the Proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many connections the Proxy has forwarded.
func (p *Proxy) Accepted() int { return int(p.accepted.Load()) }

// Stall stops every connection forwarded so far.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stalled {
		s.Store(true)
	}
}

// forward copies src to dst until either fails, dropping what it reads
// once stalled is set.
func forward(dst, src net.Conn, stalled *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if stalled.Load() {
			if err != nil {
				return
			}
			continue
		}
		if _, werr := dst.Write(buf[:n]); werr != nil || err != nil {
			dst.Close()
			return
		}
	}
}
