package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Dropping starts a relay on 127.0.0.1 in front of the server dsn names
// that removes the startup parameters names from each new session, as
// PgBouncer does with those its ignore_startup_parameters lists, and
// passes everything else on as it is. It returns dsn with the relay's
// address in place of the server's; t's end closes the relay and its
// connections.
func Dropping(t testing.TB, dsn string, names ...string) string {
	t.Helper()
	_, relayed := newRelay(t, dsn, names)
	return relayed
}

// dropStartup reads c's startup message, refusing TLS, and sends it to s
// without names.
func dropStartup(c, s net.Conn, names []string) error {
	b := pgproto3.NewBackend(c, c)
	var sm *pgproto3.StartupMessage
	for sm == nil {
		msg, err := b.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.Write([]byte{'N'}); err != nil {
				return err
			}
		case *pgproto3.StartupMessage:
			sm = m
		default:
			return fmt.Errorf("unexpected startup message %T", msg)
		}
	}
	for _, name := range names {
		delete(sm.Parameters, name)
	}
	buf, err := sm.Encode(nil)
	if err != nil {
		return err
	}
	_, err = s.Write(buf)
	return err
}

// SettingsDropped checks a package's Open (pgjar's, pgstore's) through a
// pooler that drops the three startup parameters Open sets (Dropping):
// the session then runs on the role's settings, and Open must refuse one
// whose default_transaction_isolation is not read committed, or whose
// synchronous_commit is off while the DSN chose none, with errPool saying
// which and ALTER ROLE; straight to the server, where the DSN's settings
// win, and with the role's settings reset, open must succeed. open opens
// and closes what the package opens.
func SettingsDropped(t *testing.T, open func(ctx context.Context, dsn string) error, errPool error) {
	t.Helper()
	ctx := t.Context()
	dsn := DB(t)
	admin := Connect(t, dsn)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := `ALTER ROLE CURRENT_USER IN DATABASE ` + pgx.Identifier{db}.Sanitize()
	dropped := Dropping(t, dsn, "default_transaction_isolation", "synchronous_commit", "statement_timeout")
	for _, c := range []struct{ set, want string }{
		{`default_transaction_isolation = 'serializable'`, `default_transaction_isolation is "serializable"`},
		{`synchronous_commit = off`, `synchronous_commit is "off"`},
	} {
		if _, err := admin.Exec(ctx, role+` SET `+c.set); err != nil {
			t.Fatal(err)
		}
		err := open(ctx, dropped)
		if !errors.Is(err, errPool) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "ALTER ROLE") {
			t.Errorf("Open through a pooler that drops its startup parameters, role with %s: %v; want %v saying %s and ALTER ROLE", c.set, err, errPool, c.want)
		}
		if err := open(ctx, dsn); err != nil { // straight to the server, the DSN's settings win
			t.Errorf("Open straight to the server, role with %s: %v; want it open", c.set, err)
		}
		if _, err := admin.Exec(ctx, role+` RESET ALL`); err != nil {
			t.Fatal(err)
		}
	}
	if err := open(ctx, dropped); err != nil {
		t.Errorf("Open through the pooler, the role's settings reset: %v; want it open", err)
	}
}
