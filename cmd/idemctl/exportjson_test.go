package main

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// TestExportIsLossless: a jar file stores any bytes in a record's strings
// (an operation named from Latin-1 text, a URL's raw query, a header value
// in obs-text, an abandon's reason), and JSON only UTF-8. export gives
// each string of a record back as it is: one that is not UTF-8 has its
// bytes in base64 beside it, in a field named as its own with _base64
// (header_base64: each name and value), as the help says, and the name
// it gives finds the operation again. A record whose strings are all
// UTF-8 has none of them.
func TestExportIsLossless(t *testing.T) {
	const bad = "caf\xe9 \xff\xfe end"
	plain := idem.Record{Op: "charge:valid", Key: "key-valid", Fingerprint: "fp", State: idem.StateAbandoned}
	rec := idem.Record{State: idem.StatePending, Header: http.Header{"X-Filename": {bad}, "X-\xff": {"v"}}}
	// Every string of a record, whatever fields it gains: a State is one
	// of five words, which every jar checks.
	rv := reflect.ValueOf(&rec).Elem()
	var fields []string
	for i := range rv.NumField() {
		if f := rv.Type().Field(i); f.Type.Kind() == reflect.String && f.Type != reflect.TypeFor[idem.State]() {
			rv.Field(i).SetString(f.Name + ":" + bad)
			fields = append(fields, f.Name)
		}
	}
	now := time.Now()
	recs := []idem.Record{rec, plain}
	for i, r := range recs {
		r.Method, r.URL, r.Created, r.Updated = cmp.Or(r.Method, "POST"), cmp.Or(r.URL, "http://127.0.0.1/v1/charges"), now, now
		recs[i] = r
	}
	path := jarWith(t, recs...)

	code, out, errOut := idemctl("--jar", path, "export", "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("export: exit %d, %s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 2 {
		t.Fatalf("export: %v, %d records:\n%s\nwant 2", err, len(got), out)
	}
	e, valid := got[0], got[1]
	if e["op"] == "charge:valid" {
		e, valid = valid, e
	}
	for name := range valid {
		if strings.HasSuffix(name, "_base64") {
			t.Errorf("the record whose strings are UTF-8 has %s: %v", name, valid[name])
		}
	}
	stored, err := jarState(t, path, rec.Op)
	if err != nil {
		t.Fatal(err)
	}
	ev := reflect.TypeFor[exported]()
	for _, name := range fields {
		f, ok := ev.FieldByName(name)
		if !ok {
			t.Errorf("Record.%s is not exported", name)
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		b64, _ := e[tag+"_base64"].(string)
		if b, err := base64.StdEncoding.DecodeString(b64); err != nil || string(b) != reflect.ValueOf(stored).FieldByName(name).String() {
			t.Errorf("export's %s_base64 = %q (%v); want the bytes of Record.%s in base64", tag, b64, err, name)
		}
	}
	var header http.Header
	if h, err := json.Marshal(e["header_base64"]); err != nil || json.Unmarshal(h, &header) != nil {
		t.Fatalf("header_base64 = %v; want names to lists of values", e["header_base64"])
	}
	decoded := http.Header{}
	for name, vs := range header {
		n, err := base64.StdEncoding.DecodeString(name)
		if err != nil {
			t.Fatalf("header_base64: name %q: %v", name, err)
		}
		for _, v := range vs {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Fatalf("header_base64: value %q: %v", v, err)
			}
			decoded[string(n)] = append(decoded[string(n)], string(b))
		}
	}
	if !reflect.DeepEqual(decoded, stored.Header) {
		t.Errorf("header_base64 decodes to %q; want %q", decoded, stored.Header)
	}

	if _, help, _ := idemctl("help"); !strings.Contains(help, "op_base64") {
		t.Errorf("help does not say where export puts bytes that are not UTF-8:\n%s", help)
	}
	opBase64, _ := e["op_base64"].(string)
	op, _ := base64.StdEncoding.DecodeString(opBase64)
	if code, out, errOut := idemctl("--jar", path, "show", string(op)); code != 0 || !strings.Contains(out, `\xe9`) {
		t.Errorf("show of the name export gave: exit %d, %q, %q; want the operation", code, out, errOut)
	}
}
