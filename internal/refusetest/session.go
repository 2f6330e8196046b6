package refusetest

import (
	"net"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Session starts a PostgreSQL server on 127.0.0.1 that refuses every
// session: it answers an SSLRequest with 'N', as a server without TLS
// does, and the startup message with the FATAL error refuse returns for
// its parameters, and closes the connection. It returns the server's
// address and a function that counts the startup messages it received.
func Session(t testing.TB, refuse func(params map[string]string) *pgproto3.ErrorResponse) (addr string, sessions func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("refusetest: %v", err)
	}
	count := make(chan int, 1)
	count <- 0
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			b := pgproto3.NewBackend(c, c)
			for range 2 { // an SSLRequest, then the startup message
				msg, err := b.ReceiveStartupMessage()
				if err != nil {
					break
				}
				if _, ok := msg.(*pgproto3.SSLRequest); ok {
					if _, err := c.Write([]byte{'N'}); err != nil {
						break
					}
					continue
				}
				if sm, ok := msg.(*pgproto3.StartupMessage); ok {
					count <- <-count + 1
					b.Send(refuse(sm.Parameters))
					_ = b.Flush()
				}
				break
			}
			c.Close()
		}
	}()
	return ln.Addr().String(), func() int { n := <-count; count <- n; return n }
}

// PgBouncer starts a server on 127.0.0.1 that refuses a session as
// PgBouncer 1.18 does one with a startup parameter it neither tracks nor
// ignores (ignore_startup_parameters empty): with SQLSTATE 08P01 and
// "unsupported startup parameter: " and the parameter's name, the first of
// them in alphabetical order (PgBouncer names the first in the message).
// A session without one is refused as a wrong password is (28P01). It
// returns the server's address and a count of the sessions it refused.
func PgBouncer(t testing.TB) (addr string, sessions func() int) {
	t.Helper()
	return Session(t, func(params map[string]string) *pgproto3.ErrorResponse {
		names := make([]string, 0, len(params))
		for name := range params {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			switch name {
			case "user", "database", "replication", // the session's own
				"client_encoding", "DateStyle", "TimeZone", "standard_conforming_strings", "application_name": // tracked
				continue
			}
			return &pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01", Message: "unsupported startup parameter: " + name}
		}
		return &pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"}
	})
}
