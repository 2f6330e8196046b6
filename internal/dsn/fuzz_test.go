package dsn

import (
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzRedacted: whatever pgx reads from a URL, it reads from the redacted
// URL too, but for the passwords, which it reads as the mask: no byte of a
// password pgx would send is printed, and nothing else is cut or moved.
func FuzzRedacted(f *testing.F) {
	for _, s := range []string{
		"postgres://ops:s3cret@db:5432/jar",
		"postgresql://ops@db/jar?password=s3cret&sslmode=disable",
		"postgres://db/jar?sslpassword=s3cret&application_name=a",
		"postgres://ops@db/jar?password=s3cret;x&sslmode=disable",
		"postgres://ops@db/jar?password=s3#cret",
		"postgres://ops@db/jar?%20password=s3cret",
		"postgres://ops@db/jar?pass%77ord=s3cret",
		"postgres://ops@db/jar?Password=s3cret",
		"postgres://ops:123?s3cret@db/jar",
		"postgres://ops:p%40ss@[::1]:5432,db2:5433/jar?x_password=s3cret",
		"postgres://ops:s3cret@/jar?host=/tmp",
	} {
		f.Add(s)
	}
	// pgx reads a password from the environment and a password file too:
	// only the URL's must count.
	f.Setenv("PGPASSWORD", "")
	f.Setenv("PGSSLPASSWORD", "")
	f.Setenv("PGPASSFILE", filepath.Join(f.TempDir(), "none"))
	f.Setenv("PGSERVICEFILE", filepath.Join(f.TempDir(), "none"))
	f.Setenv("PGSERVICE", "")
	const what = "the database"
	f.Fuzz(func(t *testing.T, s string) {
		r := Redacted(s, what)
		if !IsURL(s) {
			return
		}
		in, err := pgconn.ParseConfig(s)
		if err != nil || r == what {
			return
		}
		out, err := pgconn.ParseConfig(r)
		if err != nil {
			t.Fatalf("Redacted(%q) = %q, which pgx refuses (%v); it reads the URL", s, r, err)
		}
		// An empty password may be masked too: it tells nothing.
		if out.Password != "xxxxx" && (in.Password != "" || out.Password != "") {
			t.Fatalf("Redacted(%q) = %q: pgx reads the password %q from it; want xxxxx", s, r, out.Password)
		}
		if in.Host != out.Host || in.Port != out.Port || in.Database != out.Database || in.User != out.User ||
			len(in.Fallbacks) != len(out.Fallbacks) || len(in.RuntimeParams) != len(out.RuntimeParams) {
			t.Fatalf("Redacted(%q) = %q: pgx reads %+v; from the URL %+v", s, r, out, in)
		}
		for k, v := range in.RuntimeParams {
			w, ok := out.RuntimeParams[k]
			switch {
			case !ok:
				t.Fatalf("Redacted(%q) = %q: pgx no longer reads the parameter %q", s, r, k)
			case strings.Contains(strings.ToLower(k), "password"):
				if w != "xxxxx" && (v != "" || w != "") {
					t.Fatalf("Redacted(%q) = %q: pgx reads %s=%q from it; want xxxxx", s, r, k, w)
				}
			case v != w:
				t.Fatalf("Redacted(%q) = %q: pgx reads %s=%q from it; from the URL %q", s, r, k, w, v)
			}
		}
	})
}

// FuzzMaskPasswords: of a URL with a scheme and a password, url.Parse reads
// the masked URL as the URL, its password as the mask, and its user name
// as the mask too where that is the secret (secretUser). And whatever text
// quotes a password, in a URL (quoted as %q quotes it, or not, with a
// scheme or without), a PostgreSQL URL's query (as pgx quotes it, in
// backquotes) or a libpq key=value string, the masked text does not hold
// it; nor the value of a URL query's parameter named as a secret
// (api_key, access_token, X-Amz-Signature…), in a URL quoted as
// net/http's error quotes it, or not. The text around it holds no quote
// that would pair with one of the URL's or the string's; a password that
// a quote, a space or an '&' would end where it is quoted is not given
// where it would, nor one that url.Parse would end at an '@' of it (one
// before a '/', '?' or '#').
func FuzzMaskPasswords(f *testing.F) {
	for _, s := range []string{
		"https://ops:s3cret@api.example/v1",
		"http://ops:s3@cret@proxy:3128",
		"https://ops:s3cret@api.example/v1?to=http://a:b@c#x",
		"https://ops@api.example/a:b@c",
		"http://[::1]:80/x",
		"https://password=a:b@c/",
	} {
		f.Add(s, "s3/cret", uint8(0))
	}
	for form, pw := range []string{"s3/cret", "12/c d?e#f", "s3&cret", "s3 cret'\\", "a://b@c", "s3#cret", "s3?c=r#et", "s3/c?et"} {
		f.Add("dial: ", pw, uint8(form))
	}
	f.Add("", "s3cret", uint8(6+8))
	f.Add("x ", "s3?cret=", uint8(7+2*8))
	f.Fuzz(func(t *testing.T, s, pw string, form uint8) {
		maskedURL(t, s)
		before, after := s[:len(s)/2], s[len(s)/2:]
		if strings.ContainsAny(before+after, "\"`") {
			return
		}
		if at := strings.IndexByte(pw, '@'); at >= 0 && strings.ContainsAny(pw[at:], "/?#") && form%8 < 3 {
			// url.Parse ends the userinfo at the '@' before them: the
			// rest is the host, a path, a query or a fragment.
			return
		}
		var text string
		switch form % 8 {
		case 0:
			if strings.ContainsAny(pw, " \t\n\r\f\v\"`") {
				return
			}
			text = before + "http://ops:" + pw + "@proxy:3128" + after
		case 1:
			if strconv.Quote(pw) != `"`+pw+`"` {
				return // escaped, it is not in the text as it is
			}
			text = before + strconv.Quote("https://ops:"+pw+"@api.example/v1") + after
		case 2:
			if strings.ContainsAny(pw, " \t\n\r\f\v\"`") {
				return
			}
			text = before + "//ops:" + pw + "@api.example/v1" + after
		case 3:
			if strings.ContainsAny(pw, "&`") {
				return
			}
			text = before + "`postgres://ops@db/jar?sslmode=disable&password=" + pw + "&x=y`" + after
		case 4:
			if strings.ContainsAny(pw, "`") {
				return
			}
			q := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
			text = before + " `host=db password='" + q + "' dbname=jar`" + after
		case 5:
			if strings.ContainsAny(pw, " \t\n\r\f\v\"`'") {
				return
			}
			text = before + " host=db password=" + pw + " dbname=jar" + after
		case 6, 7:
			if strings.ContainsAny(pw, "&`") {
				return
			}
			names := []string{"api_key", "access_token", "X-Amz-Signature", "key", "Client%5FSecret"}
			u := "https://api.example/v1?order=o1&" + names[int(form/8)%len(names)] + "=" + pw + "&x=y"
			if form%8 == 6 {
				if strconv.Quote(u) != `"`+u+`"` {
					return
				}
				text = before + "Post " + strconv.Quote(u) + ": EOF" + after
			} else {
				if strings.ContainsAny(pw, " \t\n\r\f\v\"") {
					return
				}
				text = before + u + after
			}
		}
		// The password is found once in the text, and cannot be made of
		// the mask and what is around it.
		if len(pw) < 4 || strings.Count(text, pw) != 1 || strings.Contains(pw, "x") {
			return
		}
		if m := MaskPasswords(text); strings.Contains(m, pw) {
			t.Fatalf("MaskPasswords(%q) = %q: it holds the password %q", text, m, pw)
		}
	})
}

// maskedURL checks that, of s, a URL with a scheme and a password,
// url.Parse reads the masked URL as the URL, its password as the mask.
func maskedURL(t *testing.T, s string) {
	t.Helper()
	in, err := url.Parse(s)
	if err != nil || in.Scheme == "" || in.User == nil || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return // a control byte: url.Parse takes one in a fragment alone, which the mask of a '#' may end
	}
	if id := in.User.Username() + in.Host; strings.Contains(strings.ToLower(id), "password") || strings.Contains(id, `"`) {
		return // masked as a password parameter, or a libpq one, or a quoted piece of a password, too
	}
	m := MaskPasswords(s)
	out, err := url.Parse(m)
	if err != nil {
		t.Fatalf("MaskPasswords(%q) = %q, which url.Parse refuses (%v); it reads the URL", s, m, err)
	}
	_, had := in.User.Password()
	if pw, has := out.User.Password(); has != had || (had && pw != "xxxxx") {
		t.Fatalf("MaskPasswords(%q) = %q: url.Parse reads the password %q; want xxxxx", s, m, pw)
	}
	user := in.User.Username()
	if password, _ := in.User.Password(); user != "" && secretUser(in.Scheme, password) {
		user = "xxxxx"
	}
	if out.Scheme != in.Scheme || out.User.Username() != user || out.Host != in.Host {
		t.Fatalf("MaskPasswords(%q) = %q: url.Parse reads %s://%s@%s; from the URL %s://%s@%s", s, m,
			out.Scheme, out.User.Username(), out.Host, in.Scheme, user, in.Host)
	}
}
