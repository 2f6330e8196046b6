// Package secrethdr tells the header names that carry a credential, for
// idem.SecretHeader (never stored in a jar) and testserver's Middleware
// (never saved for replay).
package secrethdr

import "net/textproto"

// Is reports whether a header carries a credential: Authorization,
// Proxy-Authorization, Cookie, Set-Cookie, any header whose name contains
// "auth", "token", "secret", "password", "passwd", "passphrase" (an
// exchange's CB-ACCESS-PASSPHRASE), "api-key", "api_key", "apikey",
// "session", "credential", "jwt", "assertion" (as
// X-Goog-Iap-Jwt-Assertion), "signature" or "hmac" (RFC 9421's Signature,
// a webhook's X-Hub-Signature-256 or Stripe-Signature: a signature that a
// server accepts again with what it signs; not Signature-Input, which
// lists what it covers), any whose last word is "sign" (a signature
// again, as an exchange's CB-ACCESS-SIGN), and any whose name ends in
// "key" (an API key by another name, as Ocp-Apim-Subscription-Key), but
// Idempotency-Key, whatever its case.
func Is(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Cookie", "Set-Cookie": // Authorization and Proxy-Authorization hold "auth"
		return true
	case "Idempotency-Key", "Signature-Input":
		return false
	}
	for _, s := range []string{"auth", "token", "secret", "password", "passwd", "passphrase", "api-key", "api_key", "apikey",
		"session", "credential", "jwt", "assertion", "signature", "hmac"} {
		if containsFold(name, s) {
			return true
		}
	}
	if n := len(name); n >= 4 && containsFold(name[n-4:], "sign") && (n == 4 || name[n-5] == '-' || name[n-5] == '_') {
		return true
	}
	return len(name) >= 3 && containsFold(name[len(name)-3:], "key")
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
