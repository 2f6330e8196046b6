// Package refusetest gives tests a TCP address on 127.0.0.1 that refuses
// every connection, a server that is down (Addr), a PostgreSQL server
// there that refuses every session (Session, PgBouncer), and an
// http.Transport whose Proxy function refuses every request (Proxy).
package refusetest

import "testing"

// Addr returns "127.0.0.1:port" for a port that nothing listens on, kept
// so until the test ends. On Linux and macOS it is the port of a TCP socket
// bound without SO_REUSEADDR and never listening: a connection to it is
// refused at once (ECONNREFUSED), and no other socket can bind the port,
// nor an outgoing connection take it as its own. Elsewhere it is the
// address of a listener closed at once, which another process may take.
func Addr(t testing.TB) string {
	t.Helper()
	return reserve(t)
}
