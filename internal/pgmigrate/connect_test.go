package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/refusetest"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestCacheHint: the server's refusal of a statement that pgx's cache
// named, either way round, is followed by the hint, and is still found by
// errors.As; any other error, a statement of another name included, is
// returned as it is.
func TestCacheHint(t *testing.T) {
	const hint = "; behind a pooler in transaction mode? add default_query_exec_mode=exec to the DSN: see README, Behind PgBouncer"
	for _, tc := range []struct {
		code, msg string
		hinted    bool
	}{
		{"42P05", `prepared statement "stmtcache_0a1b" already exists`, true},
		{"26000", `prepared statement "stmtcache_0a1b" does not exist`, true},
		{"42P05", `prepared statement "mine" already exists`, false},
		{"23505", `duplicate key value violates unique constraint "stmtcache_0a1b"`, false},
	} {
		in := fmt.Errorf("pgjar: get: %w", &pgconn.PgError{Severity: "ERROR", Code: tc.code, Message: tc.msg})
		out := CacheHint(in)
		var pe *pgconn.PgError
		if !errors.As(out, &pe) || pe.Code != tc.code {
			t.Errorf("CacheHint(%v) = %v; want *pgconn.PgError %s found in it", in, out, tc.code)
		}
		if got := strings.HasSuffix(out.Error(), hint); got != tc.hinted || !strings.HasPrefix(out.Error(), in.Error()) {
			t.Errorf("CacheHint(%v) = %q; want it with the hint %v", in, out, tc.hinted)
		}
	}
	if err := CacheHint(nil); err != nil {
		t.Errorf("CacheHint(nil) = %v", err)
	}
}

// TestOneLine: an error that holds pgx's error for a connection that could
// not be made (a server down, tried with TLS and then without, as pgx's
// default sslmode prefer does) says so in one line, the dial's error once,
// with the rest of its message kept, and still wraps what it wrapped; any
// other error is returned as it is.
func TestOneLine(t *testing.T) {
	_, err := pgconn.Connect(t.Context(), "postgres://ops@"+refusetest.Addr(t)+"/jars?connect_timeout=5")
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "\n") {
		t.Fatalf("connect to a server that is down: %v; want a *pgconn.ConnectError of more than one line", err)
	}
	in := fmt.Errorf("%w, after: %w", context.Canceled, err)
	out := OneLine(in)
	const want = "context canceled, after: connection to the database failed (user=ops database=jars): "
	if msg := out.Error(); !strings.HasPrefix(msg, want) || strings.Contains(msg, "\n") || strings.Count(msg, "connection refused") != 1 ||
		!errors.Is(out, context.Canceled) || !errors.As(out, &ce) {
		t.Errorf("OneLine(%q) = %q; want one line beginning %q, saying connection refused once, matching context.Canceled and *pgconn.ConnectError", in, msg, want)
	}
	other := errors.New("pgjar: get: no rows")
	if out := OneLine(other); out != other {
		t.Errorf("OneLine(%v) = %v; want it as it is", other, out)
	}
}

// TestPoolerHintOwnParameter: PgBouncer's refusal of a startup parameter
// of the DSN's own (search_path) is followed by a hint that does not say to
// list it in ignore_startup_parameters, which drops it (the session then
// runs with the role's search_path, and the tables would be looked for in
// another schema), but to set it on the role. Before, the hint said to
// list it there.
func TestPoolerHintOwnParameter(t *testing.T) {
	err := &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "unsupported startup parameter: search_path"}
	hint := PoolerHint(err)
	if strings.Contains(hint, "list search_path") || !strings.Contains(hint, "set search_path on the role") ||
		!strings.Contains(hint, "ignore_startup_parameters") {
		t.Errorf("PoolerHint(%v) = %q; want it to say to set search_path on the role, not to list it in ignore_startup_parameters", err, hint)
	}
}

// TestKept: a session's search_path that is the one the config sets, as
// PostgreSQL reads both, is kept; one another, or none set, is not.
func TestKept(t *testing.T) {
	sentinel := errors.New("incomplete")
	for _, tc := range []struct {
		want, path string
		set, kept  bool
	}{
		{"", `"$user", public`, false, true},
		{"jobs", "jobs", true, true},
		{"jobs,public", "jobs, public", true, true},
		{"Jobs", "jobs", true, true},
		{`"Jobs"`, "jobs", true, false},
		{"jobs", `"$user", public`, true, false},
	} {
		params := map[string]string{}
		if tc.set {
			params["search_path"] = tc.want
		}
		err := Kept(params, tc.path, sentinel)
		if (err == nil) != tc.kept || (err != nil && (!errors.Is(err, sentinel) || !errors.Is(err, ErrPathDropped))) {
			t.Errorf("Kept(%q, %q) = %v; want kept %v", tc.want, tc.path, err, tc.kept)
		}
	}
}
