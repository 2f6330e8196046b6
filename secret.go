package idem

import (
	"net/http"
	"net/textproto"
	"strings"
)

// SecretHeader reports whether a request header carries a credential and so
// must never be written to a jar: Authorization, Proxy-Authorization, Cookie,
// and any header whose name contains "token", "secret", "password" or
// "api-key" (such as X-Api-Key or X-Auth-Token).
func SecretHeader(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie":
		return true
	}
	n := strings.ToLower(name)
	for _, s := range []string{"token", "secret", "password", "api-key", "apikey"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
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
