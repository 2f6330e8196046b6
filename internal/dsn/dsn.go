// Package dsn tells the commands' PostgreSQL URLs from file names, and prints
// them without their secrets, as it prints any text that may quote a URL
// (an error's message) without the passwords of its URLs.
package dsn

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Redacted returns the postgres:// or postgresql:// URL s fit to print: the
// password replaced by "xxxxx", whether it is in the userinfo or in a query
// parameter (password, sslpassword), as pgx accepts both. s is split as pgx
// splits it, not as net/url does: the userinfo ends at the first '@' that
// comes before any '/', and a query value runs to the next '&', with any
// ';' or '#' in it. A query key is compared percent-decoded, trimmed and in
// any case, and every value whose key holds "password" is masked. A URL that
// does not parse, or with an '@' left after its userinfo (a password pgx
// may read otherwise), is printed as what. Anything else is returned as it
// is.
func Redacted(s, what string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || (!strings.EqualFold(scheme, "postgres") && !strings.EqualFold(scheme, "postgresql")) {
		return s
	}
	if _, err := url.Parse(s); err != nil {
		return what
	}
	var b strings.Builder
	b.WriteString(scheme + "://")
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		user, _, hasPassword := strings.Cut(rest[:i], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":xxxxx")
		}
		b.WriteByte('@')
		rest = rest[i+1:]
	}
	if strings.Contains(rest, "@") {
		return what
	}
	hostPath, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(hostPath)
	if !hasQuery {
		return b.String()
	}
	b.WriteByte('?')
	for i, pair := range strings.Split(query, "&") {
		if i > 0 {
			b.WriteByte('&')
		}
		key, _, hasValue := strings.Cut(pair, "=")
		if hasValue && strings.Contains(strings.ToLower(decodeKey(key)), "password") {
			pair = key + "=xxxxx"
		}
		b.WriteString(pair)
	}
	return b.String()
}

// MaskPasswords returns s, a text that may quote URLs (an error's message),
// with the password of each URL's userinfo replaced by "xxxxx", as
// url.URL.Redacted writes it: "scheme://user:xxxxx@host". The userinfo is
// what url.Parse takes for it in a URL that runs to the end of s: after
// "://", the authority runs to the first '/', '?' or '#', and its userinfo
// to its last '@'. In a text, where the URL may end sooner, that last '@'
// may be a later word's: more is masked then, never less. A quoted piece
// of a password masked ("%zz": url.Parse's error quotes an escape that is
// not one) is masked too.
func MaskPasswords(s string) string {
	var b strings.Builder
	var passwords []string
	done := 0 // s[:done] is in b
	for from := 0; ; {
		i := strings.Index(s[from:], "://")
		if i < 0 {
			break
		}
		start := from + i + len("://")
		end := len(s)
		if j := strings.IndexAny(s[start:], "/?#"); j >= 0 {
			end = start + j
		}
		authority := s[start:end]
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			if colon := strings.IndexByte(authority[:at], ':'); colon >= 0 {
				b.WriteString(s[done : start+colon+1])
				b.WriteString("xxxxx")
				passwords = append(passwords, authority[colon+1:at])
				done = start + at
			}
		}
		// The next URL may begin at the ':' that ends this authority, as
		// in a message that quotes one URL after another.
		from = max(start, end-1)
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return maskPieces(b.String(), passwords)
}

// maskPieces returns s with each string quoted in it (as %q quotes it)
// that is part of one of passwords, a ':' before it counted (url.Parse's
// error quotes a port that is not one with it), as "xxxxx". Quotes pair
// from the left, each byte read once.
func maskPieces(s string, passwords []string) string {
	var b strings.Builder
	done := 0 // s[:done] is in b
	for i := strings.IndexByte(s, '"'); i >= 0 && i < len(s); {
		j := i + 1 // the closing quote, after any escaped one
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(s) {
			break
		}
		u, err := strconv.Unquote(s[i : j+1])
		if err == nil && u != "" && slices.ContainsFunc(passwords, func(p string) bool { return strings.Contains(":"+p, u) }) {
			b.WriteString(s[done:i])
			b.WriteString(`"xxxxx"`)
			done = j + 1
		}
		k := strings.IndexByte(s[j+1:], '"')
		if k < 0 {
			break
		}
		i = j + 1 + k
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// MaskURLError masks, in ue, url.Parse's error for s, the password of s's
// userinfo: "xxxxx" in its URL, as url.URL.Redacted writes it, and in its
// Err, which may quote a piece of it (an escape that is not one; a port,
// below). The URL is masked from s, whole: url.Parse's error quotes only
// what precedes a '#'. The userinfo is what url.Parse takes for it: the
// authority after "//" runs to the first '/', '?' or '#', and its userinfo
// to its last '@'. An authority with a ':' and no '@', but an '@' after
// it, is taken for a password holding a '/', '?' or '#' not
// percent-encoded, running to the last '@': url.Parse reads its start as a
// port that is not one. (s is one URL, whole: in a text that may quote
// several, MaskPasswords masks them, without taking a password to run past
// a '/'.)
func MaskURLError(ue *url.Error, s string) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 && strings.Contains(authority, ":") {
		at = strings.LastIndex(rest, "@")
	}
	if at < 0 {
		return
	}
	user, password, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return
	}
	ue.URL = scheme + "://" + user + ":xxxxx" + rest[at:]
	if ue.Err == nil {
		return
	}
	msg := ue.Err.Error()
	if masked := maskPieces(msg, []string{password}); masked != msg {
		ue.Err = errors.New(masked)
	}
}

// decodeKey percent-decodes a query key leniently (a bad escape is kept as
// it is) and trims its spaces, as pgx reads it.
func decodeKey(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		if k[i] == '%' && i+2 < len(k) {
			if v, err := strconv.ParseUint(k[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(k[i])
	}
	return strings.Trim(b.String(), " ")
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
// when it takes it: a key=value connection string, a PostgreSQL URL
// misspelt (one slash, the scheme in capitals), which would otherwise be
// taken for a file name, or one whose host holds an '@' (a password's '@'
// not written %40: pgx would take the rest of the password for the host,
// and print it in its error). The reason does not quote s, which may hold
// a password.
func Refused(s string) string {
	lower := strings.ToLower(s)
	switch {
	case IsKeywordValue(s):
		return "a key=value connection string is not taken: give the PostgreSQL database as a URL, postgres://user:password@host:port/dbname?sslmode=…"
	case !IsURL(s) && (strings.HasPrefix(lower, "postgres:") || strings.HasPrefix(lower, "postgresql:")):
		return "not a PostgreSQL URL: write postgres://user:password@host:port/dbname, with two slashes and the scheme in lower case"
	case IsURL(s) && hostHoldsAt(s):
		return "the PostgreSQL URL has an '@' after its user and password: write an '@' of the password as %40"
	}
	return ""
}

// Quote returns args, command-line arguments, quoted for a message, each as
// %q quotes it and separated by spaces, where one that names a database
// is fit to print: a PostgreSQL URL as Redacted gives it, and one that the
// commands refuse (a key=value connection string, a misspelt URL), where
// Redacted finds no password that may be there, not at all. A URL given
// where another argument goes (its flag forgotten) is printed in the
// usage error that says so.
func Quote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if Refused(a) != "" {
			q[i] = "(a connection string, not shown: it may hold a password)"
		} else {
			q[i] = strconv.Quote(Redacted(a, "a PostgreSQL URL that does not parse"))
		}
	}
	return strings.Join(q, " ")
}

// Scrub returns msg, a message that may quote the command-line arguments
// args, with each that names a database as Quote gives it: an argument
// itself, and the name and the value of one that begins with '-' (a flag,
// -name=value). The flag package's errors quote a value that a flag
// refuses as %q does (`invalid value "…" for flag -x`), and print a flag's
// name, and an argument of bad syntax, as they are: a database's URL given
// to the wrong flag is printed by neither, password and all.
func Scrub(msg string, args ...string) string {
	for _, a := range args {
		parts := []string{a}
		if strings.HasPrefix(a, "-") {
			name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			parts = append(parts, name, value)
		}
		for _, p := range parts {
			if q := Quote(p); q != strconv.Quote(p) {
				msg = strings.ReplaceAll(strings.ReplaceAll(msg, strconv.Quote(p), q), p, q)
			}
		}
	}
	return msg
}

// hostHoldsAt reports whether the URL s has an '@' between the end of its
// userinfo (its first '@', as pgx splits it) and its path or query.
func hostHoldsAt(s string) bool {
	_, rest, _ := strings.Cut(s, "://")
	i := strings.IndexAny(rest, "@/?")
	if i < 0 || rest[i] != '@' {
		return false
	}
	host := rest[i+1:]
	if end := strings.IndexAny(host, "/?"); end >= 0 {
		host = host[:end]
	}
	return strings.Contains(host, "@")
}
