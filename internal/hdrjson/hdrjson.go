// Package hdrjson stores an http.Header as the jars keep it, a JSON object
// of names to lists of values, without losing a byte. encoding/json
// replaces bytes that are not UTF-8 with U+FFFD, and HTTP allows them in
// values (obs-text, such as a Latin-1 file name): such a value, and one
// that begins with a NUL byte, is stored as a NUL, "base64:" and its bytes
// in base64. So is such a name, which HTTP does not allow but a caller's
// header may hold: two of them would otherwise become one. No name or
// value a server accepts begins with a NUL (it is a control character), so
// headers stored as plain JSON read back as they were.
package hdrjson

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

const marker = "\x00base64:"

// Marshal returns h as JSON.
func Marshal(h http.Header) ([]byte, error) {
	if !needsEncoding(h) {
		return json.Marshal(h)
	}
	out := make(http.Header, len(h))
	for name, vs := range h {
		ws := make([]string, len(vs))
		for i, v := range vs {
			ws[i] = encode(v)
		}
		out[encode(name)] = ws
	}
	return json.Marshal(out)
}

// encode returns s, or its marked base64 when JSON cannot hold its bytes.
func encode(s string) string {
	if valueNeedsEncoding(s) {
		return marker + base64.StdEncoding.EncodeToString([]byte(s))
	}
	return s
}

// Unmarshal reads a header that Marshal wrote, or plain JSON.
func Unmarshal(b []byte) (http.Header, error) {
	var h http.Header
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	for name, vs := range h {
		for i, v := range vs {
			if rest, ok := strings.CutPrefix(v, marker); ok {
				d, err := base64.StdEncoding.DecodeString(rest)
				if err != nil {
					return nil, fmt.Errorf("header %q: value %d: %w", name, i, err)
				}
				vs[i] = string(d)
			}
		}
	}
	// The encoded names are collected first: a decoded name may look like
	// an encoded one, and must not be decoded twice.
	var encoded []string
	for name := range h {
		if strings.HasPrefix(name, marker) {
			encoded = append(encoded, name)
		}
	}
	decoded := make(map[string][]string, len(encoded))
	for _, name := range encoded {
		d, err := base64.StdEncoding.DecodeString(name[len(marker):])
		if err != nil {
			return nil, fmt.Errorf("header name %q: %w", name, err)
		}
		decoded[string(d)] = h[name]
		delete(h, name)
	}
	for name, vs := range decoded {
		h[name] = vs
	}
	return h, nil
}

func needsEncoding(h http.Header) bool {
	for name, vs := range h {
		if valueNeedsEncoding(name) {
			return true
		}
		for _, v := range vs {
			if valueNeedsEncoding(v) {
				return true
			}
		}
	}
	return false
}

func valueNeedsEncoding(v string) bool {
	return (len(v) > 0 && v[0] == 0) || !utf8.ValidString(v)
}
