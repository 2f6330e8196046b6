package canon

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// Each case is canonicalised by JSON and by jsonSlow, which must agree byte
// for byte and on whether the input is an error; fast says whether the fast
// path must handle the case itself rather than fall back.
var fastCases = []struct {
	in   string
	fast bool
}{
	{smallBody, true},
	{nestedBody, true},
	{`{}`, true},
	{`[]`, true},
	{` { } `, true},
	{"\t[\r\n1 ,\n2 ]\n", true},
	{`{"b":{"d":[],"c":{}},"a":[{"z":0,"y":null}]}`, true},
	{`{"a":1,"a":2}`, false},
	{`{"b":1,"a":2,"b":3}`, false},
	{`{"a":{"x":1,"x":1}}`, false},
	{`{"a ":1,"a":2,"a!":3,"a#":4}`, true},
	{`{"amount":5,"Amount":1000}`, false}, // equal but for case: refused
	{`{"Amount":1000,"amount":5}`, false},
	{`{"a":{"ID":1,"Id":2}}`, false},
	{`{"a":1,"B":2,"ab":3,"AC":4}`, true},
	{"{\"k\":1,\"\u212a\":2}", false}, // the Kelvin sign folds to k: jsonSlow refuses it
	{`{"":1," ":2}`, true},
	{`-0`, true},
	{`1.0e+10`, true},
	{`1E-5`, true},
	{`-12.5e0`, true},
	{`0.000`, true},
	{`1e400`, true},
	{`[-0.0,1e1,2E+2,3e-3]`, true},
	{`01`, false},
	{`1.`, false},
	{`.5`, false},
	{`-`, false},
	{`+1`, false},
	{`1e`, false},
	{`1e+`, false},
	{`--1`, false},
	{`0x10`, false},
	{`true`, true},
	{`false`, true},
	{`null`, true},
	{`tru`, false},
	{`nul`, false},
	{`truex`, false},
	{`[true false]`, false},
	{`"s"`, true},
	{`"a\"b"`, false},
	{`"\u0041"`, false},
	{`"\/"`, false},
	{`"<>&"`, true},
	{"\"caf\u00e9\"", false},
	{"\"a\u2028b\"", false},
	{"\"\x7f\"", false},
	{"\"\xff\"", false},
	{"\"a\tb\"", false},
	{`"unterminated`, false},
	{`{"a":1}}`, false},
	{`{"a":1} {"b":2}`, false},
	{`[1,2]x`, false},
	{`1 2`, false},
	{`[1,]`, false},
	{`[,1]`, false},
	{`{"a":1,}`, false},
	{`{"a" 1}`, false},
	{`{a:1}`, false},
	{`{"a":}`, false},
	{`{"a":1`, false},
	{`[`, false},
	{``, false},
	{`   `, false},
	{"\ufeff{}", false},
	{"{}\x00", false},
	{"[1,\f2]", false},
	{strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), true},
	{strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth), true},
	{strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), false},
	{strings.Repeat("[", 10000) + strings.Repeat("]", 10000), false},
	{strings.Repeat("[", 10001) + strings.Repeat("]", 10001), false},
	{strings.Repeat("[", 20000), false},
}

func TestJSONMatchesSlow(t *testing.T) {
	for _, c := range fastCases {
		name := c.in
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		got, err := JSON([]byte(c.in))
		want, wantErr := jsonSlow([]byte(c.in))
		if !bytes.Equal(got, want) || (err == nil) != (wantErr == nil) {
			t.Errorf("JSON(%q) = %q, %v; jsonSlow = %q, %v", name, got, err, want, wantErr)
		}
		if _, ok := fastJSON([]byte(c.in)); ok != c.fast {
			t.Errorf("fastJSON(%q) ok = %v; want %v", name, ok, c.fast)
		}
	}
}

// The fast path handles the typical body itself and sorts its keys.
func TestFastJSONSmallBody(t *testing.T) {
	got, ok := fastJSON([]byte(smallBody))
	if !ok {
		t.Fatalf("fastJSON(%s) fell back; want the fast path", smallBody)
	}
	if want := `{"amount":1000,"currency":"eur","customer":"cus_8f2a","order":"order-42"}`; string(got) != want {
		t.Fatalf("got %s; want %s", got, want)
	}
}

// A Buffer used again gives what a fresh one gives, whatever it held
// before, and then allocates nothing.
func TestBufferReused(t *testing.T) {
	var b Buffer
	docs := []string{
		`{"z":1,"y":{"x":[3,2,1],"w":"v"},"a":` + strings.Repeat(`{"q":[`, 30) + strings.Repeat("]}", 30) + `}`,
		smallBody,
		`[]`,
		`{"b":1,"a":2}`,
		`{"dup":1,"dup":2}`,
		`not json`,
		smallBody,
	}
	for _, d := range docs {
		want, wantErr := JSON([]byte(d))
		got, err := b.JSON([]byte(d))
		if !bytes.Equal(got, want) || (err == nil) != (wantErr == nil) {
			t.Errorf("Buffer.JSON(%.40q) = %q, %v; JSON = %q, %v", d, got, err, want, wantErr)
		}
		if got, want := b.Body("application/json", []byte(d)), Body("application/json", []byte(d)); !bytes.Equal(got, want) {
			t.Errorf("Buffer.Body(%.40q) = %q; Body = %q", d, got, want)
		}
	}
	in := []byte(smallBody)
	if n := testing.AllocsPerRun(100, func() { b.JSON(in) }); n != 0 {
		t.Errorf("Buffer.JSON of a small body: %v allocations; want 0", n)
	}
	if b.Cap() < 2*len(in) {
		t.Errorf("Cap() = %d; want at least %d", b.Cap(), 2*len(in))
	}
	// An object of many members grows the member list too; Cap counts it,
	// so that a pool can refuse a buffer a large body grew.
	var many Buffer
	doc := "{"
	for i := range 5000 {
		if i > 0 {
			doc += ","
		}
		doc += `"k` + strconv.Itoa(i) + `":1`
	}
	doc += "}"
	if _, err := many.JSON([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	if want := 2*len(doc) + 5000*int(unsafe.Sizeof(member{})); many.Cap() < want {
		t.Errorf("Cap() after 5000 members = %d; want at least %d", many.Cap(), want)
	}
}
