package pgjar

import (
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestDecodes asks the server what decodes says of headers: true of those
// the jar writes of UTF-8 names and values, false of those that do not
// decode, and, of thousands of strings near the JSON of a header, true of
// none that hdrjson does not decode: a record it passes is one that
// scanRecord reads.
func TestDecodes(t *testing.T) {
	conn := pgtest.Connect(t, pgtest.DB(t))
	var headers []string
	for _, h := range []http.Header{nil, {}, {"X": nil, "Y": {}},
		{"Content-Type": {"application/json"}, "X-Many": {"1", "", "日本語 \u2028"}, "X-Quoted": {"a \"b\" \\ \x01\x1f\x7f <&>"}}} {
		b, err := hdrjson.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, string(b))
	}
	written := len(headers)
	headers = append(headers, `not json`, `{"X":"a"}`, `{"X":[1]}`, `[]`, `{"X":["\u0000base64:***"]}`, `{"\u0000base64:***":[]}`,
		`{"X":1,"X":["a"]}`)
	refused := len(headers)
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	str := func() string {
		s := `"`
		for range rng.IntN(4) {
			s += pick(`a`, `é`, `\"`, `\\`, `\/`, `\n`, `\u0041`, `\ud800`, `\u0000`, `\x`, "\x01", `"`, ` `)
		}
		return s + `"`
	}
	for range 5000 {
		h := pick(`null`, `[]`, `{}`, `{`)
		if h == `{` {
			for i := range rng.IntN(3) + 1 {
				if i > 0 {
					h += pick(`,`, `, `, ``)
				}
				h += str() + pick(`:`, ` : `) + pick(`null`, `[]`, `1`, `[`+str()+`]`, `[`+str()+`,`+str()+`]`, str())
			}
			h += `}`
		}
		if r := []rune(h); rng.IntN(2) == 0 { // a character off
			i := rng.IntN(len(r))
			h = string(r[:i]) + pick(``, `"`, `,`, `\`, `]`) + string(r[i+1:])
		}
		headers = append(headers, h)
	}
	rows, err := conn.Query(t.Context(), `SELECT `+decodes+` FROM unnest($1::text[]) AS t(header)`, headers)
	if err != nil {
		t.Fatal(err)
	}
	passed := 0
	for i := 0; rows.Next(); i++ {
		var ok bool
		if err := rows.Scan(&ok); err != nil {
			t.Fatal(err)
		}
		_, err := hdrjson.Unmarshal([]byte(headers[i]))
		switch {
		case ok && err != nil:
			t.Errorf("decodes is true of %q, which does not decode: %v", headers[i], err)
		case i < written && !ok:
			t.Errorf("decodes is false of %q, which the jar writes", headers[i])
		case i >= written && i < refused && ok:
			t.Errorf("decodes is true of %q", headers[i])
		case i >= refused && ok:
			passed++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if passed < 500 {
		t.Errorf("decodes is true of %d of the strings near a header's JSON; want 500 or more for the test to tell", passed)
	}
}
