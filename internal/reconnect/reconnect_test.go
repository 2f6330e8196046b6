//go:build unix

package reconnect

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a TCP connection on 127.0.0.1.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// waitData waits until c's socket has something to read (data, the end
// of the stream), reading nothing: a peek that the poller repeats once the
// socket is readable.
func waitData(t *testing.T, c net.Conn) {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
		return !errors.Is(err, syscall.EAGAIN)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStale(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		c, s := pair(t)
		// A round trip, as a statement makes, then nothing.
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if Stale(c) {
			t.Error("Stale of an idle connection = true")
		}
		if Stale(tls.Client(c, &tls.Config{})) {
			t.Error("Stale of an idle connection under TLS = true")
		}
	})
	t.Run("data", func(t *testing.T) {
		c, s := pair(t)
		if _, err := s.Write([]byte("E")); err != nil {
			t.Fatal(err)
		}
		waitData(t, c)
		if !Stale(c) {
			t.Error("Stale of a connection with a message waiting = false")
		}
		if !Stale(tls.Client(c, &tls.Config{})) {
			t.Error("Stale under TLS of a connection with a message waiting = false")
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 'E' {
			t.Errorf("read after Stale = %q, %v; want the byte it peeked at", b, err)
		}
	})
	t.Run("closed by the peer", func(t *testing.T) {
		c, s := pair(t)
		s.Close()
		waitData(t, c)
		if !Stale(c) {
			t.Error("Stale of a connection the peer closed = false")
		}
	})
	t.Run("closed here", func(t *testing.T) {
		c, _ := pair(t)
		c.Close()
		if !Stale(c) {
			t.Error("Stale of a closed connection = false")
		}
	})
	t.Run("read waiting in another goroutine", func(t *testing.T) {
		// pgx's background reader waits in a Read on a connection at
		// rest, holding its read lock: Stale does not wait for it.
		c, _ := pair(t)
		reading, readDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(readDone)
			close(reading)
			_, _ = c.Read(make([]byte, 1))
		}()
		<-reading
		stale := make(chan bool, 1)
		go func() {
			// The Read may not wait yet at the first: every one of a
			// thousand looks ends, once it does too.
			got := false
			for range 1000 {
				got = got || Stale(c)
			}
			stale <- got
		}()
		select {
		case got := <-stale:
			if got {
				t.Error("Stale of an idle connection with a read waiting = true")
			}
		case <-time.After(10 * time.Second): // a hang, not a measure of time
			t.Error("Stale still waits for another goroutine's Read after 10s")
		}
		c.Close()
		<-readDone
	})
	t.Run("not a socket", func(t *testing.T) {
		c, s := net.Pipe()
		defer c.Close()
		defer s.Close()
		if Stale(c) {
			t.Error("Stale of a pipe = true")
		}
	})
}
