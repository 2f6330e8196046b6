package canon

import (
	"net/http"
	"testing"
)

func TestJSONEquivalent(t *testing.T) {
	a, err := JSON([]byte(`{"b": 1, "a": {"y": [1, 2], "x": "s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := JSON([]byte("{\n\"a\":{\"x\":\"s\",\"y\":[1,2]},\"b\":1}"))
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Fatalf("got %s and %s; want equal", a, b)
	}
	if want := `{"a":{"x":"s","y":[1,2]},"b":1}`; string(a) != want {
		t.Fatalf("got %s; want %s", a, want)
	}
}

func TestJSONDifferentValues(t *testing.T) {
	for _, pair := range [][2]string{
		{`{"a":1}`, `{"a":2}`},
		{`{"a":1}`, `{"a":1.0}`},
		{`{"a":"1"}`, `{"a":1}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":null}`, `{}`},
	} {
		x, err1 := JSON([]byte(pair[0]))
		y, err2 := JSON([]byte(pair[1]))
		if err1 != nil || err2 != nil {
			t.Fatalf("%v %v", err1, err2)
		}
		if string(x) == string(y) {
			t.Errorf("%s and %s canonicalise to the same %s; want different", pair[0], pair[1], x)
		}
	}
}

// TestJSONRefusesWhatDecodesToReplacement: encoding/json decodes a byte
// that is not UTF-8, and an escape of half a surrogate pair, to U+FFFD, so
// that documents differing there had one canonical form, and one
// fingerprint: they are refused (Body gives their bytes as they are). An
// escaped pair, and U+FFFD itself, are canonicalised.
func TestJSONRefusesWhatDecodesToReplacement(t *testing.T) {
	for _, in := range []string{
		"{\"a\":\"\xff\"}", "{\"a\":\"x\xc3\"}", "[\"\xed\xa0\x80\"]", // not UTF-8 (the last a surrogate, encoded)
		`{"a":"\ud800"}`, `{"a":"\udbff"}`, `{"a":"\uDC00x"}`, `["\ud800\u0041"]`, `["\ud800\ud800"]`,
		`["\ud800\"]`, `{"\ud800":1}`, `["\\\ud800"]`,
	} {
		if c, err := JSON([]byte(in)); err == nil {
			t.Errorf("JSON(%q) = %q; want an error", in, c)
		}
		if b := Body("application/json", []byte(in)); string(b) != in {
			t.Errorf("Body(%q) = %q; want the bytes as they are", in, b)
		}
	}
	for in, want := range map[string]string{
		`["\ud83d\ude00"]`: `["😀"]`, `["\uD83D\uDE00 "]`: `["😀 "]`, `["\ufffd"]`: "[\"\ufffd\"]", "[\"\ufffd\"]": "[\"\ufffd\"]",
		`["\\ud800"]`:  `["\\ud800"]`, // an escaped backslash, then "ud800"
		`["\u00e9\\"]`: `["é\\"]`,
	} {
		if c, err := JSON([]byte(in)); err != nil || string(c) != want {
			t.Errorf("JSON(%q) = %q, %v; want %q", in, c, err, want)
		}
	}
}

func TestJSONRejectsTrailingData(t *testing.T) {
	for _, in := range []string{`{"a":1} {"b":2}`, `{"a":`, ``, `nope`} {
		if _, err := JSON([]byte(in)); err == nil {
			t.Errorf("JSON(%q): got nil error; want one", in)
		}
	}
}

func TestBody(t *testing.T) {
	if got := Body("application/json; charset=utf-8", []byte(`{ "a" : 1 }`)); string(got) != `{"a":1}` {
		t.Errorf("json: got %s", got)
	}
	if got := Body("application/problem+json", []byte(`{ "a" : 1 }`)); string(got) != `{"a":1}` {
		t.Errorf("+json: got %s", got)
	}
	if got := Body("text/plain", []byte(`{ "a" : 1 }`)); string(got) != `{ "a" : 1 }` {
		t.Errorf("text: got %s; want bytes unchanged", got)
	}
	if got := Body("application/json", []byte(`{bad`)); string(got) != `{bad` {
		t.Errorf("invalid json: got %s; want bytes unchanged", got)
	}
	if got := Body("", []byte(`{ "b" : 1, "a": 2 }`)); string(got) != `{"a":2,"b":1}` {
		t.Errorf("no type, json: got %s", got)
	}
	if got := Body("", []byte(`a=1&b=2`)); string(got) != `a=1&b=2` {
		t.Errorf("no type, not json: got %s; want bytes unchanged", got)
	}
}

func TestIsJSON(t *testing.T) {
	for ctype, want := range map[string]bool{
		"application/json":                true,
		"Application/JSON":                true,
		"application/json; charset=utf-8": true,
		"application/merge-patch+json":    true,
		"application/problem+json; x=1":   true,
		"application/jsonx":               false,
		"text/plain":                      false,
		"application/json;;":              false,
		"":                                false,
	} {
		if got := IsJSON(ctype); got != want {
			t.Errorf("IsJSON(%q) = %v; want %v", ctype, got, want)
		}
	}
}

// Keys equal but for case make a document that Go decodes (into a struct)
// by the order of its keys: it has no canonical form, and the caller
// fingerprints its bytes.
func TestJSONRefusesKeysEqualButForCase(t *testing.T) {
	for _, doc := range []string{`{"amount":5,"Amount":1000}`, `{"Amount":1000,"amount":5}`, `[{"x":{"ID":1,"id":2}}]`,
		"{\"k\":1,\"\u212a\":2}", `{"é":1,"É":2}`} {
		if c, err := JSON([]byte(doc)); err == nil {
			t.Errorf("JSON(%s) = %s; want an error", doc, c)
		}
		if got := Body("application/json", []byte(doc)); string(got) != doc {
			t.Errorf("Body(%s) = %s; want the bytes as they are", doc, got)
		}
	}
}

// A key that an object has twice makes a document that Go decodes by the
// order of its members (the last wins in a map; in a struct a later null
// leaves the earlier value, and a later object is merged into the earlier
// one): it has no canonical form, and the caller fingerprints its bytes.
// Two requests that differ in the member a canonical form would drop are
// two requests.
func TestJSONRefusesAKeyTwice(t *testing.T) {
	for _, doc := range []string{`{"order_id":"A","order_id":null}`, `{"a":1,"a":1}`, `{"a":1,"\u0061":2}`,
		`[1,{"m":{"x":1},"n":[{"k":1}],"m":{"y":2}}]`, `{"o":{"a":{"b":1},"b":2},"o":3}`} {
		if c, err := JSON([]byte(doc)); err == nil {
			t.Errorf("JSON(%s) = %s; want an error", doc, c)
		}
		if got := Body("application/json", []byte(doc)); string(got) != doc {
			t.Errorf("Body(%s) = %s; want the bytes as they are", doc, got)
		}
	}
	// The same key in two objects, or as a value, is no duplicate.
	for doc, want := range map[string]string{
		`{"a":{"a":1},"b":{"a":2}}`:            `{"a":{"a":1},"b":{"a":2}}`,
		`[{"a":1},{"a":2}]`:                    `[{"a":1},{"a":2}]`,
		`{"a":"a","b":["a","a"]}`:              `{"a":"a","b":["a","a"]}`,
		`{"b":{},"a":[],"c":{"d":[{"e":{}}]}}`: `{"a":[],"b":{},"c":{"d":[{"e":{}}]}}`,
	} {
		if c, err := jsonSlow([]byte(doc)); err != nil || string(c) != want {
			t.Errorf("jsonSlow(%s) = %s, %v; want %s", doc, c, err, want)
		}
	}
}

// TestContentType: the Content-Type under any spelling of its key, the
// canonical one first, then the first in byte order, as HTTP/1.1 sends
// them and a server reads the first.
func TestContentType(t *testing.T) {
	for _, c := range []struct {
		h    http.Header
		want string
	}{
		{http.Header{}, ""},
		{http.Header{"Content-Type": {"a/b"}}, "a/b"},
		{http.Header{"content-type": {"a/b"}}, "a/b"},
		{http.Header{"content-type": {"x/y"}, "Content-Type": {"a/b"}}, "a/b"},
		{http.Header{"content-type": {"x/y"}, "CONTENT-TYPE": {"a/b"}, "Content-type": {"c/d"}}, "a/b"},
		{http.Header{"content-type": {}, "CONTENT-TYPE": {"a/b"}}, "a/b"},
		{http.Header{"Content-Typo": {"a/b"}}, ""},
	} {
		for range 5 { // map order varies
			if got := ContentType(c.h); got != c.want {
				t.Fatalf("ContentType(%v) = %q; want %q", c.h, got, c.want)
			}
		}
	}
}
