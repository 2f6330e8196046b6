package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

// TestRecordNewRequestResumes: the request NewRequest builds from a pending
// record, sent through a plain Transport, reaches the server under the
// record's key with the first send's method, URL, header and body, and
// its GetBody gives the body again for a retry.
func TestRecordNewRequestResumes(t *testing.T) {
	type seen struct {
		key, method, uri, custom, ctype string
		body                            string
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Header.Get(idem.KeyHeader), r.Method, r.URL.RequestURI(),
			r.Header.Get("X-Custom"), r.Header.Get("Content-Type"), string(b)})
		n := len(got)
		mu.Unlock()
		if n < 3 { // the first send and the resume's first attempt
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	ctx := context.Background()
	jar := &idem.MemoryJar{}

	const body = `{"amount":4200,"note":"résumé"}`
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "charge:o1"),
		http.MethodPatch, srv.URL+"/v1/charges?x=1", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Custom", "kept")
	req.Header.Set("Content-Type", "application/json")
	tr := &idem.Transport{Jar: jar, Methods: []string{http.MethodPatch}, Policy: retry.Policy{MaxAttempts: 1}}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	rec, err := jar.Get(ctx, "charge:o1")
	if err != nil || rec.State != idem.StatePending {
		t.Fatalf("after the first send: %+v, %v; want a pending record", rec, err)
	}

	rreq, err := rec.NewRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if op := idem.Operation(rreq.Context()); op != "charge:o1" || rreq.ContentLength != int64(len(body)) || rreq.GetBody == nil {
		t.Fatalf("NewRequest: operation %q, ContentLength %d, GetBody set %v; want charge:o1, %d, true",
			op, rreq.ContentLength, rreq.GetBody != nil, len(body))
	}
	tr = &idem.Transport{Jar: jar, Methods: []string{http.MethodPatch}, Policy: retry.Policy{InitialInterval: 1, MaxAttempts: 2}}
	resp, err = (&http.Client{Transport: tr}).Do(rreq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("resume: %s; want 201 Created", resp.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	want := seen{rec.Key, http.MethodPatch, "/v1/charges?x=1", "kept", "application/json", body}
	if len(got) != 3 || slices.ContainsFunc(got, func(s seen) bool { return s != want }) {
		t.Fatalf("the server saw %+v; want 3 times %+v", got, want)
	}
	if rec, err = jar.Get(ctx, "charge:o1"); err != nil || rec.State != idem.StateDone {
		t.Fatalf("after the resume: %+v, %v; want done", rec, err)
	}
}

// TestRecordNewRequestWithoutBody: a record that does not hold its body
// gives no request but an error matching ErrBodyNotStored; one whose
// request had no body gives a request without one.
func TestRecordNewRequestWithoutBody(t *testing.T) {
	ctx := context.Background()
	rec := idem.Record{Op: "upload:1", Key: "k", Method: http.MethodPost, URL: chargeURL, BodySize: 9 << 20}
	if req, err := rec.NewRequest(ctx); req != nil || !errors.Is(err, idem.ErrBodyNotStored) || !strings.Contains(err.Error(), "upload:1") {
		t.Fatalf("NewRequest of a record without its body: %v, %v; want nil and ErrBodyNotStored naming the operation", req, err)
	}
	rec.BodySize = 0
	req, err := rec.NewRequest(ctx)
	if err != nil || req.Body != nil || req.ContentLength != 0 || req.Header == nil {
		t.Fatalf("NewRequest of a record with an empty body: %+v, %v; want a request without a body, with a header", req, err)
	}
}

// TestRecordNewRequestNilContext: NewRequest with a nil context returns an
// error naming the operation, as http.NewRequestWithContext does, where
// it panicked in context.WithValue.
func TestRecordNewRequestNilContext(t *testing.T) {
	rec := idem.Record{Op: "charge:o1", Key: "k", Method: http.MethodPost, URL: chargeURL}
	var ctx context.Context // nil
	req, err := rec.NewRequest(ctx)
	if req != nil || err == nil || !strings.Contains(err.Error(), "nil Context") || !strings.Contains(err.Error(), "charge:o1") {
		t.Fatalf("NewRequest(nil): %v, %v; want no request and an error naming the operation and the nil Context", req, err)
	}
}

// TestRecordDropsHostInAnyCase: a Host entry of the caller's whose name is
// not in canonical form ("host", "HOST") is not kept either, whatever the
// request's Host: net/http's HTTP/2 drops it, its HTTP/1.1 sends it as a
// second Host line (it drops "Host" alone), and a record that kept it
// would send it again on resume as an ordinary header.
func TestRecordDropsHostInAnyCase(t *testing.T) {
	ctx := context.Background()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody}, nil
	})}
	for _, tc := range []struct{ op, host, name string }{
		{"lower", "", "host"},
		{"upper", "", "HOST"},
		{"lower-vhost", "api.example.test", "host"},
	} {
		req, err := http.NewRequestWithContext(idem.WithOperation(ctx, tc.op), http.MethodPost, "http://127.0.0.1:1/v1/charges", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tc.host
		req.Header[tc.name] = []string{"ignored.example.test"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		rec, err := jar.Get(ctx, tc.op)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range rec.Header {
			if strings.EqualFold(name, "Host") && (tc.host == "" || name != "Host" || len(v) != 1 || v[0] != tc.host) {
				t.Errorf("%s: the record's header holds %s: %q; want no Host entry of the caller's", tc.op, name, v)
			}
		}
		rreq, err := rec.NewRequest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := tc.host
		if want == "" {
			want = "127.0.0.1:1"
		}
		if _, ok := rreq.Header[tc.name]; ok || rreq.Host != want {
			t.Errorf("%s: the resumed request's Host is %q, its header %v; want Host %q and no %s entry", tc.op, rreq.Host, rreq.Header, want, tc.name)
		}
	}
	// A record written before the filter matched any case holds both.
	old := idem.Record{Op: "old", Method: http.MethodPost, URL: "http://127.0.0.1:1/v1/charges",
		Header: http.Header{"Host": {"api.example.test"}, "host": {"ignored.example.test"}}}
	rreq, err := old.NewRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rreq.Header) != 0 || rreq.Host != "api.example.test" {
		t.Errorf("old record: the resumed request's Host is %q, its header %v; want Host api.example.test and no Host entry", rreq.Host, rreq.Header)
	}
}

// TestRecordNewRequestMasksAStoredPassword: a stored URL that does not
// parse, with a userinfo that a record of an earlier version kept, is
// refused with url.Parse's *url.Error, its password masked (user:xxxxx@) as
// client.PostJSON masks it.
// So is a password holding a '/', '?' or '#' not percent-encoded, where
// url.Parse ends the host (and quotes only what precedes a '#'), and one
// holding an escape that is not one, which its error quotes too.
func TestRecordNewRequestMasksAStoredPassword(t *testing.T) {
	for _, tc := range []struct {
		url    string
		hidden []string // no part of the password may show
	}{
		{"https://ops:s3cretPW@api.example.test/v1/%zz", []string{"s3cretPW"}},
		{"https://ops:pw_a_4711/pw_b_4712@api.example.test/v1", []string{"pw_a", "pw_b"}},
		{"https://ops:pw_a_4711?pw_b_4712@api.example.test/v1", []string{"pw_a", "pw_b"}},
		{"https://ops:pw_a_4711#pw_b_4712@api.example.test/v1", []string{"pw_a", "pw_b"}},
		{"https://ops:pw_a_4711%qqpw_b_4712@api.example.test/v1", []string{"pw_a", "pw_b", "%qq"}},
	} {
		rec := idem.Record{Op: "charge:o1", Key: "k", Method: http.MethodPost, URL: tc.url}
		_, err := rec.NewRequest(context.Background())
		var ue *url.Error
		if !errors.As(err, &ue) || ue.Op != "parse" || !strings.Contains(err.Error(), "ops:xxxxx@") {
			t.Errorf("NewRequest of %q: %v; want url.Parse's *url.Error, the password masked, ops:xxxxx@", tc.url, err)
			continue
		}
		for _, h := range tc.hidden {
			if strings.Contains(err.Error(), h) {
				t.Errorf("NewRequest of %q: %v; want no %q", tc.url, err, h)
			}
		}
	}
}

// TestRecordKeepsHost: a request sent with a Host other than its URL's (a
// virtual host reached by address) is resumed with that Host; a Host entry
// in the caller's header, which net/http does not send, is not kept.
func TestRecordKeepsHost(t *testing.T) {
	var (
		mu    sync.Mutex
		hosts []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx := context.Background()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}
	for _, tc := range []struct {
		op, host, headerHost, want string
	}{
		{"vhost", "api.example.test", "", "api.example.test"},
		{"vhost-and-header", "api.example.test", "ignored.example.test", "api.example.test"},
		{"header-only", "", "ignored.example.test", srv.Listener.Addr().String()},
		{"url-host", srv.Listener.Addr().String(), "", srv.Listener.Addr().String()},
	} {
		mu.Lock()
		hosts = nil
		mu.Unlock()
		req, err := http.NewRequestWithContext(idem.WithOperation(ctx, tc.op), http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tc.host
		if tc.headerHost != "" {
			req.Header["Host"] = []string{tc.headerHost}
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := req.Header["Host"]; tc.headerHost != "" && (len(got) != 1 || got[0] != tc.headerHost) {
			t.Errorf("%s: the caller's header now holds Host %q; want it unchanged", tc.op, got)
		}
		rec, err := jar.Get(ctx, tc.op)
		if err != nil {
			t.Fatal(err)
		}
		rreq, err := rec.NewRequest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rreq.Header["Host"]; ok {
			t.Errorf("%s: the resumed request's header holds Host %q; want it in Request.Host only", tc.op, rreq.Header["Host"])
		}
		resp, err = (&http.Client{Transport: tr}).Do(rreq)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		got := slices.Clone(hosts)
		mu.Unlock()
		if len(got) != 2 || got[0] != tc.want || got[1] != tc.want {
			t.Errorf("%s: the server saw Host %q on the first send and the resume; want %q both times", tc.op, got, tc.want)
		}
	}
}

// TestRecordWithheld: a record names the credentials its first send
// carried, by the headers SecretHeader names that it holds with no values,
// canonical and sorted; NewRequest leaves them out, for the caller to set.
// A header with no values that is no credential (a User-Agent the caller
// silenced), and a credential a record of an earlier version holds with
// its value, are not withheld: NewRequest sends them as stored.
func TestRecordWithheld(t *testing.T) {
	jar := &idem.MemoryJar{}
	var sent http.Header
	tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1}, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r.Header.Clone()
		return &http.Response{StatusCode: 503, Body: http.NoBody, Request: r}, nil
	})}
	ctx := idem.WithOperation(context.Background(), "op")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer sk_live_secret")
	spelt := "x-api-key" // not canonical, as a caller may set it
	req.Header[spelt] = []string{"k"}
	req.Header["User-Agent"] = nil
	req.Header.Set("X-Request-Source", "test")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if sent.Get("Authorization") == "" || len(sent[spelt]) == 0 {
		t.Fatalf("the first send carried %v; want the caller's credentials", sent)
	}
	rec, err := jar.Get(ctx, "op")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Withheld(), []string{"Authorization", "X-Api-Key"}; !slices.Equal(got, want) {
		t.Fatalf("Withheld() = %q (header %v); want %q", got, rec.Header, want)
	}
	rreq, err := rec.NewRequest(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Authorization", spelt} {
		if _, ok := rreq.Header[name]; ok {
			t.Errorf("NewRequest's header holds %s: %v; want it left out for the caller", name, rreq.Header)
		}
	}
	if vs, ok := rreq.Header["User-Agent"]; !ok || len(vs) != 0 || rreq.Header.Get("X-Request-Source") != "test" {
		t.Errorf("NewRequest's header = %v; want the silenced User-Agent and X-Request-Source kept", rreq.Header)
	}

	// A record of an earlier version: its credential kept with its value,
	// which NewRequest sends; nothing is withheld.
	old := rec
	old.Header = http.Header{"Cb-Access-Passphrase": {"p"}, "Authorization": {}, "User-Agent": nil}
	if got, want := old.Withheld(), []string{"Authorization"}; !slices.Equal(got, want) {
		t.Errorf("Withheld() of %v = %q; want %q", old.Header, got, want)
	}
	if rreq, err = old.NewRequest(context.Background()); err != nil || rreq.Header.Get("Cb-Access-Passphrase") != "p" {
		t.Errorf("NewRequest of %v: %v, %v; want the stored passphrase sent", old.Header, rreq, err)
	}
	if got := (idem.Record{}).Withheld(); got != nil {
		t.Errorf("Withheld() of a record without header = %q; want none", got)
	}
}
