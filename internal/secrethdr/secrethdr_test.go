package secrethdr

import (
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
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

// TestWithhold: Withhold keeps every name, each credential's without its
// values, copies the rest and leaves its input alone; applied again it
// changes nothing, as a jar applies it to what the Transport withheld.
// Withheld names the credentials left without values, canonical, sorted
// and once each, and not a credential that holds its values, nor another
// header without values.
func TestWithhold(t *testing.T) {
	in := http.Header{"Authorization": {"Bearer s"}, "x-api-key": {"k"}, "X-Api-Key": {"k2"}, "Accept": {"a", "b"},
		"User-Agent": {}, "Cookie": {}}
	orig := in.Clone()
	out := Withhold(in)
	want := http.Header{"Authorization": {}, "x-api-key": {}, "X-Api-Key": {}, "Accept": {"a", "b"}, "User-Agent": {}, "Cookie": {}}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("Withhold(%v) = %v; want %v", in, out, want)
	}
	if !reflect.DeepEqual(in, orig) {
		t.Fatalf("Withhold changed its input: %v; was %v", in, orig)
	}
	out["Accept"][0] = "changed"
	if in["Accept"][0] != "a" {
		t.Fatal("Withhold's copy shares its values with the input")
	}
	out["Accept"][0] = "a"
	if again := Withhold(out); !reflect.DeepEqual(again, out) {
		t.Fatalf("Withhold of its own result = %v; want %v", again, out)
	}
	if got, want := Withheld(out), []string{"Authorization", "Cookie", "X-Api-Key"}; !slices.Equal(got, want) {
		t.Fatalf("Withheld(%v) = %q; want %q", out, got, want)
	}
	if got := Withheld(in); !slices.Equal(got, []string{"Cookie"}) {
		t.Fatalf("Withheld(%v) = %q; want [Cookie]: the others hold their values", in, got)
	}
}

// TestLacking: a name is lacking when h holds no value of it in any case
// of the name; an entry without values (a withheld one) holds none.
func TestLacking(t *testing.T) {
	h := http.Header{"authorization": {"Bearer t"}, "Cookie": {}, "X-Api-Key": {""}}
	got := Lacking(h, []string{"Authorization", "Cookie", "X-Api-Key", "Proxy-Authorization"})
	if want := []string{"Cookie", "Proxy-Authorization"}; !slices.Equal(got, want) {
		t.Errorf("Lacking: %q; want %q", got, want)
	}
}
