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
	"io"
	"mime"
	"strings"
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

// JSON returns the canonical form of the JSON document b. It returns an error
// when b is not exactly one valid JSON value; the caller then fingerprints
// the raw bytes instead.
//
// The canonical form is what encoding/json produces when it decodes b into
// an any (with UseNumber) and encodes it again without HTML escaping. It is
// stored in fingerprints, so it must never change. Documents made only of
// printable ASCII without escapes take a single-pass fast path that
// produces the same bytes; every other document, and every error, comes
// from encoding/json itself.
func JSON(b []byte) ([]byte, error) {
	if c, ok := fastJSON(b); ok {
		return c, nil
	}
	return jsonSlow(b)
}

// jsonSlow is JSON computed by encoding/json: the definition of the
// canonical form, which fastJSON must reproduce byte for byte.
func jsonSlow(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canon: trailing data after JSON value")
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// Body returns the canonical form of a body of the given Content-Type: the
// canonical JSON when the type names JSON and the body parses, the bytes as
// they are otherwise.
func Body(contentType string, b []byte) []byte {
	if IsJSON(contentType) {
		if c, err := JSON(b); err == nil {
			return c
		}
	}
	return b
}
