package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
