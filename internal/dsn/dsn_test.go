package dsn

import (
	"net/url"
	"strings"
	"testing"
)

// masks is a table of texts and how a masking function prints them.
type masks []struct{ in, want string }

// check checks f, called name, against each case: no result may hold
// "s3cret", the password of every case.
func (cases masks) check(t *testing.T, name string, f func(string) string) {
	t.Helper()
	for _, c := range cases {
		if got := f(c.in); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("%s(%q) = %q; want %q", name, c.in, got, c.want)
		}
	}
}

func TestRedacted(t *testing.T) {
	masks{
		{"postgres://ops:s3cret@db:5432/jar", "postgres://ops:xxxxx@db:5432/jar"},
		{"postgresql://ops@db/jar?password=s3cret&sslmode=disable", "postgresql://ops@db/jar?password=xxxxx&sslmode=disable"},
		{"postgres://db/jar?sslpassword=s3cret", "postgres://db/jar?sslpassword=xxxxx"},
		{"postgres://ops@db/jar?sslmode=disable", "postgres://ops@db/jar?sslmode=disable"},
		{"keys.db", "keys.db"},
		{"postgres://%zz", "the database"},
		// As pgx reads them: a query value runs to the next '&', ';' and
		// '#' included, and a key is percent-decoded and trimmed.
		{"postgres://ops@db/jar?password=s3cret;x&sslmode=disable", "postgres://ops@db/jar?password=xxxxx&sslmode=disable"},
		{"postgres://ops@db/jar?password=s3#cret", "postgres://ops@db/jar?password=xxxxx"},
		{"postgres://ops@db/jar?%20password=s3cret", "postgres://ops@db/jar?%20password=xxxxx"},
		{"postgres://ops@db/jar?pass%77ord=s3cret", "postgres://ops@db/jar?pass%77ord=xxxxx"},
		{"postgres://ops@db/jar?Password=s3cret", "postgres://ops@db/jar?Password=xxxxx"},
		{"postgres://ops@db/jar#?password=s3cret", "postgres://ops@db/jar#?password=xxxxx"},
		// The userinfo ends at the first '@' before a '/', as pgx reads it.
		{"postgres://ops:123?s3cret@db/jar", "postgres://ops:xxxxx@db/jar"},
	}.check(t, "Redacted", func(s string) string { return Redacted(s, "the database") })
}

// TestMaskURL: a stored URL is printed with the password of its userinfo
// masked, and the value of each query parameter whose name says it holds a
// secret (as secrethdr says it of a header's name: a password, a token, an
// API key, a signature…), as a PostgreSQL URL's password= and sslpassword=;
// the rest as it is.
func TestMaskURL(t *testing.T) {
	masks{
		{"https://api.example/v1/charges", "https://api.example/v1/charges"},
		{"https://api.example/users/a@b?order=o1", "https://api.example/users/a@b?order=o1"},
		{"https://ops:s3cret@api.example/v1", "https://ops:xxxxx@api.example/v1"},
		{"https://sk_live_4f1d:@api.example/v1?order=o1", "https://xxxxx:xxxxx@api.example/v1?order=o1"},
		{"https://ghp_T0ken@api.example/v1?token=s3cret", "https://xxxxx@api.example/v1?token=xxxxx"},
		// No user name: none is made up.
		{"https://@api.example/v1", "https://@api.example/v1"},
		{"https://:@api.example/v1", "https://:xxxxx@api.example/v1"},
		{"postgres://app@db/x", "postgres://app@db/x"},
		{"https://api.example/v1?password=s3cret&order=o1", "https://api.example/v1?password=xxxxx&order=o1"},
		{"https://api.example/v1?sslpassword=s3cret", "https://api.example/v1?sslpassword=xxxxx"},
		{"https://api.example/v1?api_key=s3cret&key=s3cret&access_token=s3cret", "https://api.example/v1?api_key=xxxxx&key=xxxxx&access_token=xxxxx"},
		{"https://s3.example/o?X-Amz-Credential=s3cret&X-Amz-Signature=s3cret&X-Amz-Expires=60", "https://s3.example/o?X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&X-Amz-Expires=60"},
		{"https://api.example/v1?Client_Secret=s3cret", "https://api.example/v1?Client_Secret=xxxxx"},
		// A key as a server decodes it.
		{"https://api.example/v1?api%5Fkey=s3cret", "https://api.example/v1?api%5Fkey=xxxxx"},
		{"https://api.example/v1?api+key=s3cret", "https://api.example/v1?api+key=xxxxx"},
		{"https://ops:s3cret@api.example/v1?token=s3cret&order=o1#top", "https://ops:xxxxx@api.example/v1?token=xxxxx&order=o1#top"},
		// An empty value, or a key without one, holds nothing to mask; the
		// fragment is no query.
		{"https://api.example/v1?token=&order=o1&secret", "https://api.example/v1?token=&order=o1&secret"},
		{"https://api.example/v1#token=abc", "https://api.example/v1#token=abc"},
		// A name after a '?' in a value is a name: a URL given as a value.
		{"https://api.example/v1?next=/a?token=s3cret&x=1", "https://api.example/v1?next=/a?token=xxxxx&x=1"},
		// Names that say a secret as no header's does: an Azure SAS's sig,
		// a password's pwd and pass.
		{"https://blob.example/c/b?sv=2024&SIG=s3cret&pwd=s3cret&pass=s3cret", "https://blob.example/c/b?sv=2024&SIG=xxxxx&pwd=xxxxx&pass=xxxxx"},
		// One-time codes and PINs, and an OAuth authorization code; a name
		// that merely ends in code is not one.
		{"https://api.example/cb?code=s3cret&OTP=123456&pin=1234&passcode=s3cret&totp=654321&country_code=FR", "https://api.example/cb?code=xxxxx&OTP=xxxxx&pin=xxxxx&passcode=xxxxx&totp=xxxxx&country_code=FR"},
		// A session's id, a password's pw, a bearer token, credentials and
		// a ticket (CAS's), each as a name of its own.
		{"https://api.example/v1?SID=s3cret&pw=s3cret&bearer=s3cret&creds=s3cret&ticket=ST-s3cret&side=left", "https://api.example/v1?SID=xxxxx&pw=xxxxx&bearer=xxxxx&creds=xxxxx&ticket=xxxxx&side=left"},
		// The idempotency key, in any spelling, is no secret: a jar holds
		// it and idemctl prints it. Names that merely hold a secret's word
		// (author, monkey) are masked: see secretParam.
		{"https://api.example/v1?idempotency_key=k1&Idempotency-Key=k2&idempotencyKey=k3", "https://api.example/v1?idempotency_key=k1&Idempotency-Key=k2&idempotencyKey=k3"},
		{"https://api.example/v1?author=ann&monkey=bob", "https://api.example/v1?author=xxxxx&monkey=xxxxx"},
	}.check(t, "MaskURL", MaskURL)
}

func TestMaskPasswords(t *testing.T) {
	masks{
		{"https://ops:s3cret@api.example/v1", "https://ops:xxxxx@api.example/v1"},
		// A user name without a password, or with an empty one, is a
		// token in an HTTP URL (Stripe's "sk_live_…:"), and so where
		// net/http's error wrote "***" for the password, as it does for an
		// empty one; a PostgreSQL URL's is a role's.
		{"https://ops:@api.example", "https://xxxxx:xxxxx@api.example"},
		{"https://ops@api.example/a:b@c", "https://xxxxx@api.example/a:b@c"},
		{`Post "https://sk_live_4f1d:***@api.example/v1": EOF`, `Post "https://xxxxx:xxxxx@api.example/v1": EOF`},
		{"a WSS://ghp_T0ken@host/x b", "a WSS://xxxxx@host/x b"},
		{"postgres://app@db/x postgres://app:@db/x", "postgres://app@db/x postgres://app:xxxxx@db/x"},
		{"ftp://anonymous@files/x git+ssh://git@host/r", "ftp://anonymous@files/x git+ssh://git@host/r"},
		{"https://api.example/v1?to=a:b@c", "https://api.example/v1?to=a:b@c"},
		{"no url: a:b@c", "no url: a:b@c"},
		// The userinfo runs to the authority's last '@', as url.Parse
		// takes it.
		{"http://ops:s3@cret@proxy", "http://ops:xxxxx@proxy"},
		// Every URL of a text, one quoted right after another, and a
		// quoted piece of a password: url.Parse's error quotes a bad
		// escape.
		{`invalid proxy address "http://ops:s3cret%zz@proxy:3128": parse "http://ops:s3cret%zz@proxy:3128": invalid URL escape "%zz"`,
			`invalid proxy address "http://ops:xxxxx@proxy:3128": parse "http://ops:xxxxx@proxy:3128": invalid URL escape "xxxxx"`},
		{`parse "http://ops:s3cret@proxy:3128": invalid URL escape "%zz"`, `parse "http://ops:xxxxx@proxy:3128": invalid URL escape "%zz"`},
		{`Post "https://ops:s3cret@api.example/v1": EOF`, `Post "https://ops:xxxxx@api.example/v1": EOF`},
		{"a http://x/ b https://u:s3cret@y/ c", "a http://x/ b https://u:xxxxx@y/ c"},
		// A password holding a '/', '?', '#' or "://" not percent-encoded:
		// url.Parse reads its start as a port that is not one, and quotes
		// it; net/http's client quotes the URL whole where url.Parse finds
		// no password in it.
		{`parse "http://ops:s3cret/x@proxy:3128": invalid port ":s3cret" after host`, `parse "http://ops:xxxxx@proxy:3128": invalid port "xxxxx" after host`},
		{`invalid proxy address "http://ops:s3cret?x@proxy:3128": parse "http://ops:s3cret?x@proxy:3128": invalid port ":s3cret" after host`,
			`invalid proxy address "http://ops:xxxxx@proxy:3128": parse "http://ops:xxxxx@proxy:3128": invalid port "xxxxx" after host`},
		{`parse "http://ops:s3cret": invalid port ":s3cret" after host`, `parse "http://ops:xxxxx": invalid port "xxxxx" after host`}, // a '#' cut it
		// A password cut at a '#' that holds a '/' or a '?' before it:
		// url.Parse's error quotes the URL to the '#', the rest of the
		// password as a path or a query. The quote's end is the URL's.
		{`parse "http://ops:s3cret/x": invalid port ":s3cret" after host`, `parse "http://ops:xxxxx": invalid port "xxxxx" after host`},
		{`parse "http://ops:s3cret?x=1": invalid port ":s3cret" after host`, `parse "http://ops:xxxxx": invalid port "xxxxx" after host`},
		{"dial http://ops:s3cret/x failed", "dial http://ops:xxxxx failed"},
		// Whatever of '/', '?' and '#' it holds, a password runs to the
		// last '@' of the URL's word.
		{`Post "https://ops:s3/cr?et#x@api.example/v1": EOF`, `Post "https://ops:xxxxx@api.example/v1": EOF`},
		{"dial https://ops:s3#cret@host failed", "dial https://ops:xxxxx@host failed"},
		{"dial https://ops:s3?c#r/et@host failed", "dial https://ops:xxxxx@host failed"},
		// A password of digits cut at a '#' reads as a port; url.Parse
		// refuses none, so that where its error quotes a URL with a port
		// and without an '@', the port is masked. A port elsewhere is a
		// port.
		{`parse "http://ops:1234": invalid port ":1234" after host`, `parse "http://ops:xxxxx": invalid port "xxxxx" after host`},
		{`parse "http://o%zzps:1234": invalid URL escape "%zz"`, `parse "http://o%zzps:xxxxx": invalid URL escape "%zz"`},
		{`parse "http://o%zzps:12/34": invalid URL escape "%zz"`, `parse "http://o%zzps:xxxxx": invalid URL escape "%zz"`},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{`Post "http://127.0.0.1:8080/v1": dial tcp 127.0.0.1:8080: connect: connection refused`,
			`Post "http://127.0.0.1:8080/v1": dial tcp 127.0.0.1:8080: connect: connection refused`},
		{`parse "http://[::1]:8080/%zz": invalid URL escape "%zz"`, `parse "http://[::1]:8080/%zz": invalid URL escape "%zz"`},
		// A port followed by punctuation, in a sentence, is a port.
		{"it goes to http://127.0.0.1:39809, not to https://api.example.com", "it goes to http://127.0.0.1:39809, not to https://api.example.com"},
		{"(at http://api.example:8443).", "(at http://api.example:8443)."},
		{`Post "http://ops:s3cret://x@proxy:3128/v1": dial tcp: no such host`, `Post "http://ops:xxxxx@proxy:3128/v1": dial tcp: no such host`},
		{"dial http://ops:s3/cret@proxy:3128 failed", "dial http://ops:xxxxx@proxy:3128 failed"},
		// Without a scheme, as url.Parse reads a URL that begins with //.
		{`Post "//ops:s3cret@api.example/v1": unsupported protocol scheme ""`, `Post "//ops:xxxxx@api.example/v1": unsupported protocol scheme ""`},
		// A PostgreSQL URL's password parameters, and a libpq key=value
		// string's, as pgx quotes one in its error.
		{"cannot parse `postgres://ops@db/jar?password=s3cret&sslmode=disable`: invalid port",
			"cannot parse `postgres://ops@db/jar?password=xxxxx&sslmode=disable`: invalid port"},
		{`dial "postgresql://db/jar?sslmode=disable&sslpassword=s3cret": refused`, `dial "postgresql://db/jar?sslmode=disable&sslpassword=xxxxx": refused`},
		{"postgres://db/jar?Password=s3cret x", "postgres://db/jar?Password=xxxxx x"},
		{"cannot parse `host=db password=s3cret dbname=jar`: invalid port", "cannot parse `host=db password=xxxxx dbname=jar`: invalid port"},
		{"cannot parse `host=db password='s3 cret' dbname=jar`: x", "cannot parse `host=db password=xxxxx dbname=jar`: x"},
		{`host=db password = 's3\' cret' port=x`, "host=db password = xxxxx port=x"},
		{`host=db password=s3\ cret`, "host=db password=xxxxx"},
		{"cannot parse `password=s3cret`: x", "cannot parse `password=xxxxx`: x"},
		// As pgx reads a keyword: spaces of any kind around its '=', a
		// keyword right after the closing quote of a value.
		{"cannot parse `host=db\tpassword\n=\ts3cret dbname=jar`: x", "cannot parse `host=db\tpassword\n=\txxxxx dbname=jar`: x"},
		{"host=db sslpassword= 's3cret' user=ops", "host=db sslpassword= xxxxx user=ops"},
		{"host=db password='a'password=s3cret", "host=db password=xxxxxpassword=xxxxx"},
		{"host=db PASSWORD=s3cret", "host=db PASSWORD=xxxxx"},
		// Passwords that overlap: one mask.
		{"`host=db password=a//ops:s3 cret@x`", "`host=db password=xxxxx@x`"},
		// A URL's query parameters that hold a secret, as MaskURL masks
		// them, where net/http's error quotes the URL whole: a value runs
		// to the next '&' or to the URL's end, and a '?' or an '&' begins
		// a name, as in a URL given as a value.
		{`Post "https://api.example/v1/charges?api_key=s3cret&order=o1": dial tcp: connection refused`,
			`Post "https://api.example/v1/charges?api_key=xxxxx&order=o1": dial tcp: connection refused`},
		{"GET https://s3.example/o?X-Amz-Credential=s3cret&X-Amz-Expires=60&X-Amz-Signature=s3cret failed",
			"GET https://s3.example/o?X-Amz-Credential=xxxxx&X-Amz-Expires=60&X-Amz-Signature=xxxxx failed"},
		{`Get "https://api.example/v1?access_token=s3cret#top": EOF`, `Get "https://api.example/v1?access_token=xxxxx": EOF`},
		{`Get "https://api.example/v1?next=/a?token=s3cret&x=1": EOF`, `Get "https://api.example/v1?next=/a?token=xxxxx&x=1": EOF`},
		{`Get "https://api.example/v1?next=https://b.example/?key=s3cret": EOF`, `Get "https://api.example/v1?next=https://b.example/?key=xxxxx": EOF`},
		{`Get "/v1?Client%5FSecret=s3cret": EOF`, `Get "/v1?Client%5FSecret=xxxxx": EOF`},
		// A name percent-encoded, a bad escape in it kept as it is (as
		// Redacted reads a PostgreSQL URL's).
		{`Get "https://api.example/v1?pass%77ord=s3cret&api%5Fkey=s3cret": EOF`, `Get "https://api.example/v1?pass%77ord=xxxxx&api%5Fkey=xxxxx": EOF`},
		{"https://api.example/v1?pass%77ord%zz=s3cret&api%5Fkey%zz=s3cret", "https://api.example/v1?pass%77ord%zz=xxxxx&api%5Fkey%zz=xxxxx"},
		{"postgres://ops@db/jar?%70assword=s3cret&sslpass%77ord=s3cret", "postgres://ops@db/jar?%70assword=xxxxx&sslpass%77ord=xxxxx"},
		{"Get https://ops:s3cret@api.example/v1?token=s3cret", "Get https://ops:xxxxx@api.example/v1?token=xxxxx"},
		{"https://blob.example/c/b?sv=2024&sig=s3cret", "https://blob.example/c/b?sv=2024&sig=xxxxx"},
		// Not secrets: a query's other parameters, an empty value, the
		// idempotency key, a '?' of a sentence.
		{`Post "https://api.example/v1?order=o1&token=&idempotency_key=k1": EOF`, `Post "https://api.example/v1?order=o1&token=&idempotency_key=k1": EOF`},
		{"why? token=a:b", "why? token=a:b"},
		// Not passwords: a port, a path's '@' after a quoted URL's end, a
		// password named, not given.
		{`Post "https://api.example:8443/v1": EOF; ask ops@example.com`, `Post "https://api.example:8443/v1": EOF; ask ops@example.com`},
		{"http://[::1]:80/x", "http://[::1]:80/x"},
		{"// note: the password is wrong", "// note: the password is wrong"},
	}.check(t, "MaskPasswords", MaskPasswords)
}

func TestRefused(t *testing.T) {
	for _, s := range []string{
		"host=db dbname=jar password=s3cret", "postgres:/ops:s3cret@db/jar", "postgresql:ops@db/jar", "Postgres://db/jar", "POSTGRESQL://db/jar",
		// An '@' of the password not written %40: pgx takes what follows
		// it for the host, and prints it in its error.
		"postgres://ops:s3cret@s3cret@db/jar", "postgres://ops:s3cret@s3cret@db", "postgresql://ops:s3cret@s3cret@db:5432?sslmode=disable",
	} {
		if why := Refused(s); why == "" || strings.Contains(why, "s3cret") {
			t.Errorf("Refused(%q) = %q; want a reason, without the password", s, why)
		}
	}
	for _, s := range []string{"keys.db", "/var/lib/idem/keys.db", "postgres://ops@db/jar", "postgresql://db/jar", "postgres.db", "./postgres:x",
		"postgres://ops:s3cret%40s3cret@db/jar", "postgres://ops@db/jar?application_name=ops@host", "postgres://db/j@r"} {
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

func TestQuote(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"extra"}, `"extra"`},
		{[]string{"a", "b c"}, `"a" "b c"`},
		{[]string{"postgres://ops:s3cret@db/jar"}, `"postgres://ops:xxxxx@db/jar"`},
		{[]string{"x", "postgresql://db/jar?password=s3cret"}, `"x" "postgresql://db/jar?password=xxxxx"`},
		{[]string{"host=db password=s3cret"}, "(a connection string, not shown: it may hold a password)"},
		{[]string{"POSTGRES://ops:s3cret@db/jar"}, "(a connection string, not shown: it may hold a password)"},
		{[]string{"postgres://%zz:s3cret@db"}, `"a PostgreSQL URL that does not parse"`},
	} {
		if got := Quote(c.in...); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("Quote(%q) = %s; want %s", c.in, got, c.want)
		}
	}
}

func TestScrub(t *testing.T) {
	const hidden = "(a connection string, not shown: it may hold a password)"
	for _, c := range []struct {
		msg  string
		args []string
		want string
	}{
		{`invalid value "postgres://ops:s3cret@db/jar" for flag -wait: invalid duration`, []string{"-wait", "postgres://ops:s3cret@db/jar"},
			`invalid value "postgres://ops:xxxxx@db/jar" for flag -wait: invalid duration`},
		{`invalid value "postgres://db/jar?password=s3cret" for flag -wait: invalid duration`, []string{"-wait=postgres://db/jar?password=s3cret"},
			`invalid value "postgres://db/jar?password=xxxxx" for flag -wait: invalid duration`},
		{`invalid boolean value "host=db password=s3cret" for -v: parse error`, []string{"x", "-v=host=db password=s3cret"},
			`invalid boolean value ` + hidden + ` for -v: parse error`},
		{`bad flag syntax: ---jar=postgres://ops:s3cret@db/jar`, []string{"---jar=postgres://ops:s3cret@db/jar"},
			`bad flag syntax: ---jar="postgres://ops:xxxxx@db/jar"`},
		{`flag provided but not defined: -postgres://ops:s3cret@db/jar`, []string{"-postgres://ops:s3cret@db/jar"},
			`flag provided but not defined: -"postgres://ops:xxxxx@db/jar"`},
		{`invalid value "5" for flag -wait: missing unit in duration`, []string{"-wait", "5", "-db", "postgres://ops:s3cret@db/jar"},
			`invalid value "5" for flag -wait: missing unit in duration`},
	} {
		if got := Scrub(c.msg, c.args...); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("Scrub(%q, %q) = %s; want %s", c.msg, c.args, got, c.want)
		}
	}
}

// TestMaskPiecesQuotes: quotes pair from the left, an escaped one inside
// a quoted string included, and one left open ends the scan.
func TestMaskPiecesQuotes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`a "%zz" b "x" c "%zz`, `a "xxxxx" b "x" c "%zz`},
		{`"say \"%zz\"" "%zz"`, `"say \"%zz\"" "xxxxx"`},
		{`"\q" "%zz"`, `"\q" "xxxxx"`},
		{`no quote`, `no quote`},
		{strings.Repeat(`\"`, 1000) + `"%zz"`, strings.Repeat(`\"`, 1000) + `"%zz"`},
	} {
		if got := maskPieces(c.in, []string{"s3cret%zz"}); got != c.want {
			t.Errorf("maskPieces(%q) = %q; want %q", c.in, got, c.want)
		}
	}
}

// TestMaskPasswordsParseErrors: url.Parse's own errors for URLs whose
// password holds a '/', a '?' or a '#' not percent-encoded, or is made of
// digits, print no piece of the password once masked. The error quotes
// the URL to its '#' only, and a piece of it (a port that is not one).
func TestMaskPasswordsParseErrors(t *testing.T) {
	for _, c := range []struct{ url, password string }{
		{"http://ops:QZ/ZQ#QQ@proxy:3128", "QZ/ZQ#QQ"},
		{"http://ops:QZ?ZQ#QQ@proxy:3128", "QZ?ZQ#QQ"},
		{"http://ops:QZ?Z=Q#QQ@proxy:3128/v1", "QZ?Z=Q#QQ"},
		{"http://ops:QZ/Z?Q#Q/Q?Q@proxy", "QZ/Z?Q#Q/Q?Q"},
		{"http://o%zzps:9797#97@proxy", "9797#97"},   // the user's bad escape: digits before the '#'
		{"http://o%zzps:97/97#97@proxy", "97/97#97"}, // and a '/'
		{"http://ops\x7f:9797#97@proxy", "9797#97"},  // a control byte
		{"http://ops:QZ%zz#ZQ@proxy", "QZ%zz#ZQ"},
	} {
		_, err := url.Parse(c.url)
		if err == nil {
			t.Fatalf("url.Parse(%q) takes it; want an error", c.url)
		}
		got := MaskPasswords(err.Error())
		for _, piece := range strings.FieldsFunc(c.password, func(r rune) bool { return strings.ContainsRune("/?#=%", r) }) {
			if strings.Contains(got, piece) {
				t.Errorf("MaskPasswords(%q) = %q: it holds %q, of the password %q", err, got, piece, c.password)
			}
		}
	}
}
