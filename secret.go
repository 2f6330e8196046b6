package idem

import (
	"net/http"
	"net/textproto"
)

// SecretHeader reports whether a request header carries a credential and so
// must never be written to a jar: Authorization, Proxy-Authorization,
// Cookie, Set-Cookie, and any header whose name contains "auth", "token",
// "secret", "password", "api-key", "api_key" or "apikey" (such as
// X-Authorization, X-Auth-Key, X-Api-Key or X-Auth-Token), whatever its
// case. It errs towards secret: such a header is not stored, so a resume
// after a restart sends the request without it.
func SecretHeader(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Cookie", "Set-Cookie": // Authorization and Proxy-Authorization hold "auth"
		return true
	}
	for _, s := range []string{"auth", "token", "secret", "password", "api-key", "api_key", "apikey"} {
		if containsFold(name, s) {
			return true
		}
	}
	return false
}

// containsFold reports whether s contains sub, ignoring ASCII case; sub is
// lower case. Unlike strings.ToLower it does not allocate.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		k := 0
		for k < len(sub) && lower(s[i+k]) == sub[k] {
			k++
		}
		if k == len(sub) {
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// PublicHeader returns a copy of h without the headers SecretHeader names.
func PublicHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if !SecretHeader(k) {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}
