// Package reconnect is what the PostgreSQL stores need to ride out a brief
// outage of their server: telling a pooled connection that the server has
// closed from one that is idle, without a round trip.
package reconnect

import "net"

// Stale reports whether c, a connection idle since its last exchange, has
// something waiting to be read: a server that ends a session (PostgreSQL on
// a restart or pg_terminate_backend) sends an error and closes it, and a
// broken socket holds its error. An idle connection the server is still
// serving has nothing. Stale reads nothing: it peeks at the socket without
// waiting, one system call. It reports false when it cannot peek: c (or the
// connection under a *tls.Conn) is not a socket, or the platform has no
// MSG_PEEK.
func Stale(c net.Conn) bool {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		c = t.NetConn()
	}
	return peek(c)
}
