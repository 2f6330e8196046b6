package reconnect

import (
	"errors"
	"net"
	"testing"

	"github.com/idemkit/idem/internal/refusetest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// refusing starts a server on 127.0.0.1 that answers each connection's
// startup message with a FATAL error of SQLSTATE code, as PostgreSQL
// refuses a session, and returns a DSN for it.
func refusing(t *testing.T, code string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
			if _, err := b.ReceiveStartupMessage(); err == nil {
				b.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: "refused"})
				_ = b.Flush()
			}
			c.Close()
		}
	}()
	return "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable&connect_timeout=10"
}

// TestLostConnect: a connection that could not be made is lost while the
// server may yet take one (down, starting, out of slots), and not when
// it refused the session (see refusal): a wrong password, a pg_hba.conf
// rejection, a database that does not exist or that the role may not
// connect to, a setting of the connection string the server does not
// take, stay so, and trying again only delays the error. The codes are
// those PostgreSQL 15 sends for each.
func TestLostConnect(t *testing.T) {
	downDSN := "postgres://u@" + refusetest.Addr(t) + "/db?sslmode=disable&connect_timeout=10"
	for _, tc := range []struct {
		name string
		dsn  string
		want bool
	}{
		{"server down", downDSN, true},
		{"starting up (57P03)", refusing(t, "57P03"), true},
		{"too many connections (53300)", refusing(t, "53300"), true},
		{"password refused (28P01)", refusing(t, "28P01"), false},
		{"pg_hba.conf or role refused (28000)", refusing(t, "28000"), false},
		{"database does not exist (3D000)", refusing(t, "3D000"), false},
		{"no CONNECT privilege (42501)", refusing(t, "42501"), false},
		{"database not accepting connections (55000)", refusing(t, "55000"), false},
		{"unknown setting (42704)", refusing(t, "42704"), false},
		{"invalid setting value (22023)", refusing(t, "22023"), false},
		{"setting only a restart sets (55P02)", refusing(t, "55P02"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := pgconn.Connect(t.Context(), tc.dsn)
			if err == nil {
				conn.Close(t.Context())
				t.Fatal("Connect succeeded")
			}
			var connectErr *pgconn.ConnectError
			if !errors.As(err, &connectErr) {
				t.Fatalf("Connect = %v (%T); want a *pgconn.ConnectError", err, err)
			}
			if got := Lost(t.Context(), nil, err); got != tc.want {
				t.Errorf("Lost(%v) = %v; want %v", err, got, tc.want)
			}
		})
	}
}
