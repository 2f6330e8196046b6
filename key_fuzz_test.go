package idem_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// FuzzCallerKey: the Transport accepts a caller's key exactly when the
// reference server would (testserver.ParseKey), except one longer than 255
// characters as sent, quotes included, which a server without the quoted
// form would refuse; and what it accepts goes on the wire as it was given.
func FuzzCallerKey(f *testing.F) {
	for _, v := range []string{
		"order-42", `"order,42"`, `"order\"42"`, `"order\\42"`, `"order\x42"`, `"order-42`,
		`"order-42"x`, `""`, `" order-42"`, "a, b", "clé", "order-42 ", "\"" + strings.Repeat("k", 254) + "\"",
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		var sent []string
		tr := &idem.Transport{
			Jar:    new(idem.MemoryJar),
			Policy: retry.Policy{MaxAttempts: 1},
			Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
				sent = req.Header.Values(idem.KeyHeader)
				return &http.Response{StatusCode: http.StatusCreated, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
			}),
		}
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/charges", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header[idem.KeyHeader] = []string{v}
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		_, serverErr := testserver.ParseKey(v)
		accepted := err == nil
		switch {
		case err != nil && !errors.Is(err, idem.ErrInvalidKey):
			t.Fatalf("RoundTrip with key %q: %v; want a response or ErrInvalidKey", v, err)
		case accepted && serverErr != nil:
			t.Fatalf("the Transport sent key %q, which the server refuses: %v", v, serverErr)
		case !accepted && serverErr == nil && len(v) <= 255:
			t.Fatalf("the Transport refused key %q, which the server accepts: %v", v, err)
		case accepted && (len(sent) != 1 || sent[0] != v):
			t.Fatalf("the Transport sent %q for key %q; want it as given", sent, v)
		}
	})
}
