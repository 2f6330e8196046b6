// Package sendable says what net/http's Transport refuses of a request
// before it writes a byte, each attempt alike: shared by the Transport,
// which refuses such a request before it stores anything, and package
// client, whose Options.Header changes each attempt after that check and
// whose wrapper of its Base is the Transport's Base.
package sendable

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Over reports whether rt is an *http.Transport, or wraps one: through
// the Unwrap() http.RoundTripper method of a wrapper that has it
// (client's, and others'), up to 16 deep.
func Over(rt http.RoundTripper) bool {
	for range 16 {
		switch b := rt.(type) {
		case *http.Transport:
			return true
		case interface{ Unwrap() http.RoundTripper }:
			rt = b.Unwrap()
		default:
			return false
		}
	}
	return false
}

// Once is a wrapper of a base transport that sends each request it is
// given through that base, once, and nothing of its own (package client's
// wrapper of its Options.Base): what the base's error says of an attempt,
// the wrapper's says too.
type Once interface {
	SendsOnceThrough() http.RoundTripper
}

// NetHTTP reports whether rt is an *http.Transport, or a wrapper that
// sends through one once (Once), up to 16 deep: its error for an attempt
// is net/http's own, which tells a dial that failed before anything of the
// request was written.
func NetHTTP(rt http.RoundTripper) bool {
	for range 16 {
		switch b := rt.(type) {
		case *http.Transport:
			return true
		case Once:
			rt = b.SendsOnceThrough()
		default:
			return false
		}
	}
	return false
}

// Head names the first part of r's head that net/http's Transport does
// not send, each attempt alike, or "" when there is none: a method that is
// not a token, refused unsent (but over an HTTP/2 connection already
// open); a header or trailer field that httpguts' ValidHeaderFieldName or
// ValidHeaderFieldValue refuses (the standard library exports neither),
// refused unsent. As net/http's, its text does not quote a field's value,
// which may be a secret. A Host that httpguts' ValidHostHeader refuses is
// not among them: net/http sends it empty over HTTP/1 without a proxy,
// which a URL naming a Unix socket's path relies on (go.dev/issue/61431),
// and refuses it only over HTTP/2 or a proxy, after the dial.
func Head(r *http.Request) string {
	if r.Method != "" && !isToken(r.Method) {
		return "method " + strconv.Quote(r.Method)
	}
	if what := field(r.Header); what != "" {
		return what
	}
	if what := field(r.Trailer); what != "" {
		return "trailer " + what
	}
	return ""
}

// ProxyRefused reports whether err, which rt returned for r, is the error
// of rt's Proxy function when rt is an *http.Transport: net/http returns
// it as it is, before it dials, and the function, asked again, fails with
// the same text. Nothing of the attempt was sent. Only a Transport of
// net/http's own is asked: another RoundTripper may have sent an attempt
// of its own first.
func ProxyRefused(rt http.RoundTripper, r *http.Request, err error) bool {
	ht, ok := rt.(*http.Transport)
	if !ok || ht.Proxy == nil {
		return false
	}
	_, perr := ht.Proxy(r)
	return perr != nil && perr.Error() == err.Error()
}

// field names the first field of h with a name that is not a token or a
// value with a control character other than a tab, or returns "".
func field(h http.Header) string {
	for name, vs := range h {
		if !isToken(name) {
			return "field name " + strconv.Quote(name)
		}
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
					return "field value for " + strconv.Quote(name)
				}
			}
		}
	}
	return ""
}

// NonMethod returns the index of the first of methods that is not a
// method net/http sends (a token), or -1.
func NonMethod(methods []string) int {
	return slices.IndexFunc(methods, func(m string) bool { return !isToken(m) })
}

// isToken reports whether s is a token of RFC 9110 §5.6.2: one or more
// tchars.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '-':
		case strings.IndexByte("!#$%&'*+.^_`|~", b) < 0:
			return false
		}
	}
	return s != ""
}
