package secrethdr

import (
	"net/textproto"
	"strings"
	"testing"
)

// reference is Is as a list of substrings, each looked for in the whole
// name in lower case: what Is's one pass must answer for every name.
func reference(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Cookie", "Set-Cookie":
		return true
	case "Idempotency-Key", "Signature-Input":
		return false
	}
	l := strings.ToLower(name)
	for _, s := range []string{"auth", "token", "secret", "password", "passwd", "passphrase", "api-key", "api_key", "apikey",
		"session", "credential", "jwt", "assertion", "signature", "hmac"} {
		if strings.Contains(l, s) {
			return true
		}
	}
	if n := len(l); n >= 4 && strings.HasSuffix(l, "sign") && (n == 4 || l[n-5] == '-' || l[n-5] == '_') {
		return true
	}
	return strings.HasSuffix(l, "key")
}

func TestIsMatchesReference(t *testing.T) {
	for _, name := range []string{
		"Content-Type", "Accept", "X-Request-Id", "Authorization", "proxy-authorization", "Cookie", "set-cookie",
		"X-Api-Key", "X-API_KEY", "Apikey", "X-Auth-Token", "Client-Secret", "X-Password", "Passwd", "CB-ACCESS-PASSPHRASE",
		"X-Session-Id", "X-Credentials", "X-Goog-Iap-Jwt-Assertion", "Signature", "Signature-Input", "X-Hub-Signature-256",
		"X-Hmac", "CB-ACCESS-SIGN", "X_SIGN", "sign", "Design", "Ocp-Apim-Subscription-Key", "Idempotency-Key",
		"idempotency-KEY", "Key", "ke", "", "a", "X-Monkey", "Tok", "tokenx", "xAUTHx", "Hmac", "hma",
	} {
		if got, want := Is(name), reference(name); got != want {
			t.Errorf("Is(%q) = %v; the list of words says %v", name, got, want)
		}
	}
}

func FuzzIsMatchesReference(f *testing.F) {
	for _, s := range []string{"Content-Type", "X-Api-Key", "CB-ACCESS-SIGN", "Signature-Input", "passphrase"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := Is(name), reference(name); got != want {
			t.Errorf("Is(%q) = %v; the list of words says %v", name, got, want)
		}
	})
}

var sink bool

func BenchmarkIs(b *testing.B) {
	for _, n := range []string{"Content-Type", "X-Request-Id", "Authorization"} {
		b.Run(n, func(b *testing.B) {
			for b.Loop() {
				sink = Is(n)
			}
		})
	}
}
