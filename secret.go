package idem

import (
	"net/http"

	"github.com/idemkit/idem/internal/secrethdr"
)

// SecretHeader reports whether a request header carries a credential and so
// must never be written to a jar: Authorization, Proxy-Authorization,
// Cookie, Set-Cookie, any header whose name contains "auth", "token",
// "secret", "password", "passwd", "passphrase", "api-key", "api_key",
// "apikey", "session", "credential", "jwt", "assertion", "signature" or
// "hmac" (such as X-Authorization, X-Auth-Key, X-Api-Key, X-Auth-Token,
// X-Amz-Security-Token, X-Session-Id, X-Goog-Iap-Jwt-Assertion, an
// exchange's CB-ACCESS-PASSPHRASE, an RFC 9421 Signature, or a webhook's
// X-Hub-Signature-256, Stripe-Signature or X-Shopify-Hmac-Sha256: a
// signature that a server accepts again with the body the jar keeps; not
// Signature-Input, which lists the fields a signature covers), any whose
// last word is "sign" (a signature too, as an exchange's CB-ACCESS-SIGN or
// KC-API-SIGN), and any whose name ends in "key" (such as
// Ocp-Apim-Subscription-Key or DD-Application-Key), but Idempotency-Key,
// whatever its case. It errs towards secret: such a header's value is not
// stored, so a resume after a restart sends the request without it unless
// the caller adds it again; the jar keeps its name (Record.Withheld), which
// client.Resume and idemctl resume check.
func SecretHeader(name string) bool { return secrethdr.Is(name) }

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
