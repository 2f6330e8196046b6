package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
)

// errDialed is the dial of sends: a request that gets there is one whose
// header net/http accepted.
var errDialed = errors.New("dialed")

// sends reports whether net/http sends a request with the header h, or
// refuses it before it dials.
func sends(t *testing.T, h http.Header) bool {
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, errDialed }}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	_, err = tr.RoundTrip(req)
	return errors.Is(err, errDialed)
}

// FuzzHeaderFlag: a --header or IDEM_HEADER line is taken exactly when
// net/http sends the header it names, its name as given (net/http refuses
// a name with a space around it, as net/textproto refuses "X-A : v" in a
// header it reads), and then its name is sent as given and its value
// without the spaces, tabs, CRs and LFs around it, which net/http takes
// off a value it writes; any other line is refused.
func FuzzHeaderFlag(f *testing.F) {
	for _, s := range []string{
		"Authorization: Bearer sk_test", "x-trace:1", " X-Trace :\t1 \r", "Authorization(1): x", "A: b\x01",
		"A: b\rX: y", "X-Trace\x7f: 1", "A: caf\xe9", "garbage", ": v", "A:", "X-A : v", "\tX-A: v",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var hf headerFlag
		got := hf.add(line)
		name, value, ok := cutHeaderLine(line)
		want := ok && name != "" && sends(t, http.Header{name: {value}})
		if got != want {
			t.Fatalf("add(%q) = %v; net/http sends it: %v", line, got, want)
		}
		if !got {
			if len(hf.h) != 0 {
				t.Fatalf("add(%q) refused it, and kept %q", line, hf.h)
			}
			return
		}
		if w := (http.Header{textproto.CanonicalMIMEHeaderKey(name): {value}}); !reflect.DeepEqual(hf.h, w) {
			t.Fatalf("add(%q) kept %q; want %q", line, hf.h, w)
		}
	})
}

// cutHeaderLine splits a header line: the name before the first colon, as
// given, the value after it without the ASCII spaces, tabs, CRs and LFs
// around it, as net/http writes a value.
func cutHeaderLine(line string) (name, value string, ok bool) {
	name, value, ok = strings.Cut(line, ":")
	return name, textproto.TrimString(value), ok
}
