//go:build unix

package reconnect

import (
	"errors"
	"net"
	"syscall"
)

// peek reports whether c's socket has data, the end of the stream or an
// error to read. The socket is non-blocking, as every socket of the net
// package is: a peek at an empty one fails with EAGAIN at once.
func peek(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf  [1]byte
		rerr error
	)
	if err := raw.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
		return true // never wait for readiness
	}); err != nil {
		return true // closed on this side
	}
	return !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK) && !errors.Is(rerr, syscall.EINTR)
}
