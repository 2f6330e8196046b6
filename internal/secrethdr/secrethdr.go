// Package secrethdr tells the header names that carry a credential, for
// idem.SecretHeader (a jar keeps their names, never their values) and
// testserver's Middleware (never saved for replay).
package secrethdr

import (
	"context"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// Withhold returns a copy of h in which each header that Is names has no
// values: a jar keeps the name, so that a resume knows which credentials
// the first send carried (idem.Record.Withheld), and not the credential.
// It is idempotent: the jars apply it to what the Transport already did.
func Withhold(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if Is(k) {
			out[k] = []string{}
		} else {
			out[k] = slices.Clone(v)
		}
	}
	return out
}

// IsWithheld reports whether a header entry, name and values, is a
// credential that Withhold left without its values.
func IsWithheld(name string, values []string) bool { return len(values) == 0 && Is(name) }

// Withheld returns the canonical names of the headers of h that Is names
// and that have no values, sorted: those Withhold left without their
// credential. A header of a record written before the jars kept these
// names, or by a version whose Is named fewer, holds its values instead:
// it is not withheld.
func Withheld(h http.Header) []string {
	var names []string
	for k, v := range h {
		if IsWithheld(k, v) {
			names = append(names, textproto.CanonicalMIMEHeaderKey(k))
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

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
	// One pass over the name, trying at each byte only the words that
	// begin with it: a request's every header name is checked, on every
	// call of a Transport.
	for i := range len(name) {
		for _, w := range byFirst[lower(name[i])] {
			if hasPrefixFold(name[i:], w) {
				return true
			}
		}
	}
	if n := len(name); n >= 4 && hasPrefixFold(name[n-4:], "sign") && (n == 4 || name[n-5] == '-' || name[n-5] == '_') {
		return true
	}
	return len(name) >= 3 && hasPrefixFold(name[len(name)-3:], "key")
}

// byFirst are the words that make a header name secret wherever they
// are in it, by their first letter.
var byFirst = [256][]string{
	'a': {"auth", "api-key", "api_key", "apikey", "assertion"},
	'c': {"credential"},
	'h': {"hmac"},
	'j': {"jwt"},
	'p': {"password", "passwd", "passphrase"},
	's': {"secret", "session", "signature"},
	't': {"token"},
}

// hasPrefixFold reports whether s begins with prefix, ignoring ASCII case;
// prefix is lower case. Unlike strings.ToLower it does not allocate.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := range len(prefix) {
		if lower(s[i]) != prefix[i] {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// Lacking returns the names of want that h holds no value of, in any case
// of the name: the credentials a resume would send without. Added is
// never among them: no header bears its name, and what stands for it is
// the program's to add (client.Options.Header, run before this check) or
// the operator's to give (idemctl resume asks for a credential when the
// record holds none).
func Lacking(h http.Header, want []string) []string {
	var missing []string
	for _, name := range want {
		if name == Added {
			continue
		}
		found := false
		for k, vs := range h {
			if len(vs) > 0 && strings.EqualFold(k, name) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, name)
		}
	}
	return missing
}

// Added is the name of the entry, with no values, that a record's header
// holds when the program added credentials to each attempt itself
// (client.Options.Header): they leave no name of their own in the record,
// and a resume without any is a new request to a server that scopes keys
// by credential. Is names it, so Withheld lists it, and a version that
// does not know it refuses a resume without it, as for any credential.
const Added = "Idem-Added-Credentials"

type added struct{}

// MarkAdded returns ctx marked so that the Transport records Added with
// the operation it begins.
func MarkAdded(ctx context.Context) context.Context { return context.WithValue(ctx, added{}, true) }

// AddsCredentials reports whether ctx was marked by MarkAdded.
func AddsCredentials(ctx context.Context) bool {
	v, _ := ctx.Value(added{}).(bool)
	return v
}
