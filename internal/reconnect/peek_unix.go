//go:build unix

package reconnect

import (
	"errors"
	"net"
	"syscall"
)

// peek reports whether c's socket has data, the end of the stream or an
// error to read. It peeks with MSG_DONTWAIT: a peek at an empty socket
// fails with EAGAIN at once. It runs under Control, not Read: another
// goroutine may hold the socket's read lock while it waits to read, as
// pgx's background reader does on a connection at rest, and a peek under
// Read would wait for that read to end.
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
	if err := raw.Control(func(fd uintptr) {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return true // closed on this side
	}
	return !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK) && !errors.Is(rerr, syscall.EINTR)
}
