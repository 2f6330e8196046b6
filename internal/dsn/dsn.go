// Package dsn prints PostgreSQL connection URLs without their secrets, for
// the commands' messages.
package dsn

import "net/url"

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
