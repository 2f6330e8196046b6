package dsn

import (
	"strings"
	"testing"
)

func TestRedacted(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://ops:s3cret@db:5432/jar", "postgres://ops:xxxxx@db:5432/jar"},
		{"postgresql://ops@db/jar?password=s3cret&sslmode=disable", "postgresql://ops@db/jar?password=xxxxx&sslmode=disable"},
		{"postgres://db/jar?sslpassword=s3cret", "postgres://db/jar?sslpassword=xxxxx"},
		{"postgres://ops@db/jar?sslmode=disable", "postgres://ops@db/jar?sslmode=disable"},
		{"keys.db", "keys.db"},
		{"postgres://%zz", "the database"},
	} {
		got := Redacted(c.in, "the database")
		if got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("Redacted(%q) = %q; want %q", c.in, got, c.want)
		}
	}
}

func TestRefused(t *testing.T) {
	for _, s := range []string{
		"host=db dbname=jar password=s3cret", "postgres:/ops:s3cret@db/jar", "postgresql:ops@db/jar", "Postgres://db/jar", "POSTGRESQL://db/jar",
	} {
		if why := Refused(s); why == "" || strings.Contains(why, "s3cret") {
			t.Errorf("Refused(%q) = %q; want a reason, without the password", s, why)
		}
	}
	for _, s := range []string{"keys.db", "/var/lib/idem/keys.db", "postgres://ops@db/jar", "postgresql://db/jar", "postgres.db", "./postgres:x"} {
		if why := Refused(s); why != "" {
			t.Errorf("Refused(%q) = %q; want it taken", s, why)
		}
	}
}

func TestIsKeywordValue(t *testing.T) {
	for _, s := range []string{
		"host=db dbname=jar user=ops password=s3cret",
		"  dbname = jar",
		"user=ops",
		"sslmode=disable host=/tmp",
	} {
		if !IsKeywordValue(s) {
			t.Errorf("IsKeywordValue(%q) = false; want true", s)
		}
	}
	for _, s := range []string{
		"keys.db", "/var/lib/idem/keys.db", "postgres://ops@db/jar?sslmode=disable", "a=b.db", "=host", "./host=x", "",
	} {
		if IsKeywordValue(s) {
			t.Errorf("IsKeywordValue(%q) = true; want false", s)
		}
	}
}
