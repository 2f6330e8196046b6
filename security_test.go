//go:build unix

package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// tenantServer is a payments server shared by tenants: testserver's
// Middleware on a sqlitestore file, with the given Scope, in front of a
// handler that charges the account named by the credential.
func tenantServer(t *testing.T, scope func(*http.Request) string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	store, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "server.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		var in struct{ Amount int }
		json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(tenantCharge{ID: n, Account: strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), Amount: in.Amount})
	})
	srv := httptest.NewServer((&testserver.Middleware{Store: store, Scope: scope}).Wrap(charge))
	t.Cleanup(srv.Close)
	return srv, &charges
}

type tenantCharge struct {
	ID      int64  `json:"id"`
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

// tenantLeaks has tenant B charge under a key, then tenant A send requests
// under the same key, each through its own idem.Transport and keyjar, to a
// server with the given Scope. It returns every way A saw B's answer: A
// must get its own execution or a 422, never B's charge.
func tenantLeaks(t *testing.T, scope func(*http.Request) string) []string {
	srv, charges := tenantServer(t, scope)
	client := func(account string) func(op, body string) (*http.Response, tenantCharge) {
		jar, err := keyjar.Open(context.Background(), filepath.Join(t.TempDir(), account+".db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { jar.Close() })
		tr := &idem.Transport{Base: srv.Client().Transport, Jar: jar, Policy: retry.Policy{MaxAttempts: 1}}
		return func(op, body string) (*http.Response, tenantCharge) {
			t.Helper()
			req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), op), http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+account)
			req.Header.Set(idem.KeyHeader, "order-42") // keys from order numbers: tenants' keys collide
			resp, err := readAll(tr.RoundTrip(req))
			if err != nil {
				t.Fatal(err)
			}
			var c tenantCharge
			if resp.StatusCode == http.StatusCreated {
				if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
					t.Fatal(err)
				}
			}
			return resp, c
		}
	}
	_, bCharge := client("acct_B")("charge", `{"amount":500}`)
	if bCharge.Account != "acct_B" {
		t.Fatalf("tenant B's own charge: %+v", bCharge)
	}
	// Other tenants, each sending once under B's key: B's very request,
	// the same JSON written otherwise, and another amount.
	var leaks []string
	for i, body := range []string{`{"amount":500}`, `{ "amount": 500 }`, `{"amount":700}`} {
		account := fmt.Sprint("acct_A", i)
		before := charges.Load()
		resp, got := client(account)("charge", body)
		switch {
		case resp.StatusCode == http.StatusUnprocessableEntity:
			// A mismatch: A learns nothing of B's answer.
		case resp.StatusCode != http.StatusCreated:
			t.Fatalf("tenant %s, body %s: status %d", account, body, resp.StatusCode)
		case got.Account != account || got.ID == bCharge.ID:
			leaks = append(leaks, fmt.Sprintf("tenant %s sending %s under B's key got B's charge %+v (replayed %q)", account, body, got, resp.Header.Get("Idempotent-Replayed")))
		case charges.Load() != before+1 || resp.Header.Get("Idempotent-Replayed") != "":
			leaks = append(leaks, fmt.Sprintf("tenant %s sending %s got a replay, not its own execution", account, body))
		}
	}
	return leaks
}

// Tenant A replaying tenant B's key, end to end, gets its own execution or
// a mismatch, never B's response. A server whose Scope ignores the
// credential is caught by the same check.
func TestTenantIsolationEndToEnd(t *testing.T) {
	if leaks := tenantLeaks(t, nil); len(leaks) > 0 {
		t.Errorf("default Scope (CredentialScope):\n%s", strings.Join(leaks, "\n"))
	}
	// Deliberately broken: one key space for every tenant.
	ignoresCredentials := func(*http.Request) string { return "" }
	if leaks := tenantLeaks(t, ignoresCredentials); len(leaks) == 0 {
		t.Error("a Scope that ignores the credential was not caught: the check proves nothing")
	}
}

// Credentials of the secret-scan traffic: every one is sent, none may
// reach a file.
var credentials = map[string]string{
	"Authorization":       "Bearer sk_live_4f1d9a_AUTHORIZATION",
	"Proxy-Authorization": "Basic cHJveHk6c2VjcmV0_PROXY",
	"Cookie":              "session=c00k1e_REQUEST_COOKIE",
	"Set-Cookie":          "session=s3t_c00k1e_RESPONSE", // set by the handler
}

// visible are values that do belong in the files: the scan must find them,
// or it is not reading where the data is.
const (
	visibleHeader = "trace-7d3e1f_VISIBLE" // a request header, in the jar
	visibleAnswer = "receipt-91c2_VISIBLE" // in the saved answer, in the store
)

// secretFiles are the SQLite files of a jar or store, all of them.
func secretFiles(path string) []string { return []string{path, path + "-wal", path + "-shm"} }

// scanFiles returns the names of the credentials found in the files. It
// fails the test when a visible value is not found.
func scanFiles(t *testing.T, paths []string, visible ...string) (found []string) {
	t.Helper()
	var all []byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	for _, v := range visible {
		if !bytes.Contains(all, []byte(v)) {
			t.Fatalf("the scan of %v does not find %q, which is there: it proves nothing", paths, v)
		}
	}
	for name, v := range credentials {
		if bytes.Contains(all, []byte(v)) {
			found = append(found, name)
		}
	}
	return found
}

// secretRig sends calls carrying every credential, from idem.Transport
// with a keyjar file to the Middleware with a sqlitestore file, whose
// handler sets a cookie: a 503 then its retry, a replay, another
// operation, a key reused with another body (422). The files are created
// under umask 0. Then after runs with the files open, and again once they
// are closed.
type secretRig struct {
	wrapJar   func(idem.Jar) idem.Jar                 // nil: the jar as is
	wrapStore func(testserver.Store) testserver.Store // nil: the store as is
	scope     func(*http.Request) string              // Middleware.Scope
	after     func(t *testing.T, jarPath, storePath string)
}

func (rig secretRig) run(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	jarPath, storePath := filepath.Join(dir, "keys.db"), filepath.Join(dir, "server.db")
	old := syscall.Umask(0)
	jar, err := keyjar.Open(ctx, jarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlitestore.Open(ctx, storePath, nil)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	var ts testserver.Store = store
	if rig.wrapStore != nil {
		ts = rig.wrapStore(store)
	}
	var fail atomic.Bool
	fail.Store(true)
	mw := &testserver.Middleware{Store: ts, Scope: rig.scope, OnError: testserver.ReleaseClaim,
		// Listed, and still never saved.
		ReplayHeaders: []string{"Content-Type", "Set-Cookie", "Authorization", "Cookie"}}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: strings.TrimPrefix(credentials["Set-Cookie"], "session=")})
		if fail.Swap(false) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"receipt":%q}`, visibleAnswer)
	})))
	defer srv.Close()
	var j idem.Jar = jar
	if rig.wrapJar != nil {
		j = rig.wrapJar(jar)
	}
	tr := &idem.Transport{Base: srv.Client().Transport, Jar: j,
		Policy: retry.Policy{MaxAttempts: 3, InitialInterval: time.Microsecond, MaxInterval: time.Microsecond}}
	send := func(op, body string) int {
		req, err := http.NewRequestWithContext(idem.WithOperation(ctx, op), http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Trace", visibleHeader)
		for _, name := range []string{"Authorization", "Proxy-Authorization", "Cookie"} {
			req.Header.Set(name, credentials[name])
		}
		resp, err := readAll(tr.RoundTrip(req))
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	codes := []int{send("charge:1", `{"amount":1}`), send("charge:1", `{"amount":1}`), send("charge:2", `{"amount":2}`)}
	if codes[0] != 201 || codes[1] != 201 || codes[2] != 201 {
		t.Fatalf("answers %v; want 201 after a retry, a 201 replay, a 201", codes)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":3}`))
	req.Header.Set("Authorization", credentials["Authorization"])
	req.Header.Set(idem.KeyHeader, mustKey(t, jar, "charge:2"))
	if resp, err := readAll(tr.RoundTrip(req)); err != nil || resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("key reused with another body: %v, %v; want 422", resp, err)
	}
	rig.after(t, jarPath, storePath)
	if err := jar.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	rig.after(t, jarPath, storePath)
}

func mustKey(t *testing.T, jar idem.Jar, op string) string {
	t.Helper()
	r, err := jar.Get(context.Background(), op)
	if err != nil {
		t.Fatal(err)
	}
	return r.Key
}

// credentialsInFiles runs the traffic and returns the credentials found in
// the jar's files and in the store's files, open and closed.
func credentialsInFiles(t *testing.T, rig secretRig) (inJar, inStore map[string]bool) {
	inJar, inStore = map[string]bool{}, map[string]bool{}
	rig.after = func(t *testing.T, jarPath, storePath string) {
		for _, name := range scanFiles(t, secretFiles(jarPath), visibleHeader) {
			inJar[name] = true
		}
		for _, name := range scanFiles(t, secretFiles(storePath), visibleAnswer) {
			inStore[name] = true
		}
	}
	rig.run(t)
	return inJar, inStore
}

// leakyJar is a deliberately broken jar: it writes the caller's cookie
// into the record's note.
type leakyJar struct{ idem.Jar }

func (j leakyJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	r.Note = "debug: cookie " + credentials["Cookie"]
	return j.Jar.Begin(ctx, r)
}

// cookieStore is a deliberately broken store: it saves the Set-Cookie the
// Middleware kept out of the answer.
type cookieStore struct{ testserver.Store }

func (s cookieStore) Save(ctx context.Context, scope, key string, token testserver.Fence, resp testserver.Response) error {
	resp.Header = resp.Header.Clone()
	resp.Header.Set("X-Saved-Cookie", credentials["Set-Cookie"])
	return s.Store.Save(ctx, scope, key, token, resp)
}

// No Authorization, Proxy-Authorization, Cookie or Set-Cookie value is in
// any byte of the jar's or the store's files (database, -wal, -shm), while
// open and once closed. Broken variants prove the scan finds each kind of
// leak.
func TestNoCredentialInFiles(t *testing.T) {
	inJar, inStore := credentialsInFiles(t, secretRig{})
	if len(inJar) > 0 || len(inStore) > 0 {
		t.Errorf("credentials in the jar's files: %v; in the store's files: %v", inJar, inStore)
	}

	t.Run("broken variants are caught", func(t *testing.T) {
		for _, c := range []struct {
			name       string
			rig        secretRig
			jar, store string // the credential the scan must find
		}{
			{"jar writing the cookie", secretRig{wrapJar: func(j idem.Jar) idem.Jar { return leakyJar{j} }}, "Cookie", ""},
			{"store saving Set-Cookie", secretRig{wrapStore: func(s testserver.Store) testserver.Store { return cookieStore{s} }}, "", "Set-Cookie"},
			{"Scope keeping the raw credential", secretRig{scope: func(r *http.Request) string { return r.Header.Get("Authorization") }}, "", "Authorization"},
		} {
			t.Run(c.name, func(t *testing.T) {
				inJar, inStore := credentialsInFiles(t, c.rig)
				if c.jar != "" && !inJar[c.jar] {
					t.Errorf("the scan missed %s in the jar's files (found %v)", c.jar, inJar)
				}
				if c.store != "" && !inStore[c.store] {
					t.Errorf("the scan missed %s in the store's files (found %v)", c.store, inStore)
				}
			})
		}
	})
}

// openToOthers returns the files among paths that group or others may
// access.
func openToOthers(t *testing.T, paths ...string) []string {
	t.Helper()
	var open []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			open = append(open, fmt.Sprintf("%s %v", filepath.Base(p), fi.Mode().Perm()))
		}
	}
	return open
}

// The jar's and the store's files, -wal and -shm included, are 0600 after
// traffic, even when the process umask lets everyone read and write.
func TestFilesAreOwnerOnly(t *testing.T) {
	secretRig{after: func(t *testing.T, jarPath, storePath string) {
		files := append(secretFiles(jarPath), secretFiles(storePath)...)
		var present []string
		for _, p := range files {
			if _, err := os.Stat(p); err == nil {
				present = append(present, p)
			}
		}
		if len(present) < 2 {
			t.Fatalf("only %v exist", present)
		}
		if open := openToOthers(t, present...); len(open) > 0 {
			t.Errorf("files open to group or others: %v", open)
		}
	}}.run(t)

	// The check itself catches a file created with the umask's mode.
	p := filepath.Join(t.TempDir(), "open.db")
	old := syscall.Umask(0)
	err := os.WriteFile(p, nil, 0o666)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	if len(openToOthers(t, p)) != 1 {
		t.Error("a 0666 file was not caught")
	}
}

// countingReader counts the bytes read from an endless source.
type countingReader struct{ n atomic.Int64 }

func (r *countingReader) Read(p []byte) (int, error) {
	clear(p)
	r.n.Add(int64(len(p)))
	return len(p), nil
}

func (r *countingReader) Close() error { return nil }

// Every read of untrusted input in the Transport is bounded: a request
// body without GetBody is read to MaxBuffer+1 bytes at most (8 MiB and a
// byte with MaxBuffer zero), and the body of a response superseded by a
// retry to body.DrainLimit+1. (A body with GetBody is hashed streamed,
// in constant memory: see TestBadInput; the final response's body is the
// caller's to read.) A negative MaxBuffer is the default, as zero is.
func TestTransportReadsAreBounded(t *testing.T) {
	t.Run("request body without GetBody", func(t *testing.T) {
		for _, maxBuffer := range []int64{0, -1} {
			endless := &countingReader{}
			tr := &idem.Transport{Base: &countingBase{}, Jar: &idem.MemoryJar{}, MaxBuffer: maxBuffer}
			req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/v1/uploads", endless)
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, idem.ErrBodyNotRewindable) || endless.n.Load() != 8<<20+1 {
				t.Fatalf("MaxBuffer %d: got %v after reading %d bytes; want ErrBodyNotRewindable after 8 MiB and a byte", maxBuffer, err, endless.n.Load())
			}
		}
	})
	t.Run("superseded response body", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			endless := &countingReader{}
			var attempts atomic.Int64
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if attempts.Add(1) == 1 {
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: endless, Request: r}, nil
				}
				return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: fastPolicy}
			resp, err := post(t, context.Background(), tr, `{}`)
			if err != nil || resp.StatusCode != http.StatusCreated {
				t.Fatalf("got %v, %v; want the retry's 201", resp, err)
			}
			if n := endless.n.Load(); n > body.DrainLimit+1 {
				t.Fatalf("read %d bytes of the superseded answer; want at most DrainLimit+1 (%d)", n, body.DrainLimit+1)
			}
		})
	})
}
