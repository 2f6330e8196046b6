package pgmigrate

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// splitPathCases are search_path settings and their entries as PostgreSQL
// reads them (SplitIdentifierString, then truncate_identifier), or !ok for
// a setting it refuses ("invalid value for parameter"). An empty entry in
// double quotes is one, which names no schema.
var splitPathCases = []struct {
	path    string
	entries []string
	ok      bool
}{
	{"", nil, true},
	{" \t\n", nil, true},
	{"public", []string{"public"}, true},
	{`"$user", public`, []string{"$user", "public"}, true},
	{`$user,public`, []string{"$user", "public"}, true},
	{`$USER`, []string{"$user"}, true},
	{`Jobs, PUBLIC`, []string{"jobs", "public"}, true},
	{`"Jobs"`, []string{"Jobs"}, true},
	{`"a,b", c`, []string{"a,b", "c"}, true},
	{`"my schema" , x`, []string{"my schema", "x"}, true},
	{`"say ""hi"""`, []string{`say "hi"`}, true},
	{"a\t,\nb", []string{"a", "b"}, true},
	{"a\vb", []string{"a\vb"}, true}, // \v is not whitespace to PostgreSQL (scanner_isspace)
	{"a,\vB", []string{"a", "\vb"}, true},
	{"\f a \r", []string{"a"}, true},
	{`a"b"`, []string{`a"b"`}, true},
	{`Éa`, []string{`Éa`}, true}, // ASCII letters alone are folded
	{strings.Repeat("A", 70), []string{strings.Repeat("a", 63)}, true},
	{`"` + strings.Repeat("B", 70) + `"`, []string{strings.Repeat("B", 63)}, true},
	{strings.Repeat("a", 62) + "é", []string{strings.Repeat("a", 62)}, true}, // é would be bytes 63 and 64
	{`""`, []string{""}, true},
	{`"", public`, []string{"", "public"}, true},
	{"a,,b", nil, false},
	{"a,", nil, false},
	{",a", nil, false},
	{" , ", nil, false},
	{`"a`, nil, false},
	{`"a"b`, nil, false},
	{`"a""`, nil, false},
	{"a b", nil, false},
}

// TestSplitPath: splitPath reads each setting as PostgreSQL does.
func TestSplitPath(t *testing.T) {
	for _, c := range splitPathCases {
		entries, ok := splitPath(c.path)
		if ok != c.ok || !slices.Equal(entries, c.entries) {
			t.Errorf("splitPath(%q) = %q, %v; want %q, %v", c.path, entries, ok, c.entries, c.ok)
		}
	}
}

// TestSplitPathCasesAsTheServer checks splitPathCases against the server:
// it refuses each setting marked !ok, and with a schema created for each
// entry of the others (the role's own for "$user"; none for "", which no
// schema is named), current_schemas(false) is those entries, in order.
func TestSplitPathCasesAsTheServer(t *testing.T) {
	ctx := t.Context()
	conn := pgtest.Connect(t, pgtest.DB(t))
	var user string
	if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil {
		t.Fatal(err)
	}
	for _, c := range splitPathCases {
		_, err := conn.Exec(ctx, `SELECT pg_catalog.set_config('search_path', $1, false)`, c.path)
		if !c.ok {
			if err == nil {
				t.Errorf("the server took search_path %q; want it refused", c.path)
			}
			continue
		}
		if err != nil {
			t.Errorf("search_path %q: %v", c.path, err)
			continue
		}
		var want []string
		for _, e := range c.entries {
			switch e {
			case "":
				continue
			case "$user":
				e = user
			}
			want = append(want, e)
			if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{e}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		if err := conn.QueryRow(ctx, `SELECT pg_catalog.current_schemas(false)`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("search_path %q: current_schemas(false) = %q; want %q", c.path, got, want)
		}
	}
}
