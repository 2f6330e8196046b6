package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Querier is a connection or a pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Layout describes tables (names as the search path finds them) as the
// catalog holds them, for a test to compare one database's with another's
// or to look for a column's collation: each column, table by table in the
// order given and in the table's order, as "table.column type collate
// name", with " not null" after it when it is, then each index, in the
// order of their definitions, as "index definition collate names", one
// collation a column of the index. A type without collations has "-".
func Layout(t testing.TB, q Querier, tables ...string) []string {
	t.Helper()
	rows, err := q.Query(t.Context(), `SELECT line FROM (
		SELECT 0 AS part, o.n, a.attnum AS k, o.name || '.' || a.attname || ' ' ||
			pg_catalog.format_type(a.atttypid, a.atttypmod) || ' collate ' || coalesce(c.collname, '-') ||
			CASE WHEN a.attnotnull THEN ' not null' ELSE '' END AS line
		FROM unnest($1::text[]) WITH ORDINALITY AS o(name, n)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = o.name::regclass AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation
		UNION ALL
		SELECT 1, 0, 0, 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid) || ' collate ' ||
			(SELECT string_agg(coalesce(c.collname, '-'), ',' ORDER BY k.n)
				FROM unnest(i.indcollation::oid[]) WITH ORDINALITY AS k(coll, n)
				LEFT JOIN pg_catalog.pg_collation c ON c.oid = k.coll)
		FROM unnest($1::text[]) AS o(name)
		JOIN pg_catalog.pg_index i ON i.indrelid = o.name::regclass
	) AS l ORDER BY part, n, k, line`, tables)
	if err != nil {
		t.Fatal(err)
	}
	l, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return l
}
