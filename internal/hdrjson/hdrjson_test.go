package hdrjson

import (
	"net/http"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}, "X-Many": {"1", "", "日本語"}},
		{"Content-Disposition": {"attachment; filename=caf\xe9.txt"}, "X-Plain": {"ok"}},
		{"X-Nul": {"\x00base64:not base64", "\x00"}},
		{"X-Invalid": {"\xff\xfe", "a\x80b"}},
		{"X-Caf\xe9": {"1"}, "X-Caf\xe8": {"2"}, "\x00base64:": {"3"}, "\x00base64:WA==": {"5"}, "X-Plain": {"4"}},
	} {
		b, err := Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("Unmarshal(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("%q: stored as %s, read back %q", h, b, got)
		}
	}
}

// TestPlainJSON: a header stored by encoding/json alone, as jars did
// before this package, reads back as it was; so does a header without
// bytes to encode, which Marshal writes as encoding/json does.
func TestPlainJSON(t *testing.T) {
	const plain = `{"Content-Type":["application/json"],"X-Quoted":["a \"b\" \\u0001"]}`
	h, err := Unmarshal([]byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	if want := (http.Header{"Content-Type": {"application/json"}, "X-Quoted": {"a \"b\" \\u0001"}}); !reflect.DeepEqual(h, want) {
		t.Fatalf("read %q; want %q", h, want)
	}
	b, err := Marshal(h)
	if err != nil || string(b) != plain {
		t.Fatalf("Marshal = %s, %v; want %s", b, err, plain)
	}
}

func TestUnmarshalBadBase64(t *testing.T) {
	if _, err := Unmarshal([]byte(`{"X":["\u0000base64:***"]}`)); err == nil {
		t.Fatal("Unmarshal of a value that is not base64 after the marker: got no error")
	}
	if _, err := Unmarshal([]byte(`{"\u0000base64:***":["x"]}`)); err == nil {
		t.Fatal("Unmarshal of a name that is not base64 after the marker: got no error")
	}
}

// FuzzRoundTrip: any header, names and values of any bytes, reads back as
// it was written.
func FuzzRoundTrip(f *testing.F) {
	f.Add("Content-Type", "application/json", "X-Caf\xe9", "na\xefve")
	f.Add("\x00base64:QQ==", "\x00", "A", "\x00base64:QQ==")
	f.Add("", "", "a", "\xff")
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2 string) {
		h := http.Header{}
		h[n1] = append(h[n1], v1)
		h[n2] = append(h[n2], v2)
		b, err := Marshal(h)
		if err != nil {
			t.Fatalf("Marshal(%q): %v", h, err)
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("Unmarshal(%q) of %q: %v", b, h, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("read back %q; wrote %q (as %q)", got, h, b)
		}
	})
}
