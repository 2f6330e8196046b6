package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

// jarBytes returns the bytes of the jar file and of its -wal and -shm files.
func jarBytes(t *testing.T, path string) []byte {
	t.Helper()
	var all []byte
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

func TestCredentialsNeverReachTheJarFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	const ownAuth = "Bearer sk_test_set_on_the_request_itself"
	s := newShop()
	s.failNext(503)
	c, err := client.New(ctx, path, &client.Options{Base: inProcess{s}, Header: withAuth, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Credentials from Options.Header, on a call that stays pending and is resumed.
	if _, err := c.PostJSON(ctx, "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("got %v; want pending", err)
	}
	resp, err := c.Resume(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// Credentials set on the request by the caller.
	s.failNext(503)
	req, _ := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o2","amount":5}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", ownAuth)
	if _, err := c.Do(ctx, "charge:o2", req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("got %v; want pending", err)
	}

	for i, a := range s.auths {
		if a != authValue {
			t.Fatalf("attempt %d carried Authorization %q; want the credential on every attempt, resume included", i, a)
		}
	}
	for _, when := range []string{"open", "closed"} {
		if when == "closed" {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		b := jarBytes(t, path)
		if !bytes.Contains(b, []byte(s.key(0))) || !bytes.Contains(b, []byte("charge:o2")) {
			t.Fatalf("jar %s: the key and operations are not in the files read; the scan proves nothing", when)
		}
		for _, secret := range []string{authValue, "sk_test_9f8e7d6c5b4a", ownAuth} {
			if bytes.Contains(b, []byte(secret)) {
				t.Fatalf("jar %s: its files contain the credential %q", when, secret)
			}
		}
	}
}

// TestResumeWithARefusedCredential: a resume whose credential the server
// refuses (401: the request was not applied) learns nothing of the first
// attempt's outcome. The operation stays pending, the error says so, and a
// resume with the credential sends it again with its key.
func TestResumeWithARefusedCredential(t *testing.T) {
	ctx := context.Background()
	s, c := pendingCharge(t, nil)
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != authValue {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		s.ServeHTTP(w, r)
	})
	noCredential := func(*http.Request) error { return nil }
	other, err := client.New(ctx, "", &client.Options{Jar: c.Jar(), Base: inProcess{guarded}, Header: noCredential})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.Resume(ctx, "charge:o1")
	var se *client.StatusError
	if !errors.As(err, &se) || se.StatusCode != 401 || !errors.Is(err, idem.ErrPending) {
		t.Fatalf("resume without the credential: %v; want *StatusError 401 matching idem.ErrPending", err)
	}
	if st := state(t, c.Jar(), "charge:o1"); st != idem.StatePending {
		t.Fatalf("state %s after the 401; want pending", st)
	}
	withCredential, err := client.New(ctx, "", &client.Options{Jar: c.Jar(), Base: inProcess{guarded}, Header: withAuth})
	if err != nil {
		t.Fatal(err)
	}
	defer withCredential.Close()
	resp, err := withCredential.Resume(ctx, "charge:o1")
	if err != nil || resp.StatusCode != 201 || s.charges("o1") != 1 || s.key(1) != s.key(0) {
		t.Fatalf("resume with the credential: %v, %v, %d charges; want 201 with the first key, one charge", resp, err, s.charges("o1"))
	}
	resp.Body.Close()
}

// A URL's userinfo is a credential (net/http sends it as Basic auth): a
// *StatusError carries the URL without it, in its field and its message,
// as http.Client's *url.Error does.
func TestStatusErrorHidesUserinfo(t *testing.T) {
	const password = "pw_in_the_url_4711"
	s := newShop()
	s.failNext(400)
	c := newClient(t, s, nil)
	_, err := c.PostJSON(context.Background(), "charge:o1", "http://shop:"+password+"@shop.test/charges", chargeReq{Order: "o1", Amount: 100}, nil)
	var se *client.StatusError
	if !errors.As(err, &se) || se.StatusCode != 400 {
		t.Fatalf("got %v; want a *StatusError 400", err)
	}
	if strings.Contains(err.Error(), password) || strings.Contains(se.URL, password) {
		t.Errorf("the error shows the URL's password: %q (URL %q)", err, se.URL)
	}
	if !strings.Contains(se.URL, "shop.test/charges") {
		t.Errorf("StatusError.URL = %q; want the URL without its password", se.URL)
	}
}

// An API key given as a URL's user name, with an empty password (Stripe's
// "https://sk_live_…:@host") or none ("https://TOKEN@host"), is the
// secret: net/http writes "***" for the empty password in its errors and
// leaves the user name, which a *StatusError's URL, a failed call's
// *url.Error and a URL that does not parse then carried; they show
// "xxxxx" for it.
func TestTokenAsUserNameHidden(t *testing.T) {
	const token = "sk_test_4f1d9a_USERNAME"
	for _, u := range []string{"http://" + token + ":@shop.test/charges", "http://" + token + "@shop.test/charges"} {
		s := newShop()
		s.failNext(400)
		c := newClient(t, s, nil)
		_, err := c.PostJSON(context.Background(), "charge:o1", u, chargeReq{Order: "o1", Amount: 100}, nil)
		var se *client.StatusError
		if !errors.As(err, &se) || se.StatusCode != 400 {
			t.Fatalf("%s: got %v; want a *StatusError 400", u, err)
		}
		if strings.Contains(err.Error(), token) || !strings.Contains(se.URL, "xxxxx") || !strings.Contains(se.URL, "shop.test/charges") {
			t.Errorf("%s: StatusError %q, URL %q; want the user name masked", u, err, se.URL)
		}

		c = newClient(t, s, &client.Options{Policy: retry.Policy{MaxAttempts: 1},
			Base: roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, io.ErrUnexpectedEOF })})
		_, err = c.PostJSON(context.Background(), "charge:o2", u, chargeReq{Order: "o2", Amount: 100}, nil)
		var ue *url.Error
		if !errors.As(err, &ue) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: got %v; want http.Client's *url.Error of the base's error", u, err)
		}
		if strings.Contains(err.Error(), token) || !strings.Contains(ue.URL, "xxxxx@shop.test") {
			t.Errorf("%s: %q (URL %q); want the user name masked", u, err, ue.URL)
		}

		_, err = c.PostJSON(context.Background(), "charge:o3", u+"/%zz", chargeReq{Order: "o3", Amount: 100}, nil)
		if !errors.As(err, &ue) || ue.Op != "parse" {
			t.Fatalf("%s: got %v; want url.Parse's *url.Error", u, err)
		}
		if strings.Contains(err.Error(), token) || !strings.Contains(ue.URL, "xxxxx") {
			t.Errorf("%s: %q (URL %q); want the user name masked", u, err, ue.URL)
		}
	}
}

// A URL that does not parse is PostJSON's error, as http.NewRequest's
// *url.Error, which quotes the URL as given: its password is masked there
// too, and the error is still that *url.Error, naming what is wrong. So is
// a password holding a '/', '?' or '#' not percent-encoded, which url.Parse
// takes for the end of the host, whose port it says is not one, quoting the
// password's start (`invalid port ":pw_a"`), and an escape in the password
// that is not one, which its error quotes.
func TestBadURLErrorHidesUserinfo(t *testing.T) {
	const password = "pw_in_the_url_4711"
	c := newClient(t, newShop(), nil)
	for _, tc := range []struct {
		url    string
		hidden []string // no part of the password may show
	}{
		{"https://shop:" + password + "@shop.test:44x/charges", []string{password}},   // a port that is not a number
		{"https://shop:" + password + "@shop test/charges?a=b", []string{password}},   // a space in the host
		{"https://shop:" + password + "@shop.test/%zz@charges#x", []string{password}}, // an escape that is not one, after the userinfo
		{"https://shop:pw_a_4711/pw_b_4712@shop.test/charges", []string{"pw_a", "pw_b"}},
		{"https://shop:pw_a_4711?pw_b_4712@shop.test/charges", []string{"pw_a", "pw_b"}},
		{"https://shop:pw_a_4711#pw_b_4712@shop.test/charges", []string{"pw_a", "pw_b"}},
		{"https://shop:pw_a_4711%qqpw_b_4712@shop.test/charges", []string{"pw_a", "pw_b", "%qq"}},
	} {
		_, err := c.PostJSON(context.Background(), "charge:o1", tc.url, chargeReq{Order: "o1", Amount: 100}, nil)
		var ue *url.Error
		if !errors.As(err, &ue) || ue.Op != "parse" {
			t.Fatalf("PostJSON(%q): %v; want a *url.Error from parse", tc.url, err)
		}
		for _, h := range tc.hidden {
			if strings.Contains(err.Error(), h) || strings.Contains(ue.URL, h) || !strings.Contains(ue.URL, "shop:xxxxx@") {
				t.Errorf("PostJSON(%q): %q (URL %q); want the URL with its password masked, and no %q", tc.url, err, ue.URL, h)
			}
		}
	}
}

// A server's status line and body reach a *StatusError's message, which a
// program prints or logs to a terminal: their control characters are
// escaped (\x1b), so that a hostile server cannot clear the screen, set
// the window's title or write the clipboard, and so are its bidi format
// characters (\u202e), which would reorder what the terminal shows; the
// fields keep them as sent.
func TestStatusErrorEscapesTheServersControlCharacters(t *testing.T) {
	const status = "400 Bad\x1b]0;title\x07"
	const body = "no\x1b[2J such\x1b]52;c;ZXZpbA==\x07 order\u009b31m \u202eevil\u2069"
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return &http.Response{StatusCode: 400, Status: status, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	})
	c := newClient(t, nil, &client.Options{Base: base})
	_, err := c.PostJSON(context.Background(), "charge:o1", chargesURL, chargeReq{Order: "o1", Amount: 100}, nil)
	var se *client.StatusError
	if !errors.As(err, &se) || se.StatusCode != 400 {
		t.Fatalf("got %v; want a *StatusError 400", err)
	}
	msg := err.Error()
	if i := strings.IndexFunc(msg, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }); i >= 0 {
		t.Errorf("the message holds the control character %U: %q", []rune(msg[i:])[0], msg)
	}
	for _, want := range []string{`400 Bad\x1b]0;title\a`, `no\x1b[2J such\x1b]52;c;ZXZpbA==\a order\u009b31m \u202eevil\u2069`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message %q lacks %s", msg, want)
		}
	}
	if se.Status != status || string(se.Body) != body {
		t.Errorf("Status %q, Body %q; want them as the server sent them", se.Status, se.Body)
	}
}

// TestResumeRefusesWithoutTheWithheldCredentials: a first send that
// carried a credential set on the request itself leaves its name in the
// jar (idem.Record.Withheld). A Client with no Options.Header, which could
// not add it, refuses to resume the operation with a *CredentialsError
// naming it: nothing is sent, counted or leased, by Resume, ResumeJSON or
// ResumeWithBody alike; so does one whose Options.Header does not add it,
// once Header ran. A Client whose Options.Header adds it resumes the
// operation under its key; past the horizon a Client without one marks it
// for reconciliation as it would any other, sending nothing.
func TestResumeRefusesWithoutTheWithheldCredentials(t *testing.T) {
	ctx := context.Background()
	s := newShop()
	s.failNext(503)
	jar := &idem.MemoryJar{}
	bare, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{s}, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	req, _ := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o1","amount":5}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "sk_set_on_the_request")
	if _, err := bare.Do(ctx, "charge:o1", req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want pending", err)
	}
	before, err := jar.Get(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	for name, resume := range map[string]func() (*client.Response, error){
		"Resume":     func() (*client.Response, error) { return bare.Resume(ctx, "charge:o1") },
		"ResumeJSON": func() (*client.Response, error) { return bare.ResumeJSON(ctx, "charge:o1", nil) },
		"ResumeWithBody": func() (*client.Response, error) {
			return bare.ResumeWithBody(ctx, "charge:o1", func() (io.ReadCloser, error) {
				return io.NopCloser(strings.NewReader(`{"order":"o1","amount":5}`)), nil
			})
		},
	} {
		resp, err := resume()
		var ce *client.CredentialsError
		if resp != nil || !errors.As(err, &ce) || !errors.Is(err, client.ErrCredentials) ||
			!slices.Equal(ce.Missing, []string{"X-Api-Key"}) || ce.Op != "charge:o1" || ce.Key != before.Key {
			t.Fatalf("%s: %v, %v; want a *CredentialsError for charge:o1 missing X-Api-Key", name, resp, err)
		}
		if !strings.Contains(err.Error(), "X-Api-Key") || !strings.Contains(err.Error(), "Options.Header") {
			t.Errorf("%s: %q; want the header and the remedy named", name, err)
		}
		after, err := jar.Get(ctx, "charge:o1")
		if err != nil || after.Attempts != before.Attempts || after.Holder != "" || after.State != idem.StatePending || s.sends() != 1 {
			t.Fatalf("%s: after the refusal: %+v, %v, %d sends; want the record as it was, nothing sent", name, after, err, s.sends())
		}
	}

	// Options.Header that adds one of the two: refused before the send,
	// the attempt not counted.
	partial, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{s}, Header: withAuth})
	if err != nil {
		t.Fatal(err)
	}
	defer partial.Close()
	_, err = partial.Resume(ctx, "charge:o1")
	var ce *client.CredentialsError
	if !errors.As(err, &ce) || !slices.Equal(ce.Missing, []string{"X-Api-Key"}) || !errors.Is(err, idem.ErrNotSent) ||
		!errors.Is(err, idem.ErrPending) || !strings.Contains(err.Error(), "Options.Header did not add them") {
		t.Fatalf("resume with an Options.Header that adds Authorization alone: %v; want a *CredentialsError missing X-Api-Key, not sent, pending", err)
	}
	if after, err := jar.Get(ctx, "charge:o1"); err != nil || after.Attempts != before.Attempts || after.Holder != "" ||
		after.State != idem.StatePending || s.sends() != 1 {
		t.Fatalf("after the refusal: %+v, %v, %d sends; want the record as it was, nothing sent", after, err, s.sends())
	}

	adds, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{s}, Header: func(r *http.Request) error {
		r.Header.Set("X-Api-Key", "sk_from_options_header")
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer adds.Close()
	resp, err := adds.Resume(ctx, "charge:o1")
	if err != nil || resp.StatusCode != 201 || s.key(1) != s.key(0) || s.charges("o1") != 1 {
		t.Fatalf("resume with Options.Header: %v, %v; want 201 under the first key", resp, err)
	}
	resp.Body.Close()

	// Past the horizon: reconciled, not refused.
	s.failNext(503)
	req, _ = http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"o2","amount":5}`))
	req.Header.Set("Authorization", "Bearer sk_set_on_the_request")
	if _, err := bare.Do(ctx, "charge:o2", req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call of charge:o2: %v; want pending", err)
	}
	backdate(t, jar, "charge:o2", time.Now().Add(-25*time.Hour))
	sends := s.sends()
	var re *idem.ReconcileError
	if _, err := bare.Resume(ctx, "charge:o2"); !errors.As(err, &re) || errors.Is(err, client.ErrCredentials) || s.sends() != sends {
		t.Fatalf("resume past the horizon: %v; want an *idem.ReconcileError, nothing sent", err)
	}
	if st := state(t, jar, "charge:o2"); st != idem.StateReconcile {
		t.Fatalf("state %s; want reconcile", st)
	}

	// ResumeWithoutCredentials sends it without them, with or without
	// Options.Header.
	for i, header := range []func(*http.Request) error{nil, withAuth} {
		op, order := "charge:lax"+strconv.Itoa(i), "lax"+strconv.Itoa(i)
		s.failNext(503)
		req, _ = http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{"order":"`+order+`","amount":5}`))
		req.Header.Set("X-Api-Key", "sk_set_on_the_request")
		if _, err := bare.Do(ctx, op, req); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("first call of %s: %v; want pending", op, err)
		}
		lax, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{s}, Header: header, ResumeWithoutCredentials: true})
		if err != nil {
			t.Fatal(err)
		}
		defer lax.Close()
		resp, err := lax.Resume(ctx, op)
		if err != nil || resp.StatusCode != 201 || s.charges(order) != 1 {
			t.Fatalf("resume of %s with ResumeWithoutCredentials: %v, %v; want 201", op, resp, err)
		}
		resp.Body.Close()
	}
}

// TestResumeCredentialsCheckedOnItsOwnRequest: a resume answered with a
// 303 sends its GET as any redirect: the credentials the first send
// carried are checked on the resumed request alone, not on the GET that
// Options.Header, which adds them to the POSTs only here, leaves without.
func TestResumeCredentialsCheckedOnItsOwnRequest(t *testing.T) {
	ctx := context.Background()
	var got []string
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.Header.Get("X-Api-Key"))
		switch {
		case len(got) == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.Method == http.MethodPost:
			http.Redirect(w, r, "/charges/1", http.StatusSeeOther)
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	jar := &idem.MemoryJar{}
	bare, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{srv}, Policy: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	req, _ := http.NewRequest(http.MethodPost, chargesURL, strings.NewReader(`{}`))
	req.Header.Set("X-Api-Key", "k")
	if _, err := bare.Do(ctx, "charge:o1", req); !errors.Is(err, idem.ErrPending) {
		t.Fatalf("first call: %v; want pending", err)
	}
	c, err := client.New(ctx, "", &client.Options{Jar: jar, Base: inProcess{srv}, Header: func(r *http.Request) error {
		if r.Method == http.MethodPost {
			r.Header.Set("X-Api-Key", "k")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Resume(ctx, "charge:o1")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("resume: %v, %v (the server got %q); want the GET's 200", resp, err, got)
	}
	resp.Body.Close()
	if want := []string{"POST k", "POST k", "GET "}; !slices.Equal(got, want) {
		t.Fatalf("the server got %q; want %q", got, want)
	}
}

// TestQuerySecretsMaskedInErrors: the values of a URL's query parameters
// whose names say they hold a secret, masked in the record's last error,
// the *idem.PendingError and the log, are masked in the errors Do and
// PostJSON return too: a *StatusError's URL, and the *url.Error that
// http.Client wraps around the others (whose password it masks as ***,
// now xxxxx as everywhere else, with the user name, which may be the
// secret where *** stands for an empty password), for a URL that does not
// parse as well.
func TestQuerySecretsMaskedInErrors(t *testing.T) {
	const query = "?api_key=SEKRIT_1&token=SEKRIT_2&order=o1"
	unavailable := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	failing := roundTripFunc(func(r *http.Request) (*http.Response, error) { r.Body.Close(); return nil, errors.New("no route") })
	for _, tc := range []struct {
		name     string
		c        *client.Client
		url      string
		userinfo string
	}{
		{"503", newClient(t, unavailable, nil), "https://shop:pw_4711@shop.test/charges" + query, "shop:xxxxx@"},
		{"no answer", newClient(t, nil, &client.Options{Base: failing}), "https://shop:pw_4711@shop.test/charges" + query, "xxxxx:xxxxx@"},
		{"a URL that does not parse", newClient(t, unavailable, nil), "https://shop:pw_4711@shop.test/%zz" + query, "shop:xxxxx@"},
	} {
		_, err := tc.c.PostJSON(context.Background(), "charge:"+tc.name, tc.url, chargeReq{Order: "o1", Amount: 100}, nil)
		msg := fmt.Sprint(err)
		if err == nil || strings.Contains(msg, "SEKRIT") || strings.Contains(msg, "pw_4711") ||
			!strings.Contains(msg, "//"+tc.userinfo) || !strings.Contains(msg, "?api_key=xxxxx&token=xxxxx&order=o1") {
			t.Errorf("%s: %q; want the password and the query's secrets masked as xxxxx, the order kept", tc.name, msg)
		}
		var se *client.StatusError
		if errors.As(err, &se) && (strings.Contains(se.URL, "SEKRIT") || strings.Contains(se.URL, "pw_4711")) {
			t.Errorf("%s: StatusError.URL %q", tc.name, se.URL)
		}
	}
}

// TestResumeOfCredentialsOptionsHeaderAdded: credentials that
// Options.Header adds leave no name of their own in the jar; the record
// says that some were added (idem.AddedCredentials). A Client without
// Options.Header refuses to resume such an operation with a
// *CredentialsError, nothing sent; before, it sent the request without
// them, and the reference server, which scopes keys by credential, charged
// the order again. A Client with Options.Header resumes it under its key,
// with what Header adds and no header of the record's name; one with
// ResumeWithoutCredentials sends it without.
func TestResumeOfCredentialsOptionsHeaderAdded(t *testing.T) {
	ctx := context.Background()
	s := newShop()
	jar := &idem.MemoryJar{}
	var sent []http.Header
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r.Header.Clone())
		return inProcess{s}.RoundTrip(r)
	})
	newWith := func(o client.Options) *client.Client {
		o.Jar, o.Base = jar, base
		c, err := client.New(ctx, "", &o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	adds := newWith(client.Options{Header: withAuth, Policy: retry.Policy{MaxAttempts: 1}})
	bare := newWith(client.Options{})
	for _, order := range []string{"o1", "o2"} {
		s.failNext(503)
		if _, err := adds.PostJSON(ctx, "charge:"+order, chargesURL, chargeReq{Order: order, Amount: 5}, nil); !errors.Is(err, idem.ErrPending) {
			t.Fatalf("first call of %s: %v; want pending", order, err)
		}
	}
	before, err := jar.Get(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	if w := before.Withheld(); !slices.Equal(w, []string{idem.AddedCredentials}) {
		t.Fatalf("Withheld() = %q; want [%s]", w, idem.AddedCredentials)
	}

	resp, err := bare.Resume(ctx, "charge:o1")
	var ce *client.CredentialsError
	if resp != nil || !errors.As(err, &ce) || !slices.Equal(ce.Missing, []string{idem.AddedCredentials}) ||
		!strings.Contains(err.Error(), "credentials its Client's Options.Header added") || s.sends() != 2 {
		t.Fatalf("resume through a Client without Options.Header: %v, %v, %d sends, charged %d; want a *CredentialsError naming what Options.Header added, nothing sent",
			resp, err, s.sends(), s.charges("o1"))
	}

	resp, err = adds.Resume(ctx, "charge:o1")
	if err != nil || resp.StatusCode != 201 || s.key(2) != before.Key || s.charges("o1") != 1 {
		t.Fatalf("resume with Options.Header: %v, %v; want 201 under the first key, one charge", resp, err)
	}
	resp.Body.Close()
	if last := sent[len(sent)-1]; last.Get("Authorization") != authValue || slices.ContainsFunc(slices.Collect(maps.Keys(last)), func(k string) bool {
		return strings.EqualFold(k, idem.AddedCredentials)
	}) {
		t.Fatalf("the resume sent %q; want Authorization and no %s entry", last, idem.AddedCredentials)
	}

	lax := newWith(client.Options{ResumeWithoutCredentials: true})
	resp, err = lax.Resume(ctx, "charge:o2")
	if err != nil || resp.StatusCode != 201 || sent[len(sent)-1].Get("Authorization") != "" {
		t.Fatalf("resume with ResumeWithoutCredentials: %v, %v; want it sent without credentials", resp, err)
	}
	resp.Body.Close()
}

// TestCredentialsErrorSaysClientOnce: a CredentialsError says "client:"
// once, as a StateError does: ErrCredentials's text follows its own
// message without the prefix.
func TestCredentialsErrorSaysClientOnce(t *testing.T) {
	err := &client.CredentialsError{Op: "charge:o1", Key: "k", Missing: []string{"X-Api-Key"}}
	if msg := err.Error(); strings.Count(msg, "client:") != 1 || !strings.HasSuffix(msg, "nothing was sent: the resume lacks the credentials of the first send") {
		t.Errorf("%q; want \"client:\" once, at its start, and ending \"nothing was sent: the resume lacks the credentials of the first send\"", msg)
	}
}
