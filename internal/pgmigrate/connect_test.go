package pgmigrate

import (
	"errors"
	"fmt"
	"strings"
	"testing"

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
