// Package keyhdr is the grammar of an Idempotency-Key header value, shared by
// the Transport, which refuses a caller's key that a server would refuse,
// and the reference server, which parses what it receives; and the rule
// that says which requests carry one, shared by the Transport and package
// client.
package keyhdr

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Name is the header's name, as idem.KeyHeader spells it.
const Name = "Idempotency-Key"

// Is reports whether name is Name in any case.
func Is(name string) bool {
	return len(name) == len(Name) && strings.EqualFold(name, Name)
}

// Delete deletes the header from h in every case of its name.
func Delete(h http.Header) {
	for name := range h {
		if Is(name) {
			delete(h, name)
		}
	}
}

// Keyed reports whether a request of method gets a key under methods, a
// Transport's Methods: nil means POST and PATCH, and names match in any
// case, those of nil too.
func Keyed(methods []string, method string) bool {
	if methods == nil {
		methods = defaultMethods
	}
	return slices.ContainsFunc(methods, func(m string) bool { return strings.EqualFold(m, method) })
}

// defaultMethods are the methods that nil Methods key.
var defaultMethods = []string{http.MethodPost, http.MethodPatch}

// MaxLen is the longest key Parse accepts, in characters.
const MaxLen = 255

// CommaReason is why a bare value with a comma is refused.
const CommaReason = "a comma separates two keys (two header lines joined into one); send exactly one key, and quote a key that holds a comma"

// Parse validates one header value and returns the key, or why the value is
// refused, for a person to act on.
//
// Two forms are accepted. The IETF draft's Structured Field string form,
// "abc" in double quotes, where \" and \\ are the only escapes; and the
// bare form, abc, taken as it is (a value that starts with a double quote
// is always read as the quoted form). The key itself must be 1 to MaxLen
// printable ASCII characters (0x20 to 0x7E) and must not begin or end with
// a space, which HTTP would strip. A bare key must not hold a comma: a
// proxy may join two header lines into one with a comma between them (RFC
// 9110 §5.3), so "a, b" is read as two keys.
func Parse(v string) (key string, err error) {
	key = v
	if strings.HasPrefix(v, `"`) {
		if key, err = unquote(v); err != nil {
			return "", err
		}
	} else if strings.Contains(v, ",") {
		return "", errors.New(CommaReason)
	}
	switch {
	case key == "":
		return "", errors.New("the key is empty; send 1 to 255 printable ASCII characters, e.g. a UUID")
	case len(key) > MaxLen:
		return "", fmt.Errorf("the key is %d characters long; the limit is %d", len(key), MaxLen)
	case key[0] == ' ' || key[len(key)-1] == ' ':
		return "", errors.New("the key begins or ends with a space")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("byte %d (0x%02x) is not printable ASCII", i, c)
		}
	}
	return key, nil
}

// Count returns how many keys vals, the Idempotency-Key header lines of a
// request, hold: one per line, and one more per comma outside a quoted key.
// A proxy may join two lines into one with a comma between them (RFC 9110
// §5.3), so one line "a, b" holds two keys, as two lines do.
func Count(vals []string) int {
	n := 0
	for _, v := range vals {
		for {
			n++
			v = strings.TrimLeft(v, " \t")
			if strings.HasPrefix(v, `"`) {
				v = v[quotedLen(v):]
			}
			i := strings.IndexByte(v, ',')
			if i < 0 {
				break
			}
			v = v[i+1:]
		}
	}
	return n
}

// quotedLen returns the length of the sf-string that v begins with, up to
// its closing quote, or len(v) when it has none.
func quotedLen(v string) int {
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(v)
}

// unquote decodes an RFC 8941 sf-string: DQUOTE *chr DQUOTE, where chr is
// printable ASCII other than '"' and '\', or the escapes \" and \\.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`a quoted key may only escape " and \`)
			}
			b.WriteByte(v[i])
		case '"':
			if i != len(v)-1 {
				return "", errors.New("text follows the closing quote; send exactly one key")
			}
			return b.String(), nil
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the quoted key has no closing quote")
}
