package reconnect

import (
	"errors"
	"testing"

	"github.com/idemkit/idem/internal/refusetest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// refusing starts a server on 127.0.0.1 that answers each connection's
// startup message with a FATAL error of SQLSTATE code and message, as
// PostgreSQL (or PgBouncer) refuses a session, and returns a DSN for it.
func refusing(t *testing.T, code, message string) string {
	t.Helper()
	addr, _ := refusetest.Session(t, func(map[string]string) *pgproto3.ErrorResponse {
		return &pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: message}
	})
	return "postgres://u@" + addr + "/db?sslmode=disable&connect_timeout=10"
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
		{"starting up (57P03)", refusing(t, "57P03", "refused"), true},
		{"too many connections (53300)", refusing(t, "53300", "refused"), true},
		{"password refused (28P01)", refusing(t, "28P01", "refused"), false},
		{"pg_hba.conf or role refused (28000)", refusing(t, "28000", "refused"), false},
		{"database does not exist (3D000)", refusing(t, "3D000", "refused"), false},
		{"no CONNECT privilege (42501)", refusing(t, "42501", "refused"), false},
		{"database not accepting connections (55000)", refusing(t, "55000", "refused"), false},
		{"unknown setting (42704)", refusing(t, "42704", "refused"), false},
		{"invalid setting value (22023)", refusing(t, "22023", "refused"), false},
		{"setting only a restart sets (55P02)", refusing(t, "55P02", "refused"), false},
		{"PgBouncer: a startup parameter it does not take (08P01)",
			refusing(t, "08P01", "unsupported startup parameter: statement_timeout"), false},
		{"PgBouncer, in earlier versions' words (08P01)",
			refusing(t, "08P01", "Unsupported startup parameter: search_path"), false},
		{"PgBouncer: max_client_conn reached (08P01)",
			refusing(t, "08P01", "no more connections allowed (max_client_conn)"), true},
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
