package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// The fingerprints stored for a request are pinned: a jar holds them
// across versions, so a change of the bytes hashed would turn every
// resumed operation into a mismatch. All but the third and fourth are
// sha256sum of "METHOD\nURL\n" and the canonical or streamed body.
func TestFingerprintsAreStable(t *testing.T) {
	long := strings.Repeat(`{"a":1}`, 10) // longer than MaxBuffer below: hashed streamed
	cases := []struct {
		name, method, url, ctype, body string
		getBody                        bool // the body has GetBody
		want                           string
	}{
		{"no body", http.MethodPost, "https://api.example.com/v1/charges", "", "", true,
			"45c98a43ec7910d85b94a6e92e8457072647761dd45eb1d706832372f32d0cce"},
		{"json", http.MethodPost, "https://api.example.com/v1/charges", "application/json", `{"b": 2, "a": 1}`, true,
			"a6a708c73b5b041c0f69c6e0c9d4bd23cd12d1cf5b4d961318c7f94ad985d55a"},
		{"json without content type", http.MethodPost, "https://api.example.com/v1/charges?x=1&y=2", "", `{"b": 2, "a": 1}`, true,
			"6936fe196ded7e75ccc7f2599a83c929a296e7c8ad6334e5fb103da761736553"},
		{"form without GetBody", http.MethodPatch, "https://api.example.com/v1/charges/ch_1", "application/x-www-form-urlencoded", "b=2&a=1", false,
			"d5acd1580a08a16ad129e991abe0bf7f259531a53cb6dfe48a695a5214d8f6b5"},
		{"fragment, which net/http does not send", http.MethodPost, "https://api.example.com/v1/charges#top", "application/json", `{"b": 2, "a": 1}`, true,
			"a6a708c73b5b041c0f69c6e0c9d4bd23cd12d1cf5b4d961318c7f94ad985d55a"}, // json's
		{"url longer than 256 bytes", http.MethodPost, "https://api.example.com/v1/" + strings.Repeat("segment/", 40), "application/json", `{"b":2,"a":1}`, true,
			"c6d73f87efe3899935a6e57394f5040f4a3bc5101150507435e3c9f759e59c7a"},
		{"streamed", http.MethodPost, "https://api.example.com/v1/" + strings.Repeat("long/", 20), "application/json", long, true,
			"df7b939af7ff9271f62afe9387dad1496dff278392765f5df004c0ddb07d228b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			jar := &idem.MemoryJar{}
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Body != nil {
					io.Copy(io.Discard, r.Body)
					r.Body.Close()
				}
				return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})
			tr := &idem.Transport{Base: base, Jar: jar, MaxBuffer: 32,
				Methods: []string{http.MethodPost, http.MethodPatch}}
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
				if !c.getBody {
					body = io.MultiReader(body) // no GetBody
				}
			}
			ctx := idem.WithOperation(context.Background(), "op")
			req, err := http.NewRequestWithContext(ctx, c.method, c.url, body)
			if err != nil {
				t.Fatal(err)
			}
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			r, err := jar.Get(context.Background(), "op")
			if err != nil {
				t.Fatal(err)
			}
			if r.Fingerprint != c.want {
				t.Errorf("fingerprint %s; want %s", r.Fingerprint, c.want)
			}
		})
	}
}

// The body that GetBody returns for the fingerprint is closed once read,
// whether it fits in MaxBuffer or is hashed streamed.
func TestFingerprintClosesTheBodyOfGetBody(t *testing.T) {
	for _, size := range []int{16, 100} { // MaxBuffer is 32
		jar := &idem.MemoryJar{}
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		tr := &idem.Transport{Base: base, Jar: jar, MaxBuffer: 32}
		req, err := http.NewRequest(http.MethodPost, "https://api.example.com/v1/charges", nil)
		if err != nil {
			t.Fatal(err)
		}
		var opened, closed int
		req.GetBody = func() (io.ReadCloser, error) {
			opened++
			return &closeCounter{Reader: strings.NewReader(strings.Repeat("x", size)), n: &closed}, nil
		}
		req.Body, _ = req.GetBody()
		req.ContentLength = int64(size)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// One body for the caller's req.Body, one for the fingerprint, one
		// for the attempt, which the base does not close.
		if opened != 3 || closed != 2 {
			t.Errorf("%d-byte body: %d opened, %d closed; want 3 opened, the caller's and the fingerprint's closed", size, opened, closed)
		}
	}
}

type closeCounter struct {
	io.Reader
	n *int
}

func (c *closeCounter) Close() error { *c.n++; return nil }

// A body larger than MaxBuffer is fingerprinted byte for byte. Sent again
// under its name through a Transport whose MaxBuffer holds it (a program
// restarted with a larger one, client's), which canonicalises it, it is
// the same request: sent under the operation's key, not refused.
func TestStreamedFingerprintUnderALargerMaxBuffer(t *testing.T) {
	jar := &idem.MemoryJar{}
	var keys, bodies []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		keys, bodies = append(keys, r.Header.Get(idem.KeyHeader)), append(bodies, string(b))
		code := http.StatusCreated
		if len(keys) == 1 {
			code = http.StatusServiceUnavailable
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	body := `{"b": 2, "a": "` + strings.Repeat("x", 64) + `"}` // not canonical, longer than 32 bytes
	send := func(maxBuffer int64) (*http.Response, error) {
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "op"),
			http.MethodPost, "https://api.example.com/v1/charges", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		tr := &idem.Transport{Base: base, Jar: jar, MaxBuffer: maxBuffer, Policy: retry.Policy{MaxAttempts: 1}}
		return tr.RoundTrip(req)
	}
	if resp, err := send(32); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %v, %v; want the 503, the operation pending", resp, err)
	}
	resp, err := send(0)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("the same call with MaxBuffer 8 MiB: %v, %v; want it sent, 201", resp, err)
	}
	if len(keys) != 2 || keys[1] != keys[0] || bodies[1] != body || bodies[0] != body {
		t.Fatalf("sent %q with bodies %q; want the body twice under one key", keys, bodies)
	}
}

// TestFingerprintAgreesWithTheReferenceServer: a named operation called
// again with a body that the Transport takes for the first's is replayed
// by the reference server, never refused as another request (422, which
// would leave the caller an error for a request it was told is the
// same), and one it refuses locally, the server would have refused too:
// the same bytes under another media type among them.
func TestFingerprintAgreesWithTheReferenceServer(t *testing.T) {
	srv, runs := chargeServer(t)
	tr := &idem.Transport{Base: srv.Client().Transport, Jar: &idem.MemoryJar{}, Policy: retry.Policy{MaxAttempts: 1}}
	const charge = `{"amount":4200,"order_id":"o-1"}`
	for i, c := range []struct {
		ctype, first, againType, again string
		same                           bool // as the Transport compares them
	}{
		{"", charge, "", `{"order_id":"o-1","amount":4200}`, true},
		{"", `{"amount":4200}`, "", "{ \"amount\" : 4200 }\n", true},
		{"application/json", charge, "application/json", `{ "order_id":"o-1", "amount":4200 }`, true},
		{"text/plain", charge, "text/plain", `{"order_id":"o-1","amount":4200}`, false},
		{"", `amount=4200&order_id=o-1`, "", `order_id=o-1&amount=4200`, false},
		// The media type counts, its parameters and its case do not.
		{"application/json", charge, "application/json; charset=utf-8", charge, true},
		{"Application/JSON", charge, "application/json", charge, true},
		{"application/json", charge, "", charge, false},
		{"", charge, "application/json", charge, false},
		{"text/plain", charge, "application/json", charge, false},
		{"application/x-www-form-urlencoded", `amount=4200`, "text/plain; charset=utf-8", `amount=4200`, false},
		// Under a key set in the map as "content-type", which net/http
		// sends as it is and the server reads as Content-Type.
		{"lower:text/plain", charge, "lower:application/json", charge, false},
		{"lower:application/json", charge, "application/json", `{ "order_id":"o-1", "amount":4200 }`, true},
		// A member named twice: no canonical form, the bytes compared.
		{"application/json", `{"amount":4200,"order_id":"A","order_id":null}`, "application/json", `{"amount":4200,"order_id":"B","order_id":null}`, false},
	} {
		ctx := idem.WithOperation(context.Background(), fmt.Sprintf("charge:%d", i))
		send := func(ctype, body string) (*http.Response, error) { return postAs(t, ctx, tr, srv.URL, ctype, body) }
		if resp, err := send(c.ctype, c.first); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("%d: first call: %v, %v", i, resp, err)
		}
		before := runs.Load()
		resp, err := send(c.againType, c.again)
		var me *idem.MismatchError
		switch {
		case c.same && (err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true"):
			t.Errorf("%d: %q (%q) then %q (%q): %v, %v; want the first's answer replayed", i, c.first, c.ctype, c.again, c.againType, resp, err)
		case !c.same && !errors.As(err, &me):
			t.Errorf("%d: %q (%q) then %q (%q): %v, %v; want a *MismatchError, nothing sent", i, c.first, c.ctype, c.again, c.againType, resp, err)
		case runs.Load() != before:
			t.Errorf("%d: %q (%q) then %q (%q): the handler ran again", i, c.first, c.ctype, c.again, c.againType)
		}
	}
}

// TestMediaTypeChangeKeepsAPendingOperation: a pending operation, whose
// first send the server applied but whose answer was lost, called again
// with the same bytes under another media type is refused locally, nothing
// sent: the reference server would answer 422, which marks the operation
// failed although it was charged. It stays pending, and the call with the
// first's type gets the first's answer replayed.
func TestMediaTypeChangeKeepsAPendingOperation(t *testing.T) {
	srv, runs := chargeServer(t)
	var sends atomic.Int64
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := srv.Client().Transport.RoundTrip(req)
		if sends.Add(1) == 1 && err == nil {
			resp.Body.Close() // applied, and its answer lost
			return nil, errors.New("connection reset by peer")
		}
		return resp, err
	})
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}
	ctx := idem.WithOperation(context.Background(), "charge:o-1")
	send := func(ctype string) (*http.Response, error) {
		return postAs(t, ctx, tr, srv.URL, ctype, `{"amount":4200}`)
	}
	if _, err := send("application/json"); !errors.Is(err, idem.ErrPending) || runs.Load() != 1 {
		t.Fatalf("first call: %v, the handler ran %d times; want a *PendingError, the charge applied once", err, runs.Load())
	}
	_, err := send("")
	var me *idem.MismatchError
	if !errors.As(err, &me) || me.StoredType != "application/json" || me.GotType != "" || me.State != idem.StatePending {
		t.Fatalf("the same body without its Content-Type: %v (%+v); want a *MismatchError naming both types, the operation pending", err, me)
	}
	if want := `was first sent with Content-Type "application/json", this request has no Content-Type`; !strings.Contains(err.Error(), want) {
		t.Errorf("%q; want it to say %q", err, want)
	}
	if r, err := jar.Get(context.Background(), "charge:o-1"); err != nil || r.State != idem.StatePending || sends.Load() != 1 {
		t.Fatalf("after the refusal: %v, state %q, %d sends; want the operation pending, nothing sent", err, r.State, sends.Load())
	}
	resp, err := send("application/json; charset=utf-8")
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("the first's type again: %v, %v, the handler ran %d times; want the first's answer replayed", resp, err, runs.Load())
	}
	if r, _ := jar.Get(context.Background(), "charge:o-1"); r.State != idem.StateDone {
		t.Errorf("state %q; want done", r.State)
	}
}

// postAs sends a POST of body to url through tr, with Content-Type ctype
// unless it is "" (set under the key "content-type", not canonical, when
// ctype begins with "lower:"), and closes the answer's body.
func postAs(t *testing.T, ctx context.Context, tr http.RoundTripper, url, ctype, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if lower, ok := strings.CutPrefix(ctype, "lower:"); ok {
		req.Header["content-type"] = []string{lower}
	} else if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

// chargeServer starts the reference middleware over a handler that
// answers 201, and counts its runs.
func chargeServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	runs := new(atomic.Int64)
	srv := httptest.NewServer((&testserver.Middleware{Store: &testserver.MemoryStore{}}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	return srv, runs
}
