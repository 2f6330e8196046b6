// Package dsn tells the commands' PostgreSQL URLs from file names, and prints
// them without their secrets, as it prints any text that may quote a URL
// or a connection string (an error's message) without their passwords.
package dsn

import (
	"bytes"
	"errors"
	"index/suffixarray"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/internal/secrethdr"
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

// MaskURL returns s, one URL (a stored request's), fit to print: when it
// parses, with its userinfo's password masked as url.URL.Redacted writes
// it ("user:xxxxx@"), its user name too where that is the secret
// (secretUser: "xxxxx@", "xxxxx:xxxxx@"), and the value of each query parameter whose name
// says that it holds a secret (secretParam: "password", "sslpassword",
// "api_key", "access_token", "X-Amz-Signature"…) as "xxxxx" (an empty
// one stays empty); the rest as it is. Else it returns s as MaskPasswords
// gives it. MaskPasswords, made for free text where a URL's end is a
// guess, would take the port of a URL with an '@' in its path for a
// password.
func MaskURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return MaskPasswords(s)
	}
	// The query as url.Parse splits it: after the first '?' before the
	// first '#'.
	beforeFragment, fragment, hasFragment := strings.Cut(s, "#")
	head, query, hasQuery := strings.Cut(beforeFragment, "?")
	if hasQuery {
		query = maskQuery(query)
	}
	if password, ok := u.User.Password(); u.User.Username() != "" && secretUser(u.Scheme, password) {
		if ok {
			u.User = url.UserPassword("xxxxx", "xxxxx")
		} else {
			u.User = url.User("xxxxx")
		}
		u.RawQuery = query
		return u.String()
	}
	if _, ok := u.User.Password(); ok {
		u.RawQuery = query
		return u.Redacted()
	}
	if !hasQuery {
		return s
	}
	s = head + "?" + query
	if hasFragment {
		s += "#" + fragment
	}
	return s
}

// maskQuery returns the raw query q with the value of each parameter whose
// name is a secret's (secretParam) as "xxxxx".
func maskQuery(q string) string {
	masks := queryMasks(nil, q, 0, len(q))
	if len(masks) == 0 {
		return q
	}
	var b strings.Builder
	done := 0 // q[:done] is in b
	for _, m := range masks {
		b.WriteString(q[done:m[0]])
		b.WriteString("xxxxx")
		done = m[1]
	}
	b.WriteString(q[done:])
	return b.String()
}

// queryMasks appends to masks the byte ranges of s[from:to], a URL's raw
// query, that are the values of parameters whose names are a secret's
// (secretParam), in order: a name begins after an '&' or a '?' (a URL's
// given as a value: ?next=/a?token=…), a value runs to the next '&', and
// an empty value holds nothing to mask.
func queryMasks(masks [][2]int, s string, from, to int) [][2]int {
	for p := from; p < to; {
		end := to // of the name and the value, if the value is no secret
		if i := strings.IndexAny(s[p:to], "&?"); i >= 0 {
			end = p + i
		}
		eq := strings.IndexByte(s[p:end], '=')
		if eq < 0 || !secretParam(s[p:p+eq]) {
			p = end + 1
			continue
		}
		v := p + eq + 1
		end = to
		if i := strings.IndexByte(s[v:to], '&'); i >= 0 {
			end = v + i
		}
		if end > v {
			masks = append(masks, [2]int{v, end})
		}
		p = end + 1
	}
	return masks
}

// secretParam reports whether a URL query parameter named key (raw, as the
// URL holds it) holds a secret: its name, decoded as url.ParseQuery decodes
// it (where an escape is bad, the others still decoded) and trimmed, is a secret's as secrethdr.Is says it of a header's name
// ("password", "api_key", "access_token", "X-Amz-Signature"…), or one
// that says it in a query alone ("sig", an Azure SAS's signature; "pwd",
// "pw"; "pass"; "passcode", "pin", "otp", "totp"; "code", an OAuth
// authorization code, as a name of its own, not country_code; "sid", a
// session's id; "bearer", "creds", "ticket"); but not
// the idempotency key's, however it is spelt
// (idempotency_key, idempotencyKey): a jar keeps it, and idemctl and a
// *PendingError print it.
//
// The rule errs on the side of masking: a name that merely holds one of
// Is's words (author its "auth", monkey its "key") has its value masked
// too. Such a mask hides a value from printed text, nothing more; and a
// query's names run their words together (appkey, authkey, sessionid)
// where a header's split them with '-', so that no narrower rule tells
// them from a secret's without missing some.
func secretParam(key string) bool {
	name, err := url.QueryUnescape(key)
	if err != nil {
		// A bad escape: the others decoded all the same, as a lenient
		// server (and Redacted, of a PostgreSQL URL) reads them.
		name = decodeKey(strings.ReplaceAll(key, "+", " "))
	}
	name = strings.TrimSpace(name)
	switch strings.ToLower(paramSeparators.Replace(name)) {
	case "idempotencykey":
		return false
	case "sig", "pwd", "pw", "pass", "passcode", "pin", "otp", "totp", "code", "sid", "bearer", "creds", "ticket":
		return true
	}
	return secrethdr.Is(name)
}

// paramSeparators drops the separators of a name's words, for secretParam.
var paramSeparators = strings.NewReplacer("-", "", "_", "")

// MaskPasswords returns s, a text that may quote URLs and connection
// strings (an error's message), with each password in it replaced by
// "xxxxx": a URL's, as url.URL.Redacted writes it
// ("scheme://user:xxxxx@host", "//user:xxxxx@host" without a scheme), with
// its user name where that is the secret (secretUser: "https://xxxxx@host",
// "https://xxxxx:xxxxx@host"), the
// value of a query parameter whose key holds "password" (?password=xxxxx,
// &sslpassword=xxxxx), and a libpq key=value string's (password=xxxxx,
// for a value in single quotes too); and the secrets of a URL's query as
// MaskURL masks them (?api_key=xxxxx, &X-Amz-Signature=xxxxx), as
// net/http's errors quote a request's URL whole. Such a query runs from a
// '?' to where the URL ends, its '#' in it.
//
// A URL's userinfo is what url.Parse takes for it in a URL that runs to
// the end of s: after "//", the authority runs to the first '/', '?' or
// '#', and its userinfo to its last '@'. An authority with a ':' and no
// '@', but an '@' after it in the URL, is taken for a password holding a
// '/', '?', '#' or "://" not percent-encoded, running to the URL's last
// '@' (as MaskURLError takes it); with no '@' after it, a port that is
// not a number is taken for a password that a '#' cut (url.Parse's error
// quotes the URL to its '#'), masked to where the URL ends: what follows
// it ("/…", "?…") is the rest of the password. A port of digits is taken
// for a port, but in the URL that url.Parse's error quotes (`parse "…":
// …`): url.Parse refuses no URL for a port of digits, so that the URL
// has another fault or is one whose password of digits a '#' cut, which
// the text cannot tell apart; there the port is masked, and what follows
// it. Elsewhere ("http://127.0.0.1:8080", dial tcp's address) a port of
// digits is printed: a password of digits cut at a '#' by other text
// than url.Parse's error is printed too. A URL runs to the quote
// that closes it where it is quoted (as %q quotes it, escapes skipped, or
// in backquotes, as pgx quotes a connection string), else to the first
// space. A value runs as pgx reads it: a query's to the next '&', a libpq
// one to the first space not escaped by a backslash, or in single quotes
// to the closing one; and no further than the quote that closes the text
// it is quoted in. In a text, where a URL may end sooner, that last '@'
// may be a later word's, and the port of a URL with an '@' in its path is
// taken for a password: more is masked then, never less. A quoted piece
// of a password masked ("%zz": url.Parse's error quotes an escape that is
// not one) is masked too. The time it takes grows as n log n with the
// length of s, however many quoted strings and passwords s holds.
func MaskPasswords(s string) string {
	t := &text{s: s, spans: quotedSpans(s)}
	var masks [][2]int // the byte ranges of s to print as xxxxx
	for from := 0; ; {
		i := strings.Index(s[from:], "//")
		if i < 0 {
			break
		}
		start := from + i + len("//")
		end := len(s)
		if j := strings.IndexAny(s[start:], "/?#"); j >= 0 {
			end = start + j
		}
		authority := s[start:end]
		from = end - 1 // "///": the next "//" may begin at the second '/'
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			user := at // the user name's end
			if colon := strings.IndexByte(authority[:at], ':'); colon >= 0 {
				masks = append(masks, [2]int{start + colon + 1, start + at})
				user = colon
			}
			if user > 0 && secretUser(schemeBefore(s, start-len("//")), authority[min(user+1, at):at]) {
				masks = append(masks, [2]int{start, start + user})
			}
			continue
		}
		colon := strings.IndexByte(authority, ':')
		w := t.wordEnd(start)
		if colon < 0 || start+colon >= w {
			continue
		}
		if at := t.lastAt(w); at >= end {
			masks = append(masks, [2]int{start + colon + 1, at})
			continue
		}
		// No '@': a port that is not one may be the start of a password
		// cut at a '#', as url.Parse's error quotes the URL, what follows
		// it (a '/', a '?') the rest of the password. A port that
		// punctuation of a sentence follows ("…:8443, not…") is one. A
		// port of digits is one too, but in url.Parse's error, which no
		// port of digits causes: there the URL is refused for another
		// fault, or a password of digits was cut at a '#', and the text
		// cannot tell which.
		if authority[0] == '[' {
			continue // an IPv6 address's colons
		}
		port := strings.TrimRight(s[start+colon+1:min(end, w)], ".,;:!)]}>")
		if strings.Trim(port, "0123456789") != "" || t.parseErrorURL(start) {
			masks = append(masks, [2]int{start + colon + 1, w})
		}
	}
	// The secrets of each URL's query, as MaskURL masks them: a query
	// runs from a '?' to where a URL ends (its '#' in it, masked with a
	// value it may end: more, never less).
	for from := 0; ; {
		i := strings.IndexByte(s[from:], '?')
		if i < 0 {
			break
		}
		q := from + i + 1
		end := t.wordEnd(q)
		masks = queryMasks(masks, s, q, end)
		from = max(q, end)
	}
	lower := []byte(s) // in ASCII lower case, byte for byte
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	for from := 0; ; {
		i := bytes.Index(lower[from:], []byte("password"))
		if i < 0 {
			break
		}
		key := from + i
		v := key + len("password")
		for v < len(s) && isKeyByte(s[v]) {
			v++
		}
		from = v // a key within this one's bytes has its '=', if any
		v = skipSpaces(s, v)
		if v == len(s) || s[v] != '=' {
			continue
		}
		v++
		k := key
		for k > 0 && isKeyByte(s[k-1]) {
			k--
		}
		before := strings.TrimRight(s[:k], " ") // pgx trims a query key
		inQuery := strings.HasSuffix(before, "?") || strings.HasSuffix(before, "&")
		if !inQuery && k > 0 && !isSpace(s[k-1]) && !strings.ContainsRune("\"`'", rune(s[k-1])) {
			continue // not a keyword of its own: a URL's userinfo or path
		}
		if !inQuery {
			v = skipSpaces(s, v) // as pgx reads it
		}
		var end int
		switch {
		case inQuery:
			end = t.queryValueEnd(v)
		case v < len(s) && s[v] == '\'':
			// As libpq reads it: a backslash escapes the next byte, and
			// a value left open runs to the end.
			limit := t.spanEnd(v)
			for end = v + 1; end < limit && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			end = min(end+1, limit)
		default:
			end = t.valueEnd(v)
		}
		if end > v {
			masks = append(masks, [2]int{v, end})
		}
	}
	if len(masks) == 0 {
		return s
	}
	slices.SortFunc(masks, func(a, b [2]int) int { return a[0] - b[0] })
	merged := masks[:1] // ranges that meet are one
	for _, m := range masks[1:] {
		if last := &merged[len(merged)-1]; m[0] <= last[1] {
			last[1] = max(last[1], m[1])
		} else {
			merged = append(merged, m)
		}
	}
	var b strings.Builder
	var passwords []string
	seen := make(map[string]bool)
	done := 0 // s[:done] is in b
	for _, m := range merged {
		b.WriteString(s[done:m[0]])
		b.WriteString("xxxxx")
		if p := s[m[0]:m[1]]; !seen[p] {
			seen[p] = true
			passwords = append(passwords, p)
		}
		done = m[1]
	}
	b.WriteString(s[done:])
	return maskPieces(b.String(), passwords)
}

// text is a text MaskPasswords reads, with what it found of it kept, so
// that it reads each byte a bounded number of times as the positions it
// is asked about grow.
type text struct {
	s     string
	spans [][2]int // quotedSpans(s)

	space, amp, value found // the end of a word, of a query's value, of a libpq value
	atBefore          []int // atBefore[i]: the last '@' before i, -1 for none
}

// found is where a read from a position, from, ended: to, at the first
// byte it stops at (len(s) for none), where to >= from. It ends a read
// from any position in [from, to] at the same byte.
type found struct{ from, to int }

func (f found) has(i int) bool { return f.from <= i && i <= f.to && f.to > 0 }

// quotedSpans returns the pieces of s quoted as %q quotes a string ("…",
// a backslash escaping the next byte) or as pgx quotes a connection string
// (`…`), each from its opening quote to its closing one, or to the end of
// s where none closes it. Quotes pair from the left.
func quotedSpans(s string) [][2]int {
	var spans [][2]int
	for i := 0; i < len(s); i++ {
		q := s[i]
		if q != '"' && q != '`' {
			continue
		}
		j := i + 1
		for j < len(s) && s[j] != q {
			if q == '"' && s[j] == '\\' {
				j++
			}
			j++
		}
		j = min(j, len(s))
		spans = append(spans, [2]int{i, j})
		i = j
	}
	return spans
}

// span returns the closing quote of the piece of s quoted around i.
func (t *text) span(i int) (int, bool) {
	sp, ok := t.spanAround(i)
	return sp[1], ok
}

// spanAround returns the piece of s quoted around i, from its opening
// quote to its closing one.
func (t *text) spanAround(i int) ([2]int, bool) {
	n, _ := slices.BinarySearchFunc(t.spans, i, func(sp [2]int, i int) int { return sp[0] - i })
	if n > 0 && i <= t.spans[n-1][1] {
		return t.spans[n-1], true
	}
	return [2]int{}, false
}

// parseErrorURL reports whether the "//" that ends before i begins the
// URL that url.Parse's error quotes (`parse "scheme://…": …`, as
// url.Error prints it for the Op "parse").
func (t *text) parseErrorURL(i int) bool {
	sp, ok := t.spanAround(i)
	return ok && t.s[sp[0]] == '"' && strings.HasSuffix(t.s[:sp[0]], "parse ") &&
		!strings.ContainsAny(t.s[sp[0]+1:i-len("//")], "/?#")
}

// spanEnd returns the closing quote of the piece of s quoted around i, or
// len(s) where i is in none.
func (t *text) spanEnd(i int) int {
	if end, ok := t.span(i); ok {
		return end
	}
	return len(t.s)
}

// wordEnd returns where a URL or a value that begins at i ends: at the
// quote that closes the piece of s quoted around i, or at the first space
// after i where i is in none.
func (t *text) wordEnd(i int) int {
	if end, ok := t.span(i); ok {
		return end
	}
	if !t.space.has(i) {
		t.space = found{i, len(t.s)}
		if j := strings.IndexAny(t.s[i:], " \t\n\r\f\v"); j >= 0 {
			t.space.to = i + j
		}
	}
	return t.space.to
}

// lastAt returns the last '@' before w, or -1 for none.
func (t *text) lastAt(w int) int {
	if t.atBefore == nil {
		t.atBefore = make([]int, len(t.s)+1)
		t.atBefore[0] = -1
		for i := range len(t.s) {
			t.atBefore[i+1] = t.atBefore[i]
			if t.s[i] == '@' {
				t.atBefore[i+1] = i
			}
		}
	}
	return t.atBefore[w]
}

// queryValueEnd returns where a query's value that begins at v ends: at
// the next '&', or where its word ends.
func (t *text) queryValueEnd(v int) int {
	if !t.amp.has(v) {
		t.amp = found{v, len(t.s)}
		if j := strings.IndexByte(t.s[v:], '&'); j >= 0 {
			t.amp.to = v + j
		}
	}
	return min(t.amp.to, t.wordEnd(v))
}

// valueEnd returns where a libpq value that begins at v, not quoted,
// ends: at the first space not escaped by a backslash, or at the quote
// that closes the piece of s quoted around v. (v follows a '=' or a
// space, which no backslash escapes: a read from an earlier position that
// passed v read it as a read from v does.)
func (t *text) valueEnd(v int) int {
	if !t.value.has(v) {
		t.value = found{v, len(t.s)}
		for end := v; end < len(t.s); end++ {
			if isSpace(t.s[end]) {
				t.value.to = end
				break
			}
			if t.s[end] == '\\' {
				end++
			}
		}
	}
	return min(t.value.to, t.spanEnd(v))
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// isKeyByte reports whether c may be in a libpq keyword or a query key
// (password, sslpassword, x_password).
func isKeyByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

func skipSpaces(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// maskPieces returns s with each string quoted in it (as %q quotes it)
// that is part of one of passwords, a ':' before it counted (url.Parse's
// error quotes a port that is not one with it), as "xxxxx". Quotes pair
// from the left, each byte read once. The passwords are looked up in one
// suffix array, not each in turn: a text that quotes many strings and many
// passwords is masked in a time that grows as n log n with its length, not
// as the number of quoted strings times the passwords' length.
func maskPieces(s string, passwords []string) string {
	var pieces *pieceIndex // built at the first quoted string
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
		if err == nil && u != "" {
			if pieces == nil {
				pieces = newPieceIndex(passwords)
			}
			if pieces.has(u) {
				b.WriteString(s[done:i])
				b.WriteString(`"xxxxx"`)
				done = j + 1
			}
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

// pieceIndex tells whether a string is part of one of a set of passwords,
// a ':' before each counted.
type pieceIndex struct {
	index *suffixarray.Index // of the passwords, each after sep and a ':'
	sep   byte
	exact bool   // sep is in no password
	buf   []byte // the string looked up, kept for the next
}

func newPieceIndex(passwords []string) *pieceIndex {
	var used [256]bool
	used[':'] = true
	n := 0
	for _, p := range passwords {
		for i := range len(p) {
			used[p[i]] = true
		}
		n += 2 + len(p)
	}
	x := &pieceIndex{}
	if i := slices.Index(used[:], false); i >= 0 {
		x.sep, x.exact = byte(i), true
	}
	data := make([]byte, 0, n)
	for _, p := range passwords {
		data = append(data, x.sep, ':')
		data = append(data, p...)
	}
	x.index = suffixarray.New(data)
	return x
}

// has reports whether u is part of a password, a ':' before it counted.
// Where every byte is in some password, so that no separator is in none,
// u may be found across two of them: more is masked then, never less.
func (x *pieceIndex) has(u string) bool {
	if x.exact && strings.IndexByte(u, x.sep) >= 0 {
		return false
	}
	x.buf = append(x.buf[:0], u...)
	return len(x.index.Lookup(x.buf, 1)) > 0
}

// secretUser reports whether the user name of a URL of scheme whose
// userinfo holds password ("" for none) is a secret too:
// in an http, https, ws or wss URL, one without a password or with an
// empty one, where an API takes a token for the user name (Stripe's
// "sk_live_…:", "https://TOKEN@host"), or with the password "***", which
// net/http's errors write for an empty password as for any other. A
// PostgreSQL URL's user name is a role's, which its errors name too.
func secretUser(scheme, password string) bool {
	switch strings.ToLower(scheme) {
	case "http", "https", "ws", "wss":
		return password == "" || password == "***"
	}
	return false
}

// schemeBefore returns the scheme before s[i:], "//…", as "https" of
// "https://…", or "" for none.
func schemeBefore(s string, i int) string {
	i-- // the ':'
	if i < 1 || s[i] != ':' {
		return ""
	}
	j := i
	for j > 0 && isSchemeByte(s[j-1]) {
		j--
	}
	return s[j:i]
}

func isSchemeByte(c byte) bool {
	return isKeyByte(c) && c != '_' || c == '+' || c == '-' || c == '.'
}

// MaskURLError masks, in ue, url.Parse's error for s, the password of s's
// userinfo, and its user name where that is the secret (secretUser):
// "xxxxx" in its URL, as url.URL.Redacted writes it, and in its
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
	var secrets []string
	if secretUser(scheme, password) && user != "" {
		secrets = append(secrets, user)
		user = "xxxxx"
	}
	if hasPassword {
		secrets = append(secrets, password)
		password = ":xxxxx"
	}
	if len(secrets) == 0 {
		return
	}
	ue.URL = scheme + "://" + user + password + rest[at:]
	if ue.Err == nil {
		return
	}
	msg := ue.Err.Error()
	if masked := maskPieces(msg, secrets); masked != msg {
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
