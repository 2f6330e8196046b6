// Package canon computes the canonical form of a request body, so that two
// bodies that mean the same thing get the same fingerprint.
//
// JSON is canonicalised: object keys are sorted, insignificant whitespace is
// removed and numbers keep their literal text. Any other body is used as is,
// byte for byte.
package canon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// IsJSON reports whether a Content-Type names JSON (application/json or any
// +json suffix type, such as application/merge-patch+json).
func IsJSON(contentType string) bool {
	if strings.EqualFold(contentType, "application/json") {
		return true // the common case, without parsing
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// ContentType returns h's Content-Type, also under a key that is not in
// canonical form ("content-type", set in the map directly): net/http sends
// such a key as it is (HTTP/2 in lower case), and the server reads it as
// Content-Type. Of two keys, the first in byte order wins, the canonical
// one first: HTTP/1.1 sends the keys in that order, and a server reads
// the first value.
func ContentType(h http.Header) string {
	if v := h["Content-Type"]; len(v) > 0 {
		return v[0]
	}
	key, value := "", ""
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, "Content-Type") && (key == "" || k < key) {
			key, value = k, v[0]
		}
	}
	return value
}

// MediaType returns the media type a Content-Type names, as a fingerprint
// counts it: without its parameters, in lower case (mime.ParseMediaType's),
// or the value as it is when it does not parse. Two requests whose bodies
// are the same bytes under two media types are two requests: the reference
// server's fingerprint counts it, and idem.Transport refuses to send one
// under the other's key.
func MediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return contentType
	}
	return mt
}

// JSON returns the canonical form of the JSON document b. It returns an error
// when b is not exactly one valid JSON value, or when an object in it has
// two keys equal, or equal but for case; the caller then fingerprints the raw bytes
// instead. Go's encoding/json decodes such keys into one struct field, the
// last one winning: for the server, their order is significant, so the
// canonical form, which sorts keys, would make two different requests one.
// So too when b holds bytes that are not UTF-8, or a \u escape of half a
// surrogate pair without its other half: encoding/json decodes each to
// U+FFFD, which would make documents that differ there one. (Earlier
// versions canonicalised those, and documents with a key twice: a record
// or a claim they stored of such a body has a fingerprint this version
// does not make again.)
//
// The canonical form is what encoding/json produces when it decodes b into
// an any (with UseNumber) and encodes it again without HTML escaping. It is
// stored in fingerprints, so it must never change. Documents made only of
// printable ASCII without escapes take a single-pass fast path that
// produces the same bytes; every other document, and every error, comes
// from encoding/json itself.
func JSON(b []byte) ([]byte, error) {
	return new(Buffer).JSON(b)
}

// A Buffer is the space JSON and Body work in. One that is used again makes
// canonical forms without allocating: what its methods return stays valid
// only until its next call. The zero value is ready to use; a Buffer must
// not be used by two goroutines at once.
type Buffer struct {
	space   []byte   // the output, then scratch space for reordering
	members []member // the members of the objects being read
}

// JSON is the package's JSON, made in b.
func (b *Buffer) JSON(in []byte) ([]byte, error) {
	if c, ok := b.fastJSON(in); ok {
		return c, nil
	}
	return jsonSlow(in)
}

// Body is the package's Body, made in b.
func (b *Buffer) Body(contentType string, in []byte) []byte {
	if contentType == "" || IsJSON(contentType) {
		if c, err := b.JSON(in); err == nil {
			return c
		}
	}
	return in
}

// Cap returns how many bytes of space b holds on to.
func (b *Buffer) Cap() int {
	return cap(b.space) + cap(b.members)*int(unsafe.Sizeof(member{}))
}

// jsonSlow is JSON computed by encoding/json: the definition of the
// canonical form, which fastJSON must reproduce byte for byte.
func jsonSlow(b []byte) ([]byte, error) {
	if !utf8.Valid(b) {
		return nil, errors.New("canon: not UTF-8")
	}
	if loneSurrogate(b) {
		return nil, errors.New("canon: an escape of half a surrogate pair")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canon: trailing data after JSON value")
	}
	if k, ok := foldCollision(v); ok {
		return nil, fmt.Errorf("canon: two keys equal to %q but for case", k)
	}
	// A key an object has twice leaves its map a member short of the
	// document's: only then is the document read again to name it.
	if members(v) != colons(b) {
		k, _ := duplicateKey(b)
		return nil, fmt.Errorf("canon: two members named %q in one object", k)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// loneSurrogate reports whether b, a JSON document, holds a \u escape of
// a surrogate (U+D800 to U+DFFF) that is not a high one followed at once
// by an escape of a low one: what encoding/json decodes to U+FFFD. A
// backslash outside a string is left for the decoder to refuse.
func loneSurrogate(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := escapedRune(b, i)
		i++ // past the escaped byte: a backslash escapes a backslash
		switch {
		case !ok || r < 0xd800 || r > 0xdfff:
		case r >= 0xdc00:
			return true // a low half first
		default:
			low, ok := escapedRune(b, i+5)
			if !ok || low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 6
		}
	}
	return false
}

// escapedRune returns the code unit of the \uXXXX escape at b[i:], and
// false when there is none there.
func escapedRune(b []byte, i int) (rune, bool) {
	if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
		return 0, false
	}
	r, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
	return rune(r), err == nil
}

// members returns how many members the objects in v hold, all together.
func members(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		n = len(v)
		for _, e := range v {
			n += members(e)
		}
	case []any:
		for _, e := range v {
			n += members(e)
		}
	}
	return n
}

// colons returns how many ':' the valid JSON document b has outside its
// strings: one for each member of each of its objects.
func colons(b []byte) int {
	n := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case ':':
			n++
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		}
	}
	return n
}

// duplicateKey returns a key that an object of the valid JSON document b
// has twice (compared as decoded: "a" and "\u0061" are one key), and true;
// or false when there is none. Decoded into an any, the last value wins;
// into a struct, a later null leaves the earlier value and a later object
// is merged into the earlier one: a canonical form would make requests
// that differ there one.
func duplicateKey(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		keys    map[string]bool // nil for an array
		wantKey bool            // the next token is an object's key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // io.EOF; b was decoded once already
		}
		top := len(stack) - 1
		switch {
		case tok == json.Delim('{'):
			stack = append(stack, frame{keys: map[string]bool{}, wantKey: true})
			continue
		case tok == json.Delim('['):
			stack = append(stack, frame{})
			continue
		case tok == json.Delim('}') || tok == json.Delim(']'):
			stack = stack[:top] // and the value it was ended
		case top >= 0 && stack[top].keys != nil && stack[top].wantKey:
			k, _ := tok.(string)
			if stack[top].keys[k] {
				return k, true
			}
			stack[top].keys[k] = true
			stack[top].wantKey = false
			continue
		}
		// A value ended: its object wants the next key.
		if top = len(stack) - 1; top >= 0 && stack[top].keys != nil {
			stack[top].wantKey = true
		}
	}
}

// foldCollision returns a key of an object in v that another key of that
// object equals but for case (strings.EqualFold, as encoding/json matches
// struct fields), and true; or false when there is none.
func foldCollision(v any) (string, bool) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) > 1 && mayFold(v) {
			seen := make(map[string]bool, len(v))
			for k := range v {
				f := foldKey(k)
				if seen[f] {
					return k, true
				}
				seen[f] = true
			}
		}
		for _, e := range v {
			if k, ok := foldCollision(e); ok {
				return k, true
			}
		}
	case []any:
		for _, e := range v {
			if k, ok := foldCollision(e); ok {
				return k, true
			}
		}
	}
	return "", false
}

// mayFold reports whether two keys of m may be equal but for case: not
// when every key is ASCII without an upper-case letter.
func mayFold(m map[string]any) bool {
	for k := range m {
		for i := 0; i < len(k); i++ {
			if c := k[i]; c >= 0x80 || ('A' <= c && c <= 'Z') {
				return true
			}
		}
	}
	return false
}

// foldKey maps each rune of k to the least rune of its case-folding orbit:
// two keys are equal but for case (strings.EqualFold) exactly when their
// foldKeys are equal.
func foldKey(k string) string {
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, k)
}

// Body returns the canonical form of a body of the given Content-Type: the
// canonical JSON when the type names JSON, or is "" (none given: a JSON
// body sent without its type, which idem.Transport and the reference
// server both take for JSON), and the body parses; the bytes as they are
// otherwise.
func Body(contentType string, b []byte) []byte {
	return new(Buffer).Body(contentType, b)
}
