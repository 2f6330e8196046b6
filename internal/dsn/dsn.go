// Package dsn tells the commands' PostgreSQL URLs from file names, and prints
// them without their secrets.
package dsn

import (
	"net/url"
	"strings"
)

// Redacted returns the postgres:// or postgresql:// URL s fit to print: the
// password replaced by "xxxxx", whether it is in the userinfo or in a query
// parameter (password, sslpassword), as pgx accepts both. A URL that does
// not parse is printed as what. Anything else is returned as it is.
func Redacted(s, what string) string {
	u, err := url.Parse(s)
	if err != nil {
		return what
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return s
	}
	q := u.Query()
	changed := false
	for _, name := range []string{"password", "sslpassword"} {
		if q.Has(name) {
			q.Set(name, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// conninfoKeywords are the keywords of libpq's key=value connection
// strings that pgx reads, and with which no file name is likely to begin.
var conninfoKeywords = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true, "password": true,
	"passfile": true, "connect_timeout": true, "sslmode": true, "sslcert": true, "sslkey": true,
	"sslrootcert": true, "sslpassword": true, "service": true, "servicefile": true,
	"target_session_attrs": true, "application_name": true, "options": true,
}

// IsKeywordValue reports whether s is a libpq key=value connection string
// ("host=db dbname=jar user=ops"), as pgx reads it: its first word is one
// of libpq's keywords followed by "=". Such a string may hold a password,
// so a message must not print it.
func IsKeywordValue(s string) bool {
	s = strings.TrimLeft(s, " \t\n\r\f\v")
	i := strings.IndexByte(s, '=')
	if i <= 0 {
		return false
	}
	return conninfoKeywords[strings.TrimRight(s[:i], " \t\n\r\f\v")]
}

// IsURL reports whether s names a PostgreSQL database by URL, postgres://
// or postgresql://, rather than a file.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Refused returns why a command refuses s as the name of a database, or ""
// when it takes it: a key=value connection string, or a PostgreSQL URL
// misspelt (one slash, the scheme in capitals), which would otherwise be
// taken for a file name. The reason does not quote s, which may hold a
// password.
func Refused(s string) string {
	lower := strings.ToLower(s)
	switch {
	case IsKeywordValue(s):
		return "a key=value connection string is not taken: give the PostgreSQL database as a URL, postgres://user:password@host:port/dbname?sslmode=…"
	case !IsURL(s) && (strings.HasPrefix(lower, "postgres:") || strings.HasPrefix(lower, "postgresql:")):
		return "not a PostgreSQL URL: write postgres://user:password@host:port/dbname, with two slashes and the scheme in lower case"
	}
	return ""
}
