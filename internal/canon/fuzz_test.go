package canon

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// jsonSeeds start the JSON fuzz targets.
var jsonSeeds = []string{`{"a":1,"b":[true,null,"x"]}`, `[]`, `"s"`, `1e3`, `{"k":{"z":1,"y":{"x":[1.50]}}}`,
	`{"é":"\u00e9"}`, `{"a":1,"a":2}`, `  {"b" : 2 , "a" : 1 }  `, `{"<":">&"}`}

// Equivalent JSON gets the same canonical form; a changed value a
// different one.
func FuzzJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := JSON(b)
		if err != nil {
			return
		}
		// Idempotent: the canonical form is its own canonical form.
		c2, err := JSON(c)
		if err != nil || !bytes.Equal(c, c2) {
			t.Fatalf("JSON(JSON(%q)) = %q, %v; want %q", b, c2, err, c)
		}
		// Re-indented (whitespace changed): the same canonical form.
		var ind bytes.Buffer
		if err := json.Indent(&ind, b, " ", "\t"); err == nil {
			c3, err := JSON(ind.Bytes())
			if err != nil || !bytes.Equal(c, c3) {
				t.Fatalf("indented %q: got %q, %v; want %q", b, c3, err, c)
			}
		}
		// A changed value: wrapping the document in an array with an extra
		// element must change the canonical form.
		changed, err := JSON(append(append([]byte("["), b...), []byte(",0]")...))
		if err != nil {
			t.Fatalf("wrapping valid %q made it invalid: %v", b, err)
		}
		if bytes.Equal(changed, c) {
			t.Fatalf("changed document %q has the same canonical form", b)
		}
	})
}

// Changing one number in an object changes the fingerprint input.
func FuzzJSONValueChange(f *testing.F) {
	f.Add("amount", int64(100), int64(101))
	f.Add("", int64(0), int64(-1))
	f.Fuzz(func(t *testing.T, k string, v1, v2 int64) {
		if strings.EqualFold(k, "currency") { // the same key, or one JSON refuses beside it
			return
		}
		a, err1 := json.Marshal(map[string]any{k: v1, "currency": "eur"})
		b, err2 := json.Marshal(map[string]any{"currency": "eur", k: v2})
		if err1 != nil || err2 != nil {
			return
		}
		ca, err1 := JSON(a)
		cb, err2 := JSON(b)
		if err1 != nil || err2 != nil {
			t.Fatalf("valid JSON refused: %v %v", err1, err2)
		}
		if (v1 == v2) != bytes.Equal(ca, cb) {
			t.Fatalf("%s=%d vs %s=%d: canonical %q and %q; want equal exactly when the values are", k, v1, k, v2, ca, cb)
		}
	})
}

// The fast path produces exactly the bytes of encoding/json, and fails
// exactly when it does.
func FuzzJSONFast(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	for _, c := range fastCases {
		if len(c.in) < 1000 {
			f.Add([]byte(c.in))
		}
	}
	f.Add([]byte("[" + strings.Repeat(`{"b":[`, 40) + strings.Repeat("]}", 40) + "]"))
	var reused Buffer // carries the space of every earlier input into the next
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := JSON(b)
		want, wantErr := jsonSlow(b)
		if !bytes.Equal(got, want) || (err == nil) != (wantErr == nil) {
			t.Fatalf("JSON(%q) = %q, %v; jsonSlow = %q, %v", b, got, err, want, wantErr)
		}
		got, err = reused.JSON(b)
		if !bytes.Equal(got, want) || (err == nil) != (wantErr == nil) {
			t.Fatalf("Buffer.JSON(%q) = %q, %v; jsonSlow = %q, %v", b, got, err, want, wantErr)
		}
	})
}
