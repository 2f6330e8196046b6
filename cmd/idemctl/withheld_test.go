package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// withheldJar returns a jar file whose operations charge:w1 and charge:w2
// are pending, each first sent (its connection refused) with an
// Authorization and an X-Api-Key set on the request itself: the jar keeps
// their names, not their values. srv records the credentials of each
// request it gets.
func withheldJar(t *testing.T) (path string, srv *httptest.Server, got func() []http.Header) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []http.Header
	)
	mw := &testserver.Middleware{Store: &testserver.MemoryStore{}}
	srv = httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, http.Header{"Authorization": r.Header.Values("Authorization"), "X-Api-Key": r.Header.Values("X-Api-Key")})
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	got = func() []http.Header {
		mu.Lock()
		defer mu.Unlock()
		return append([]http.Header(nil), seen...)
	}

	ctx := context.Background()
	path = filepath.Join(t.TempDir(), "keys.db")
	refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	c, err := client.New(ctx, path, &client.Options{Base: refused, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"charge:w1", "charge:w2"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"order_id":"`+op+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", secret)
		req.Header.Set("X-Api-Key", secret)
		if _, err := c.Do(ctx, op, req); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("seeding %s: %v; want pending", op, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return path, srv, got
}

// TestResumeRefusesWithoutTheWithheldCredentials: resume does not send an
// operation whose first send carried credentials that the headers given
// (--header, IDEM_HEADER) lack: it names them on stderr, sends nothing,
// leaves the operation as it was, and exits 1, by name and with --all.
// Given them all, it sends them; --without-credentials sends without.
func TestResumeRefusesWithoutTheWithheldCredentials(t *testing.T) {
	path, srv, got := withheldJar(t)
	before, _ := jarState(t, path, "charge:w1")
	for _, c := range []struct {
		name    string
		args    []string
		env     string
		missing string
	}{
		{"no header", []string{"resume", "charge:w1"}, "", "Authorization, X-Api-Key"},
		{"one of two", []string{"resume", "charge:w1", "--header", "Authorization: " + secret, "--host", srv.URL}, "", "X-Api-Key"},
		{"another case", []string{"resume", "charge:w1", "--header", "x-api-key: " + secret, "--host", srv.URL}, "", "Authorization"},
		{"--all", []string{"resume", "--all", "--host", srv.URL}, "X-Api-Key: " + secret, "Authorization"},
	} {
		t.Setenv("IDEM_HEADER", c.env)
		code, out, errOut := idemctl(append([]string{"--jar", path}, c.args...)...)
		lines := strings.Count(errOut, "its first send carried "+c.missing+", which the jar does not keep")
		if code != 1 || out != "" || (c.name != "--all" && lines != 1) || (c.name == "--all" && lines != 2) ||
			!strings.Contains(errOut, "--without-credentials") || strings.Contains(errOut, secret) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit 1, nothing sent, each operation refused for lacking %s",
				c.name, code, out, errOut, c.missing)
		}
	}
	if n := len(got()); n != 0 {
		t.Fatalf("the server got %d requests; want none", n)
	}
	if after, _ := jarState(t, path, "charge:w1"); after.Attempts != before.Attempts || after.State != idem.StatePending || after.Holder != "" {
		t.Fatalf("after the refusals: %+v; want charge:w1 as it was", after)
	}

	t.Setenv("IDEM_HEADER", "X-Api-Key: "+secret)
	code, out, errOut := idemctl("--jar", path, "resume", "charge:w1", "--header", "Authorization: "+secret, "--host", srv.URL)
	if code != 0 || !strings.Contains(out, "charge:w1: 201 Created") || errOut != "" {
		t.Fatalf("resume with both: exit %d, %q, %q; want 201", code, out, errOut)
	}
	if s := got(); len(s) != 1 || s[0].Get("Authorization") != secret || s[0].Get("X-Api-Key") != secret {
		t.Fatalf("the server got %v; want one request with both credentials", s)
	}

	t.Setenv("IDEM_HEADER", "")
	code, out, _ = idemctl("--jar", path, "resume", "charge:w2", "--without-credentials")
	if code != 0 || !strings.Contains(out, "charge:w2: 201 Created") {
		t.Fatalf("resume --without-credentials: exit %d, %q; want 201", code, out)
	}
	if s := got(); len(s) != 2 || s[1].Get("Authorization") != "" || s[1].Get("X-Api-Key") != "" {
		t.Fatalf("the server got %v; want the second request without credentials", s)
	}
}

// TestWithheldHeadersShown: show lists the credentials a first send
// carried, without values, as not stored; export keeps their names with
// no values.
func TestWithheldHeadersShown(t *testing.T) {
	path, _, _ := withheldJar(t)
	code, out, errOut := idemctl("--jar", path, "show", "charge:w1")
	if code != 0 || errOut != "" {
		t.Fatalf("show: exit %d, %s", code, errOut)
	}
	for _, want := range []string{"header: Authorization (not stored)", "header: X-Api-Key (not stored)", "header: Content-Type: application/json"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = idemctl("--jar", path, "export")
	if code != 0 || errOut != "" || !strings.Contains(out, `"Authorization": []`) || !strings.Contains(out, `"X-Api-Key": []`) {
		t.Errorf("export: exit %d, %s\n%s\nwant the credentials' names with no values", code, errOut, out)
	}
	if strings.Contains(out, secret) {
		t.Errorf("export shows a credential:\n%s", out)
	}
}
