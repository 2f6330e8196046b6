package idem_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/body"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/testserver"
)

// TestNilBodyResponseWithAttemptTimeout: a base transport that answers
// with a nil Body (http.Client tolerates it, filling in an empty one) is
// read as an empty body, with an AttemptTimeout as without.
func TestNilBodyResponseWithAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy,
			Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				n++
				if n == 1 {
					return &http.Response{StatusCode: 503, Header: http.Header{}}, nil
				}
				return &http.Response{StatusCode: 204, Header: http.Header{}}, nil
			})}
		tr.Policy.AttemptTimeout = 10 * time.Second
		var (
			resp     *http.Response
			err      error
			panicked any
		)
		func() {
			defer func() { panicked = recover() }()
			resp, err = post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
			if err == nil {
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		}()
		if panicked != nil {
			t.Fatalf("RoundTrip (or reading its answer) panicked: %v", panicked)
		}
		if err != nil || resp.StatusCode != 204 {
			t.Fatalf("got %v, %v; want the 204", resp, err)
		}
	})
}

// TestReconcileSetWhileWaiting: an operation marked StateReconcile (by a
// process whose Horizon is shorter) while this call waits for its lease is
// not sent: a *ReconcileError.
func TestReconcileSetWhileWaiting(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Policy.MaxElapsed = time.Minute
		ctx := idem.WithOperation(context.Background(), "op")
		heldElsewhere(t, jar, fp)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(2 * time.Second) // the call waits for the lease meanwhile
			// The holder (another process, Horizon shorter) marks it reconcile.
			if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: idem.StateReconcile,
				Note: "past the horizon", Release: true}); err != nil {
				t.Error(err)
			}
		})
		_, err := post(t, ctx, tr, `{}`)
		wg.Wait()
		r, _ := jar.Get(ctx, "op")
		if rec.attempts() != 0 || !errors.Is(err, idem.ErrReconcile) {
			t.Fatalf("got %v after %d sends, record now %s; want *ReconcileError and nothing sent: the SDK must not send a reconcile operation again",
				err, rec.attempts(), r.State)
		}
	})
}

// slowBeginJar's Begin succeeds (the record is written) but returns after
// the caller's deadline passed, as a commit slow to be acknowledged may.
type slowBeginJar struct{ *idem.MemoryJar }

func (j slowBeginJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	rec, created, err := j.MemoryJar.Begin(ctx, r)
	time.Sleep(2 * time.Second)
	return rec, created, err
}

// TestAttemptNotSentIsNotCounted: Begin counts a new operation's first
// attempt ahead of it; when the caller's context ends between Begin and the
// send, nothing goes out, and the record counts no attempt either.
func TestAttemptNotSentIsNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mj := newTransport(t, status(201))
		tr.Jar = slowBeginJar{mj}
		ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op"), time.Second)
		defer cancel()
		_, err := post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) {
			t.Fatalf("got %v; want a *PendingError", err)
		}
		r, _ := mj.Get(context.Background(), "op")
		if r.Attempts != rec.attempts() || r.Attempts != pe.Attempts {
			t.Fatalf("record Attempts %d, PendingError.Attempts %d, attempts sent %d; want them equal",
				r.Attempts, pe.Attempts, rec.attempts())
		}
	})
}

// TestReconcileAfterWaitKeepsKnownStatus: a call that waited for another
// holder's lease while that holder got the final answer (done, 201), and
// then finds the operation past its horizon, keeps the known outcome: done,
// with its 201, which the ReconcileError reports too.
func TestReconcileAfterWaitKeepsKnownStatus(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Policy = retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 100 * time.Millisecond,
			MaxElapsed: time.Minute, Horizon: 3 * time.Second}
		ctx := idem.WithOperation(context.Background(), "op")
		heldElsewhere(t, jar, fp)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(4 * time.Second)
			// The holder got its final answer.
			if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: idem.StateDone,
				LastStatus: 201, Release: true}); err != nil {
				t.Error(err)
			}
		})
		_, err := post(t, ctx, tr, `{}`)
		wg.Wait()
		var re *idem.ReconcileError
		if !errors.As(err, &re) || rec.attempts() != 0 {
			t.Fatalf("got %v after %d sends; want *ReconcileError, nothing sent", err, rec.attempts())
		}
		r, _ := jar.Get(ctx, "op")
		if r.State != idem.StateDone || r.LastStatus != 201 || re.LastStatus != 201 {
			t.Fatalf("record %s with LastStatus %d, ReconcileError.LastStatus %d; want done with 201 kept (its known outcome)",
				r.State, r.LastStatus, re.LastStatus)
		}
		// Abandon refuses a done operation: the error does not advise it.
		if re.State != idem.StateDone || strings.Contains(re.Error(), "abandon") || !strings.Contains(re.Error(), "forget") {
			t.Errorf("ReconcileError of state %q: %q; want done, advising forget and not abandon", re.State, re.Error())
		}
	})
}

// TestMismatchAfterWaitGotKey: a call without a key of its own that
// waited for a lease while the operation was abandoned and begun again gets
// a *MismatchError whose GotKey is empty: the caller set none.
func TestMismatchAfterWaitGotKey(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	synctest.Test(t, func(t *testing.T) {
		tr, _, jar := newTransport(t, status(201))
		tr.Policy.MaxElapsed = time.Minute
		ctx := idem.WithOperation(context.Background(), "op")
		heldElsewhere(t, jar, fp)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(2 * time.Second)
			_, _ = jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: idem.StateAbandoned, Release: true})
			_, _, _ = jar.Begin(ctx, idem.Record{Op: "op", Key: "k2", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
				Created: time.Now(), Holder: "new", LeaseUntil: time.Now().Add(time.Hour)})
		})
		_, err := post(t, ctx, tr, `{}`) // no Idempotency-Key set by the caller
		wg.Wait()
		var me *idem.MismatchError
		if !errors.As(err, &me) {
			t.Fatalf("got %v; want a *MismatchError", err)
		}
		if me.GotKey != "" {
			t.Fatalf("GotKey %q (message: %q); want \"\": the caller set no Idempotency-Key", me.GotKey, me.Error())
		}
		// The request is the one stored: the message must not blame it.
		if msg := me.Error(); strings.Contains(msg, "different method, URL or body") || !strings.Contains(msg, `"k2"`) {
			t.Fatalf("message %q; want it to say that the operation was begun again under key \"k2\", not that the request differs", msg)
		}
	})
}

// TestMismatchAfterWaitSameKey: a call that carries its own key and waited
// for a lease while the operation was abandoned and begun again, under the
// same key but with another body, sends nothing: its request is no longer
// the operation's, and sent it would claim the key with the abandoned
// request's parameters.
func TestMismatchAfterWaitSameKey(t *testing.T) {
	fp, other := fingerprintOf(t, `{}`), fingerprintOf(t, `{"amount":2}`)
	synctest.Test(t, func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		tr.Policy.MaxElapsed = time.Minute
		ctx := idem.WithOperation(context.Background(), "op")
		heldElsewhere(t, jar, fp) // key k1
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(2 * time.Second) // the call waits for the lease meanwhile
			if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), State: idem.StateAbandoned, Release: true}); err != nil {
				t.Error(err)
			}
			if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: other, Header: jsonHeader(), State: idem.StatePending,
				Created: time.Now(), Updated: time.Now()}); err != nil { // no lease: free to take
				t.Error(err)
			}
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.KeyHeader, "k1")
		_, err = tr.RoundTrip(req)
		wg.Wait()
		var me *idem.MismatchError
		if !errors.As(err, &me) || me.Key != "k1" || me.Stored != other || me.Got != fp || rec.attempts() != 0 {
			t.Fatalf("got %v after %d sends; want a *MismatchError naming the stored fingerprint, nothing sent", err, rec.attempts())
		}
	})
}

// TestFarRetryAfterWithKeyjar: a Retry-After far beyond what keyjar can
// store (a date in the year 9999) is recorded as the horizon, and the
// call's final write, the lease's release and the 503 included, is kept.
func TestFarRetryAfterWithKeyjar(t *testing.T) {
	jar, err := keyjar.Open(t.Context(), filepath.Join(t.TempDir(), "jar.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer jar.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr := &idem.Transport{Jar: jar, Base: srv.Client().Transport, Policy: retry.Policy{MaxAttempts: 1}}
	ctx := idem.WithOperation(context.Background(), "op")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("status %d; want the 503", resp.StatusCode)
	}
	r, err := jar.Get(ctx, "op")
	if err != nil {
		t.Fatal(err)
	}
	if r.Holder != "" || r.LastStatus != 503 || r.NextAttempt.IsZero() {
		t.Fatalf("record after the call: holder %q (lease until %v), LastStatus %d, NextAttempt %v; want the lease released, 503 and a NextAttempt recorded",
			r.Holder, r.LeaseUntil, r.LastStatus, r.NextAttempt)
	}
}

// TestFragmentIsNotPartOfTheRequest: net/http sends no #fragment, so
// requests that differ only in theirs send the same bytes: one operation
// under one key, its record's URL without a fragment.
func TestFragmentIsNotPartOfTheRequest(t *testing.T) {
	jar := &idem.MemoryJar{}
	var keys []string
	tr := &idem.Transport{Jar: jar, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		keys = append(keys, r.Header.Get(idem.KeyHeader))
		return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})}
	ctx := idem.WithOperation(context.Background(), "op")
	for _, u := range []string{chargeURL + "#a", chargeURL + "#b", chargeURL} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s after %q: %v; want the same operation sent again", u, keys, err)
		}
		resp.Body.Close()
	}
	if len(keys) != 3 || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Fatalf("keys sent %q; want one key three times", keys)
	}
	r, err := jar.Get(ctx, "op")
	if err != nil {
		t.Fatal(err)
	}
	if r.URL != chargeURL || r.Fingerprint != fingerprintOf(t, `{}`) {
		t.Fatalf("record's URL %q, fingerprint %s; want %q and the fingerprint without the fragment", r.URL, r.Fingerprint, chargeURL)
	}
}

// wantSentWithK1 sends req, the request of a record stored under the key
// k1, and checks that it was sent once, with that key.
func wantSentWithK1(t *testing.T, tr *idem.Transport, rec *recorder, req *http.Request) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the request of the record: %v (sent %d); want it resumed with key k1", err, rec.attempts())
	}
	resp.Body.Close()
	if rec.attempts() != 1 || rec.keys[0] != "k1" {
		t.Fatalf("keys sent %q; want k1 once", rec.keys)
	}
}

// TestFingerprintsOfEarlierRecords: versions that stored and fingerprinted
// a URL's fragment, and those before 6592bb2 its userinfo too, left
// operations pending under those fingerprints: called again with the same
// URL, or resumed from the record, each is the same request.
func TestFingerprintsOfEarlierRecords(t *testing.T) {
	fp := func(url string) string { // method, URL as it was hashed, canonical body
		s := sha256.Sum256([]byte("POST\n" + url + "\n{}"))
		return hex.EncodeToString(s[:])
	}
	// The formula matches the current fingerprint for a URL without either.
	if got := fingerprintOf(t, `{}`); got != fp(chargeURL) {
		t.Fatalf("fingerprint formula: %s != %s", got, fp(chargeURL))
	}
	const (
		withFragment = chargeURL + "#top"
		withUser     = "https://user:pw@api.example.test/v1/charges"
		withBoth     = "https://user:pw@api.example.test/v1/charges#top"
	)
	cases := []struct{ name, storedURL, storedFP, callURL string }{
		{"userinfo", withUser, fp(withUser), withUser},
		{"fragment, called again", withFragment, fp(withFragment), withFragment},
		{"userinfo and fragment, as stored since userinfo was left out", withFragment, fp(withFragment), withBoth},
		{"userinfo and fragment, as stored before", withBoth, fp(withBoth), withBoth},
		{"resumed from the record", withFragment, fp(withFragment), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, rec, jar := newTransport(t, status(201))
			mt := tr.Base
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				r2 := r.Clone(r.Context())
				r2.URL.User, r2.URL.Fragment = nil, ""
				return mt.RoundTrip(r2)
			})
			ctx := idem.WithOperation(context.Background(), "op")
			now := time.Now()
			r, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: c.storedFP, State: idem.StatePending,
				Method: "POST", URL: c.storedURL, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`), BodySize: 2,
				Created: now, Updated: now, Attempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			var req *http.Request
			if c.callURL == "" {
				req, err = r.NewRequest(ctx)
			} else {
				req, err = http.NewRequestWithContext(ctx, http.MethodPost, c.callURL, strings.NewReader(`{}`))
				req.Header.Set("Content-Type", "application/json")
			}
			if err != nil {
				t.Fatal(err)
			}
			wantSentWithK1(t, tr, rec, req)
		})
	}
}

// TestBodyFingerprintsOfEarlierRecords: versions that canonicalised a JSON
// body with a key twice, bytes that are not UTF-8 or half a surrogate pair,
// and that read its type from "Content-Type" alone, left operations pending
// under fingerprints this version does not make. The same request, its
// method, URL and body byte for byte, resumed from the record or called
// again, is sent with the record's key; another body is still refused, one
// whose earlier canonical form is the record's body's included.
func TestBodyFingerprintsOfEarlierRecords(t *testing.T) {
	earlier := func(body string) string { // method, URL, body as earlier versions canonicalised it
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256([]byte("POST\n" + chargeURL + "\n" + strings.TrimSuffix(b.String(), "\n")))
		return hex.EncodeToString(s[:])
	}
	json := http.Header{"Content-Type": {"application/json"}}
	cases := []struct {
		name   string
		header http.Header
		body   string
	}{
		{"a key twice", json, `{"a":1,"a":2}`},
		{"a key twice but for case", json, `{"a":1,"A":2}`},
		{"not UTF-8", json, "{\"a\":\"\xff\"}"},
		{"half a surrogate pair", json, `{"a":"\ud800"}`},
		{"its type under a key not canonical", http.Header{"content-type": {"text/plain"}}, `{"b": 1, "a": 2}`},
	}
	for _, c := range cases {
		for _, resumed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/resumed=%v", c.name, resumed), func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(201))
				ctx := idem.WithOperation(context.Background(), "op")
				now := time.Now()
				r, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: earlier(c.body), State: idem.StatePending,
					Method: "POST", URL: chargeURL, Header: c.header, Body: []byte(c.body), BodySize: int64(len(c.body)),
					Created: now, Updated: now, Attempts: 1})
				if err != nil {
					t.Fatal(err)
				}
				var req *http.Request
				if resumed {
					req, err = r.NewRequest(ctx)
				} else {
					req, err = http.NewRequestWithContext(ctx, http.MethodPost, chargeURL, strings.NewReader(c.body))
					for k, v := range c.header {
						req.Header[k] = v
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				wantSentWithK1(t, tr, rec, req)
			})
		}
	}
	t.Run("another body of the same earlier form", func(t *testing.T) {
		tr, rec, jar := newTransport(t, status(201))
		ctx := idem.WithOperation(context.Background(), "op")
		now := time.Now()
		if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: fingerprintOf(t, `{"a":1,"a":2}`), State: idem.StatePending,
			Method: "POST", URL: chargeURL, Header: json, Body: []byte(`{"a":1,"a":2}`), BodySize: 13,
			Created: now, Updated: now, Attempts: 1}); err != nil {
			t.Fatal(err)
		}
		_, err := post(t, ctx, tr, `{"a":2}`)
		var mm *idem.MismatchError
		if !errors.As(err, &mm) || rec.attempts() != 0 {
			t.Fatalf("got %v, sent %d; want a *MismatchError, nothing sent", err, rec.attempts())
		}
	})
}

// TestBudgetRefilledByEveryFinalAnswer: a final answer gives the call's
// retry cost back to the Budget, a 422 as a 400.
func TestBudgetRefilledByEveryFinalAnswer(t *testing.T) {
	for _, last := range []int{400, 422} {
		t.Run(fmt.Sprint(last), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, _, _ := newTransport(t, status(503), status(last))
				tr.Budget = &retry.Budget{Capacity: 10, RetryCost: 5}
				resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
				if err != nil || resp.StatusCode != last {
					t.Fatalf("got %v, %v", resp, err)
				}
				if got := tr.Budget.Available(); got != 10 {
					t.Fatalf("after 503 then %d: %d tokens; want the retry's 5 given back (10)", last, got)
				}
			})
		})
	}
}

// stalledBody's Read blocks until Close, as a connection's does when the
// server stops sending in the middle of a body.
type stalledBody struct {
	closed chan struct{}
	once   sync.Once
}

func (s *stalledBody) Read([]byte) (int, error) { <-s.closed; return 0, errors.New("closed") }
func (s *stalledBody) Close() error             { s.once.Do(func() { close(s.closed) }); return nil }

// TestStalledRetryableBody: a retryable answer whose body stalls is given
// up on (closed) after a while, and the call goes on to its retry.
func TestStalledRetryableBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: fastPolicy,
			Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if n++; n == 1 {
					return &http.Response{StatusCode: 503, Header: http.Header{}, Body: &stalledBody{closed: make(chan struct{})}, Request: r}, nil
				}
				return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})}
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil || resp.StatusCode != 201 || n != 2 {
			t.Fatalf("got %v, %v after %d attempts; want the retry's 201", resp, err, n)
		}
	})
}

// TestDefaultLease: a zero (or negative) Lease is one minute, or twice the attempt
// timeout when that is longer; an attempt timeout near the largest
// duration keeps the lease above it rather than overflowing into the
// one-minute floor, which would let another holder send while this
// attempt may still be running. A Lease that is set is that.
func TestDefaultLease(t *testing.T) {
	for _, tt := range []struct {
		name           string
		lease, attempt time.Duration
		want           time.Duration
	}{
		{"zero", 0, 0, time.Minute},
		{"short attempts", 0, 10 * time.Second, time.Minute},
		{"long attempts", 0, 45 * time.Second, 90 * time.Second},
		{"endless attempts", 0, math.MaxInt64, 100 * 365 * 24 * time.Hour},
		{"set", 5 * time.Second, 45 * time.Second, 5 * time.Second},
		{"negative", -time.Second, 0, time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				jar := &idem.MemoryJar{}
				var lease time.Duration
				tr := &idem.Transport{Jar: jar, Lease: tt.lease, Policy: retry.Policy{AttemptTimeout: tt.attempt},
					Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
						rec, err := jar.Get(r.Context(), idem.Operation(r.Context()))
						if err != nil {
							return nil, err
						}
						lease = time.Until(rec.LeaseUntil) // time stands still in the bubble
						return &http.Response{StatusCode: 201, Body: http.NoBody, Request: r}, nil
					})}
				resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if lease != tt.want {
					t.Fatalf("lease during the attempt %v; want %v", lease, tt.want)
				}
			})
		})
	}
}

// TestAttemptTimeoutFiringAsHeadersArrive: an answer that the base
// transport returns after the attempt's timeout fired (its headers raced
// the timer, as they can in http.Transport) has a body tied to a context
// already cancelled, which nobody can read. The attempt counts as timed
// out and is sent again with the same key, and the answer that comes back
// is readable.
func TestAttemptTimeoutFiringAsHeadersArrive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var keys []string
		tr := &idem.Transport{Jar: &idem.MemoryJar{}, Policy: retry.Policy{AttemptTimeout: time.Second, InitialInterval: time.Millisecond}}
		tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			keys = append(keys, r.Header.Get(idem.KeyHeader))
			if len(keys) == 1 {
				time.Sleep(2 * time.Second) // the timer fires; the answer comes all the same
			}
			return &http.Response{StatusCode: 201, Body: io.NopCloser(&ctxReader{ctx: r.Context(), data: "ok"}), Header: http.Header{}}, nil
		})
		resp, err := post(t, context.Background(), tr, `{}`)
		if err != nil {
			t.Fatalf("got %v; want the 201", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "ok" {
			t.Fatalf("body %q, %v after %d attempts; want ok", b, err, len(keys))
		}
		if len(keys) != 2 || keys[1] != keys[0] {
			t.Fatalf("keys %q; want 2 attempts with one key", keys)
		}
	})
}

// TestRedirectOfANamedOperation: an http.Client that follows a 307 sends
// the POST again through the Transport, to another URL: a named operation
// refuses it with a *MismatchError that names the redirect and
// CheckRedirect, nothing reaches the new URL, and the 307 is the
// operation's recorded outcome.
func TestRedirectOfANamedOperation(t *testing.T) {
	var moved, target int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			moved++
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
			return
		}
		target++
	}))
	defer srv.Close()
	jar := &idem.MemoryJar{}
	hc := &http.Client{Transport: &idem.Transport{Jar: jar, Policy: fastPolicy}}
	ctx := idem.WithOperation(context.Background(), "op")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/old", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = hc.Do(req)
	var me *idem.MismatchError
	if !errors.As(err, &me) || me.Op != "op" || moved != 1 || target != 0 {
		t.Fatalf("got %v, %d requests to /old, %d to /new; want a *MismatchError, 1 and 0", err, moved, target)
	}
	// Its message names the redirect and the fix, not only a new name.
	if msg := err.Error(); !strings.Contains(msg, "307 redirect of POST "+srv.URL+"/old") || !strings.Contains(msg, "CheckRedirect") {
		t.Fatalf("error %q; want it to name the 307 redirect of POST %s/old and CheckRedirect", msg, srv.URL)
	} else if strings.Contains(msg, "new operation name") {
		t.Errorf("error %q advises a new operation name, which is not the fix for a redirect", msg)
	}
	if rec, err := jar.Get(ctx, "op"); err != nil || rec.State != idem.StateDone || rec.LastStatus != http.StatusTemporaryRedirect {
		t.Fatalf("record %+v, %v; want done with 307", rec, err)
	}

	// With CheckRedirect stopping at it, the 307 is the answer.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	req, err = http.NewRequestWithContext(idem.WithOperation(ctx, "op2"), http.MethodPost, srv.URL+"/old", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("got %v, %v; want the 307", resp, err)
	}
	resp.Body.Close()
}

// TestStoredBody: the record keeps a body of at most MaxStoredBody bytes
// (64 KiB when zero), none when MaxStoredBody is negative, and none larger
// than MaxBuffer, which is streamed: MaxStoredBody does not lift it. A
// body not kept leaves its size.
func TestStoredBody(t *testing.T) {
	for _, tt := range []struct {
		name                     string
		maxStoredBody, maxBuffer int64
		size                     int
		stored                   bool
	}{
		{"zero: 64 KiB kept", 0, 0, 64 << 10, true},
		{"zero: 64 KiB and a byte not", 0, 0, 64<<10 + 1, false},
		{"negative: none kept", -1, 0, 15, false},
		{"set: that many kept", 100, 0, 100, true},
		{"set: one more not", 100, 0, 101, false},
		{"above MaxBuffer: not", 64, 8, 15, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, _, jar := newTransport(t, status(201))
			tr.MaxStoredBody, tr.MaxBuffer = tt.maxStoredBody, tt.maxBuffer
			body := `"` + strings.Repeat("a", tt.size-2) + `"` // JSON of tt.size bytes
			ctx := idem.WithOperation(context.Background(), "op")
			resp, err := post(t, ctx, tr, body)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			rec, err := jar.Get(ctx, "op")
			if err != nil {
				t.Fatal(err)
			}
			want := []byte(nil)
			if tt.stored {
				want = []byte(body)
			}
			if !bytes.Equal(rec.Body, want) || (rec.Body == nil) != (want == nil) || rec.BodySize != int64(tt.size) || rec.BodyStored() != tt.stored {
				t.Fatalf("stored %d bytes of a body of %d (stored: %v); want the %d-byte body kept: %v", len(rec.Body), rec.BodySize, rec.BodyStored(), tt.size, tt.stored)
			}
		})
	}
}

// lateBeginJar creates the record, as a jar whose commit outlives the
// caller's wait does (keyjar: "the record may still be created"), and
// returns the caller's context error: the context ends during the write.
type lateBeginJar struct {
	*idem.MemoryJar
	cancel context.CancelFunc
}

func (j lateBeginJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	if _, _, err := j.MemoryJar.Begin(context.Background(), r); err != nil {
		return idem.Record{}, false, err
	}
	j.cancel()
	return idem.Record{}, false, ctx.Err()
}

// TestContextEndingInBeginLeavesPendingAndFree: the caller's context
// ending while the jar writes a new operation is the caller's context
// ending, a *PendingError, not a jar failure; and a record the write left
// behind holds neither this call's lease nor an attempt it never sent, so
// that the next call with the name sends at once.
func TestContextEndingInBeginLeavesPendingAndFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mj := newTransport(t, status(201))
		ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
		tr.Jar = lateBeginJar{mj, cancel}
		_, err := post(t, ctx, tr, `{}`)
		var je *idem.JarError
		if !errors.Is(err, idem.ErrPending) || !errors.Is(err, context.Canceled) || errors.As(err, &je) || rec.attempts() != 0 {
			t.Fatalf("got %T %v after %d sends; want a *PendingError wrapping context.Canceled, nothing sent", err, err, rec.attempts())
		}
		if pe := (*idem.PendingError)(nil); errors.As(err, &pe) && !strings.Contains(pe.Reason, "nothing sent") {
			t.Errorf("Reason %q; want it to say that nothing was sent", pe.Reason)
		}
		r, err := mj.Get(context.Background(), "op")
		if err != nil || r.Holder != "" || r.Attempts != 0 || r.State != idem.StatePending {
			t.Fatalf("record %+v, %v; want pending, no lease, no attempt", r, err)
		}
		tr.Jar = mj
		start := time.Now()
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if waited := time.Since(start); waited != 0 || rec.attempts() != 1 || rec.keys[0] != r.Key {
			t.Fatalf("sent %d times with key %q after %v; want once at once with %q", rec.attempts(), rec.keys, waited, r.Key)
		}
	})
}

// lostBeginJar writes the record, then fails, as a jar whose commit is
// made but whose answer is lost (a connection to the database that drops
// after COMMIT).
type lostBeginJar struct{ *idem.MemoryJar }

func (j lostBeginJar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	if _, _, err := j.MemoryJar.Begin(ctx, r); err != nil {
		return idem.Record{}, false, err
	}
	return idem.Record{}, false, errors.New("connection reset after COMMIT")
}

// TestJarFailingAfterItsWriteLeavesNothingToSend: a *JarError says nothing
// was sent, and the jar agrees: a record the failed Begin wrote is
// abandoned, not left pending for a resume to send, nor leased to a call
// that returned; the next call with the name sends at once, under a new
// key. A record someone else holds is left as it is.
func TestJarFailingAfterItsWriteLeavesNothingToSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mj := newTransport(t, status(201))
		tr.Jar = lostBeginJar{mj}
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := post(t, ctx, tr, `{}`)
		var je *idem.JarError
		if !errors.As(err, &je) || rec.attempts() != 0 {
			t.Fatalf("got %T %v after %d sends; want a *JarError, nothing sent", err, err, rec.attempts())
		}
		r, err := mj.Get(ctx, "op")
		if err != nil || r.State != idem.StateAbandoned || r.Holder != "" || r.Attempts != 0 {
			t.Fatalf("record %+v, %v; want abandoned, no lease, no attempt", r, err)
		}
		pending, err := mj.List(ctx, idem.Filter{State: idem.StatePending})
		if err != nil || len(pending) != 0 {
			t.Fatalf("pending %v, %v; want none to resume", pending, err)
		}
		tr.Jar = mj
		start := time.Now()
		resp, err := post(t, ctx, tr, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if waited := time.Since(start); waited != 0 || rec.attempts() != 1 || rec.keys[0] == r.Key {
			t.Fatalf("sent %d times with key %q after %v; want once at once with a key other than %q", rec.attempts(), rec.keys, waited, r.Key)
		}

		// An operation begun by another call, which a failed Begin only
		// read, is not this call's to abandon.
		other := &idem.MemoryJar{}
		heldElsewhere(t, other, fingerprintOf(t, `{}`))
		tr.Jar = lostBeginJar{other}
		if _, err := post(t, ctx, tr, `{}`); !errors.As(err, &je) {
			t.Fatalf("got %v; want a *JarError", err)
		}
		if r, err := other.Get(ctx, "op"); err != nil || r.State != idem.StatePending || r.Holder != "other" {
			t.Fatalf("record %+v, %v; want pending, held by the other holder", r, err)
		}
	})
}

// TestMaxElapsedCountsTheDrain: the wait that Policy.MaxElapsed admits
// runs from the moment it is decided. Draining the superseded answer (up to
// a second for a stalled body) and the hooks come out of it, not on top of
// it: no wait ends after MaxElapsed.
func TestMaxElapsedCountsTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent []time.Duration
		start := time.Now()
		tr := &idem.Transport{Jar: &idem.MemoryJar{},
			Policy: retry.Policy{InitialInterval: 4500 * time.Millisecond, MaxInterval: 4500 * time.Millisecond,
				NoJitter: true, MaxElapsed: 10 * time.Second, MaxAttempts: 10},
			Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sent = append(sent, time.Since(start))
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: &stalledBody{closed: make(chan struct{})}, Request: r}, nil
			})}
		resp, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the last 503", resp, err)
		}
		resp.Body.Close()
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("attempts sent at %v, call ended after %v; want within the 10s MaxElapsed", sent, d)
		}
		if want := []time.Duration{0, 4500 * time.Millisecond, 9 * time.Second}; fmt.Sprint(sent) != fmt.Sprint(want) {
			t.Fatalf("attempts sent at %v; want %v", sent, want)
		}
	})
}

// TestRetriesReuseTheConnection: the body of each answer superseded by a
// retry (409, 503) is drained and closed, so the retry goes out on the same
// connection: one connection per call, whether the body has a
// Content-Length or is chunked, up to DrainLimit bytes, and with an
// AttemptTimeout, whose context is released with the body.
func TestRetriesReuseTheConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		size    int
		chunked bool
		timeout time.Duration
	}{
		{"409", http.StatusConflict, 100, false, 0},
		{"503 empty", http.StatusServiceUnavailable, 0, false, 0},
		{"503 chunked", http.StatusServiceUnavailable, 100, true, 0},
		{"503 of DrainLimit bytes", http.StatusServiceUnavailable, body.DrainLimit, false, 0},
		{"503 of DrainLimit bytes, chunked", http.StatusServiceUnavailable, body.DrainLimit, true, 0},
		{"409 with an AttemptTimeout", http.StatusConflict, 100, false, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var answers, conns atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if answers.Add(1) > 2 {
					w.WriteHeader(http.StatusCreated)
					return
				}
				if !tc.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(tc.size))
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write(bytes.Repeat([]byte("x"), tc.size))
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{},
				Policy: retry.Policy{InitialInterval: 1, MaxInterval: 1, AttemptTimeout: tc.timeout}} // retry at once
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || answers.Load() != 3 || conns.Load() != 1 {
				t.Fatalf("got %d after %d attempts on %d connections; want 201 after 3 on 1", resp.StatusCode, answers.Load(), conns.Load())
			}
		})
	}
}

// TestBodilessAndUnrewindableBodiesResent: a POST without a body, and one
// whose body has no GetBody, are keyed and sent again whole after a lost
// answer, and the reference server replays its first answer. Every
// attempt carries the body's length and a GetBody, which http.Transport
// needs to re-send it on a dead connection itself.
func TestBodilessAndUnrewindableBodiesResent(t *testing.T) {
	for _, c := range []struct {
		name string
		body func() io.Reader
		want string
	}{
		{"nil", func() io.Reader { return nil }, ""},
		{"http.NoBody", func() io.Reader { return http.NoBody }, ""},
		{"without GetBody", func() io.Reader { return io.MultiReader(strings.NewReader(`{"a":1}`)) }, `{"a":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int64
			mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
			srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d: %q", runs.Add(1), b)
			})))
			defer srv.Close()
			var attempts int
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				attempts++
				if r.ContentLength != int64(len(c.want)) {
					t.Errorf("attempt %d: ContentLength %d; want %d", attempts, r.ContentLength, len(c.want))
				}
				if c.want != "" {
					if r.GetBody == nil {
						t.Errorf("attempt %d has no GetBody", attempts)
					} else if rc, err := r.GetBody(); err != nil {
						t.Errorf("attempt %d: GetBody: %v", attempts, err)
					} else if b, _ := io.ReadAll(rc); string(b) != c.want {
						t.Errorf("attempt %d: GetBody yields %q; want %q", attempts, b, c.want)
					}
				}
				resp, err := srv.Client().Transport.RoundTrip(r)
				if err == nil && attempts == 1 { // the answer is lost on its way back
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					return nil, io.ErrUnexpectedEOF
				}
				return resp, err
			})
			tr := &idem.Transport{Base: base, Jar: &idem.MemoryJar{}, Policy: retry.Policy{InitialInterval: time.Nanosecond}}
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", c.body())
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("run 1: %q", c.want); string(b) != want || resp.Header.Get("Idempotent-Replayed") != "true" || attempts != 2 || runs.Load() != 1 {
				t.Fatalf("got %d %q, replayed %q after %d attempts, %d runs; want %q replayed on the second attempt, one run",
					resp.StatusCode, b, resp.Header.Get("Idempotent-Replayed"), attempts, runs.Load(), want)
			}
		})
	}
}

// TestRetryWaitPastTheDeadlineReturnsAtOnce: a retry whose wait (the
// server's Retry-After, or the backoff after a network error) would end
// at or after the context's deadline is not waited for: the call returns
// at once, the fake clock short of the deadline, with the error it gives
// when the deadline expires during a wait (context.DeadlineExceeded in a
// *PendingError), and the operation stays pending under its key, its
// lease given back, the Retry-After recorded. A wait that ends before the
// deadline is waited for, and the retry sent.
func TestRetryWaitPastTheDeadlineReturnsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		first    func() (*http.Response, error)
		backoff  time.Duration // the policy's intervals
		deadline time.Duration
		retried  bool          // the wait ends before the deadline
		next     time.Duration // the NextAttempt recorded, from the start; 0: none
	}{
		{"Retry-After past the deadline", status(503, "Retry-After", "30"), time.Millisecond, 10 * time.Second, false, 30 * time.Second},
		{"Retry-After at the deadline", status(429, "Retry-After", "10"), time.Millisecond, 10 * time.Second, false, 10 * time.Second},
		{"backoff past the deadline", netErr(syscall.ECONNRESET), 20 * time.Second, 5 * time.Second, false, 0},
		{"409 backoff past the deadline", status(409), 20 * time.Second, 5 * time.Second, false, 0},
		{"Retry-After before the deadline", status(503, "Retry-After", "2"), time.Millisecond, 10 * time.Second, true, 0},
		{"backoff before the deadline", netErr(syscall.ECONNRESET), 2 * time.Second, 10 * time.Second, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, tc.first, status(201))
				tr.Policy = retry.Policy{InitialInterval: tc.backoff, MaxInterval: tc.backoff, NoJitter: true,
					MaxAttempts: 5, MaxRetryAfter: time.Minute}
				start := time.Now()
				resp, took, r, err := postBy(t, tr, jar, tc.deadline)
				if tc.retried {
					if err != nil || resp.StatusCode != 201 || rec.attempts() != 2 || r.State != idem.StateDone {
						t.Fatalf("got %v, %v after %d attempts, the operation %s; want the retry's 201, done", resp, err, rec.attempts(), r.State)
					}
					resp.Body.Close()
					if took < time.Second || took >= tc.deadline {
						t.Fatalf("the call took %v; want the wait before the retry, short of the deadline %v", took, tc.deadline)
					}
					return
				}
				pe := pendingAtOnce(t, resp, err, took, tc.deadline)
				var next time.Time
				if tc.next > 0 {
					next = start.Add(tc.next)
				}
				if rec.attempts() != 1 || pe.Attempts != 1 || pe.Key != rec.keys[0] || r.State != idem.StatePending ||
					r.Key != rec.keys[0] || r.Attempts != 1 || r.Holder != "" || !r.NextAttempt.Equal(next) {
					t.Fatalf("%d attempts sent, error %+v, record %+v; want 1 attempt, the operation pending under the key sent %q, its lease released, NextAttempt %v",
						rec.attempts(), pe, r, rec.keys[0], next)
				}
			})
		})
	}
}

// TestStoredWaitPastTheDeadlineReturnsAtOnce: a call that finds in the jar
// a wait before it may send, a stored NextAttempt (an earlier answer's
// Retry-After) or another holder's lease, that would end at or after its
// context's deadline, does not wait: it returns at once, the fake clock
// short of the deadline, with the error it gives when the deadline expires
// during that wait (context.DeadlineExceeded in a *PendingError), nothing
// sent, and the operation as it was: its NextAttempt kept, and the lease
// given back or still the other holder's. A wait (the lease's end, or the
// backoff while it is held) that ends before the deadline is waited for,
// and the operation sent.
func TestStoredWaitPastTheDeadlineReturnsAtOnce(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, tc := range []struct {
		name     string
		next     time.Duration // the stored NextAttempt, from the start; 0: none
		lease    time.Duration // left of another holder's lease; 0: none
		backoff  time.Duration // the policy's intervals
		deadline time.Duration
		sentAt   time.Duration // when the operation is sent; 0: never, the wait being past the deadline
	}{
		{"NextAttempt past the deadline", 20 * time.Second, 0, time.Minute, 10 * time.Second, 0},
		{"NextAttempt at the deadline", 10 * time.Second, 0, time.Minute, 10 * time.Second, 0},
		{"NextAttempt before the deadline", 2 * time.Second, 0, time.Minute, 10 * time.Second, 2 * time.Second},
		{"lease past the deadline", 0, 30 * time.Second, time.Minute, 10 * time.Second, 0},
		{"lease at the deadline", 0, 10 * time.Second, time.Minute, 10 * time.Second, 0},
		{"backoff for a lease past the deadline", 0, time.Hour, 20 * time.Second, 5 * time.Second, 0},
		{"lease before the deadline", 0, 2 * time.Second, time.Minute, 10 * time.Second, 2 * time.Second},
		{"backoff for a lease before the deadline", 0, 3 * time.Second, 2 * time.Second, 10 * time.Second, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(201))
				tr.Policy = retry.Policy{InitialInterval: tc.backoff, MaxInterval: tc.backoff, NoJitter: true,
					MaxAttempts: 5, MaxRetryAfter: time.Minute, MaxElapsed: 2 * time.Hour}
				start := time.Now()
				stored := idem.Record{Op: "op", Key: "k1", Fingerprint: fp, Header: jsonHeader(), State: idem.StatePending,
					Created: start, Updated: start, Attempts: 1, LastStatus: 503}
				if tc.next > 0 {
					stored.NextAttempt = start.Add(tc.next)
				}
				if tc.lease > 0 {
					stored.Holder, stored.LeaseUntil = "other", start.Add(tc.lease)
				}
				if _, _, err := jar.Begin(context.Background(), stored); err != nil {
					t.Fatal(err)
				}
				resp, took, r, err := postBy(t, tr, jar, tc.deadline)
				if tc.sentAt > 0 {
					if err != nil || resp.StatusCode != 201 || rec.attempts() != 1 || rec.keys[0] != "k1" || r.State != idem.StateDone {
						t.Fatalf("got %v, %v after %d sends, the operation %s; want 201, sent once with k1, done", resp, err, rec.attempts(), r.State)
					}
					resp.Body.Close()
					if took != tc.sentAt {
						t.Fatalf("sent after %v; want at the wait's end, +%v", took, tc.sentAt)
					}
					return
				}
				pe := pendingAtOnce(t, resp, err, took, tc.deadline)
				// When the operation can be sent: the stored NextAttempt,
				// or the other holder's lease's end when later.
				next := stored.NextAttempt
				if stored.LeaseUntil.After(next) {
					next = stored.LeaseUntil
				}
				if rec.attempts() != 0 || pe.Attempts != 0 || pe.Key != "k1" || !pe.NextAttempt.Equal(next) ||
					r.State != idem.StatePending || r.Key != "k1" || r.Attempts != 1 || !r.NextAttempt.Equal(stored.NextAttempt) ||
					r.Holder != stored.Holder || !r.LeaseUntil.Equal(stored.LeaseUntil) {
					t.Fatalf("%d sent, error %+v, record %+v; want nothing sent, the error's NextAttempt %v, the operation pending as it was under k1, NextAttempt %v, holder %q",
						rec.attempts(), pe, r, next, stored.NextAttempt, stored.Holder)
				}
			})
		})
	}
}

// postBy posts {} as the operation "op" under a context whose deadline is
// in deadline, and returns the call's answer, how long it took, and the
// record it left.
func postBy(t *testing.T, tr *idem.Transport, jar *idem.MemoryJar, deadline time.Duration) (*http.Response, time.Duration, idem.Record, error) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op"), deadline)
	defer cancel()
	resp, err := post(t, ctx, tr, `{}`)
	took := time.Since(start)
	r, gerr := jar.Get(context.Background(), "op")
	if gerr != nil {
		t.Fatal(gerr)
	}
	return resp, took, r, err
}

// pendingAtOnce checks that a call whose wait was past its context's
// deadline returned at once, after took, short of the deadline, with the
// error the deadline ending the wait gives: a *PendingError matching
// context.DeadlineExceeded and idem.ErrPending, which it returns.
func pendingAtOnce(t *testing.T, resp *http.Response, err error, took, deadline time.Duration) *idem.PendingError {
	t.Helper()
	if took >= deadline {
		t.Errorf("the call returned after %v, at the deadline %v; want at once, the wait being past it", took, deadline)
	}
	var pe *idem.PendingError
	if resp != nil || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idem.ErrPending) || !errors.As(err, &pe) {
		t.Fatalf("got %v, %v; want a *PendingError matching context.DeadlineExceeded and idem.ErrPending", resp, err)
	}
	return pe
}

// TestLeasedElsewhereSaysWhenToResume: a call that gives up on an
// operation another holder leases past the call's budget says when it can
// be taken: the lease's end, or the server's Retry-After that the record
// keeps when it comes later.
func TestLeasedElsewhereSaysWhenToResume(t *testing.T) {
	fp := fingerprintOf(t, `{}`)
	for _, retryAfter := range []time.Duration{0, 2 * time.Hour} {
		t.Run(fmt.Sprintf("retry-after=%v", retryAfter), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, rec, jar := newTransport(t, status(201))
				ctx := idem.WithOperation(context.Background(), "op")
				heldElsewhere(t, jar, fp) // for an hour, past the budget
				held, err := jar.Get(ctx, "op")
				if err != nil {
					t.Fatal(err)
				}
				want := held.LeaseUntil
				if retryAfter > 0 {
					want = time.Now().Add(retryAfter)
					if _, err := jar.Update(ctx, "op", "other", idem.Change{Now: time.Now(), NextAttempt: want}); err != nil {
						t.Fatal(err)
					}
				}
				_, err = post(t, ctx, tr, `{}`)
				var pe *idem.PendingError
				if !errors.As(err, &pe) || !errors.Is(err, idem.ErrLeased) || rec.attempts() != 0 {
					t.Fatalf("got %v after %d sends; want a *PendingError for the lease, nothing sent", err, rec.attempts())
				}
				if !pe.NextAttempt.Equal(want) {
					t.Fatalf("NextAttempt %v; want %v, when the operation can be taken (error: %v)", pe.NextAttempt, want, err)
				}
			})
		})
	}
}

// TestAttemptTimeoutSaysNoCancel: an attempt that ran out of
// Policy.AttemptTimeout is reported as timed out, in the call's error and
// in the record's LastError, without the "context canceled" with which
// net/http ends a request whose context the timer cancelled: the caller's
// context was not cancelled, and the words would say it was.
func TestAttemptTimeoutSaysNoCancel(t *testing.T) {
	for name, wrap := range map[string]func(error) error{
		"as http.Transport returns it": func(err error) error { return err },
		"wrapped by a base of its own": func(err error) error { return fmt.Errorf("tracing: %w", err) },
	} {
		t.Run(name, func(t *testing.T) { attemptTimeoutSaysNoCancel(t, wrap) })
	}
}

func attemptTimeoutSaysNoCancel(t *testing.T, wrap func(error) error) {
	synctest.Test(t, func(t *testing.T) {
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Jar: jar, Policy: retry.Policy{MaxAttempts: 1, AttemptTimeout: time.Second}}
		tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done() // as http.Transport does for a request whose context ends
			return nil, wrap(r.Context().Err())
		})
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := post(t, ctx, tr, `{}`)
		var pe *idem.PendingError
		if !errors.As(err, &pe) || errors.Is(err, context.Canceled) {
			t.Fatalf("got %v; want a *PendingError that does not match context.Canceled", err)
		}
		rec, gerr := jar.Get(ctx, "op")
		if gerr != nil {
			t.Fatal(gerr)
		}
		for _, msg := range []string{err.Error(), rec.LastError} {
			if !strings.Contains(msg, "attempt timed out after 1s") || strings.Contains(msg, "cancel") {
				t.Errorf("message %q; want it to say the attempt timed out after 1s, and nothing of a cancellation", msg)
			}
		}
	})
}

// notSent is a base transport's refusal of an attempt that it did not
// send, as a circuit breaker that is open gives it.
func notSent() (*http.Response, error) {
	return nil, fmt.Errorf("circuit breaker open: %w", idem.ErrNotSent)
}

// TestBaseNotSent: an attempt that the base transport says it did not send
// (ErrNotSent) is not counted in the jar nor retried; the call returns a
// *PendingError wrapping it, and the operation keeps its last outcome. A
// retry not sent gives its cost back to the Budget. An operation without a
// name that was never sent is abandoned, not left pending for a resume.
func TestBaseNotSent(t *testing.T) {
	t.Run("first attempt", func(t *testing.T) {
		tr, rec, jar := newTransport(t, notSent, status(201))
		var gaveUp []string
		tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Reason) }
		_, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		if !slices.Equal(gaveUp, []string{"not sent"}) {
			t.Errorf("OnGiveUp saw %q; want one \"not sent\"", gaveUp)
		}
		var pe *idem.PendingError
		if !errors.As(err, &pe) || !errors.Is(err, idem.ErrNotSent) || pe.Attempts != 0 || rec.attempts() != 1 {
			t.Fatalf("got %v (%+v) after %d calls of the base; want a *PendingError wrapping ErrNotSent, 0 attempts, no retry", err, pe, rec.attempts())
		}
		r, err := jar.Get(context.Background(), "op")
		if err != nil || r.State != idem.StatePending || r.Attempts != 0 || r.Holder != "" || r.LastError != "" {
			t.Fatalf("record %+v, %v; want pending, no attempt, no lease, no last error", r, err)
		}
	})
	t.Run("a retry", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr, rec, jar := newTransport(t, status(503), notSent, status(201))
			tr.Budget = &retry.Budget{}
			full := tr.Budget.Available()
			_, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
			var pe *idem.PendingError
			if !errors.As(err, &pe) || !errors.Is(err, idem.ErrNotSent) || pe.Attempts != 1 || rec.attempts() != 2 {
				t.Fatalf("got %v after %d calls of the base; want a *PendingError wrapping ErrNotSent after 1 attempt", err, rec.attempts())
			}
			r, _ := jar.Get(context.Background(), "op")
			if r.Attempts != 1 || r.LastStatus != 503 || r.State != idem.StatePending || r.Holder != "" {
				t.Fatalf("record %+v; want pending, 1 attempt, its 503 kept, no lease", r)
			}
			if got := tr.Budget.Available(); got != full {
				t.Fatalf("Budget holds %d after the retry not sent; want %d, its cost given back", got, full)
			}
		})
	})
	t.Run("unnamed", func(t *testing.T) {
		tr, rec, jar := newTransport(t, notSent)
		var gaveUp []string
		tr.Hooks.OnGiveUp = func(e idem.Event) { gaveUp = append(gaveUp, e.Reason) }
		_, err := post(t, context.Background(), tr, `{}`)
		if !slices.Equal(gaveUp, []string{"not sent"}) {
			t.Errorf("OnGiveUp saw %q; want one \"not sent\"", gaveUp)
		}
		if !errors.Is(err, idem.ErrNotSent) || errors.Is(err, idem.ErrPending) || rec.attempts() != 1 {
			t.Fatalf("got %v; want an error wrapping ErrNotSent, not ErrPending", err)
		}
		all, lerr := jar.List(context.Background(), idem.Filter{})
		if lerr != nil || len(all) != 1 || all[0].State != idem.StateAbandoned || all[0].Attempts != 0 ||
			!strings.Contains(all[0].Note, "never sent") || all[0].Holder != "" {
			t.Fatalf("jar holds %+v, %v; want one operation, abandoned as never sent", all, lerr)
		}
	})
}

// panickingBase panics in RoundTrip, after it kept the attempt's context.
type panickingBase struct{ ctx *context.Context }

func (b panickingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	*b.ctx = r.Context()
	panic("base")
}

// TestAttemptContextEndsWhenBasePanics: an attempt whose Base panics ends
// with RoundTrip; its context, and the AttemptTimeout timer that would end
// it, are released then, not an AttemptTimeout later.
func TestAttemptContextEndsWhenBasePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var attempt context.Context
		tr := &idem.Transport{Base: panickingBase{&attempt}, Jar: &idem.MemoryJar{}, Policy: retry.Policy{AttemptTimeout: time.Hour}}
		func() {
			defer func() {
				if recover() == nil {
					t.Error("RoundTrip did not panic")
				}
			}()
			req, _ := http.NewRequest("POST", "http://127.0.0.1:1/x", strings.NewReader(`{}`))
			tr.RoundTrip(req)
		}()
		if attempt == nil {
			t.Fatal("Base not called")
		}
		if attempt.Err() == nil {
			t.Error("the attempt's context is live after RoundTrip panicked: its timer holds it for the AttemptTimeout (1h)")
		}
	})
}

// onlyRecord returns the one record jar holds, and fails t if it holds
// another number of them.
func onlyRecord(t *testing.T, jar interface {
	List(context.Context, idem.Filter) ([]idem.Record, error)
}) idem.Record {
	t.Helper()
	all, err := jar.List(context.Background(), idem.Filter{})
	if err != nil || len(all) != 1 {
		t.Fatalf("List: %d records, %v; want 1", len(all), err)
	}
	return all[0]
}

// TestUnnamedNeverConnectedIsAbandoned: an operation without a name whose
// every attempt failed to connect through net/http's Transport (a dial
// refused, a host name that does not exist) sent nothing, and no call can
// name it: it is abandoned, as one that Base refused with ErrNotSent, not
// left pending for a resume of every pending operation to send once the
// host answers. A named operation stays pending, and so does one whose
// base is not net/http's (it may have sent an attempt of its own).
func TestUnnamedNeverConnectedIsAbandoned(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	notFound := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "pay.invalid", IsNotFound: true}}
	dialing := func(err error) http.RoundTripper {
		return &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, err }}
	}
	// Through a proxy, net/http wraps the dial's error in a *net.OpError
	// "proxyconnect".
	viaProxy := func(err error) http.RoundTripper {
		tr := dialing(err).(*http.Transport)
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.invalid:3128"})
		return tr
	}
	for _, c := range []struct {
		name     string
		base     http.RoundTripper
		op       string
		state    idem.State
		attempts int
	}{
		{"refused", dialing(refused), "", idem.StateAbandoned, 2},
		{"no such host", dialing(notFound), "", idem.StateAbandoned, 1},
		{"proxy refused", viaProxy(refused), "", idem.StateAbandoned, 2},
		{"proxy not found", viaProxy(notFound), "", idem.StateAbandoned, 1},
		{"SOCKS proxy cannot reach the host", socksUnreachable(), "", idem.StateAbandoned, 2},
		{"refused, named", dialing(refused), "charge:1", idem.StatePending, 2},
		{"refused, another base", roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, refused }), "", idem.StatePending, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				jar := &idem.MemoryJar{}
				tr := &idem.Transport{Base: c.base, Jar: jar, Policy: retry.Policy{MaxAttempts: 2}}
				ctx := context.Background()
				if c.op != "" {
					ctx = idem.WithOperation(ctx, c.op)
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://pay.invalid/charges", strings.NewReader(`{}`))
				_, err := tr.RoundTrip(req)
				var pe *idem.PendingError
				var oe *net.OpError
				if !errors.Is(err, syscall.ECONNREFUSED) && !errors.As(err, new(*net.DNSError)) && !(errors.As(err, &oe) && oe.Op == "socks connect") {
					t.Errorf("RoundTrip: %v; want the dial's error", err)
				}
				if got := errors.As(err, &pe); got != (c.state == idem.StatePending) {
					t.Errorf("RoundTrip: %v, a *PendingError: %v; want %v", err, got, !got)
				}
				if r := onlyRecord(t, jar); r.State != c.state || r.Attempts != c.attempts || r.Holder != "" {
					t.Errorf("record: %s, %d attempts, holder %q; want %s, %d attempts, no holder", r.State, r.Attempts, r.Holder, c.state, c.attempts)
				}
			})
		})
	}
}

// TestProxyFuncErrorNotSent: net/http's Transport calls its Proxy
// function before it dials, and returns the function's error as it is,
// nothing sent: a malformed HTTPS_PROXY (http.ProxyFromEnvironment's
// "invalid proxy address"), a function of the program's that refuses the
// host. The attempt was not sent, as one Base refuses with ErrNotSent: it
// is not retried nor counted, the operation without a name is abandoned,
// and a named one stays pending for a later call.
func TestProxyFuncErrorNotSent(t *testing.T) {
	errProxy := errors.New("no proxy for pay.example")
	for _, c := range []struct {
		op    string
		state idem.State
	}{{"", idem.StateAbandoned}, {"charge:1", idem.StatePending}} {
		t.Run("op="+c.op, func(t *testing.T) {
			base, dials := refusetest.Proxy(errProxy)
			jar := &idem.MemoryJar{}
			tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 3, InitialInterval: time.Nanosecond}}
			ctx := context.Background()
			if c.op != "" {
				ctx = idem.WithOperation(ctx, c.op)
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://pay.example/charges", strings.NewReader(`{}`))
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, errProxy) || !errors.Is(err, idem.ErrNotSent) || errors.As(err, new(*idem.PendingError)) != (c.state == idem.StatePending) {
				t.Errorf("RoundTrip: %v; want the Proxy's error, not sent, a *PendingError only when named", err)
			}
			if r := onlyRecord(t, jar); r.State != c.state || r.Attempts != 0 || r.Holder != "" {
				t.Errorf("record: %s, %d attempts, holder %q; want %s, no attempt, no holder", r.State, r.Attempts, r.Holder, c.state)
			}
			if dials() != 0 {
				t.Errorf("%d dials; want none", dials())
			}
		})
	}
}

// socksUnreachable returns a transport through a SOCKS5 proxy that
// answers every CONNECT with "host unreachable": net/http reports it in a
// *net.OpError "socks connect", before it writes anything of the request.
func socksUnreachable() http.RoundTripper {
	return &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "socks5", Host: "proxy.invalid:1080"}),
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			go func() {
				defer server.Close()
				var greeting [3]byte // version 5, one method: none
				if _, err := io.ReadFull(server, greeting[:]); err != nil {
					return
				}
				server.Write([]byte{5, 0})
				var head [4]byte // version, CONNECT, reserved, address type
				if _, err := io.ReadFull(server, head[:]); err != nil || head[3] != 3 {
					return
				}
				var n [1]byte
				if _, err := io.ReadFull(server, n[:]); err != nil {
					return
				}
				if _, err := io.ReadFull(server, make([]byte, int(n[0])+2)); err != nil { // name, port
					return
				}
				server.Write([]byte{5, 4, 0, 1, 0, 0, 0, 0, 0, 0}) // host unreachable
			}()
			return client, nil
		},
	}
}

// TestUnnamedSentThenRedialRefusedStaysPending: net/http's Transport sends
// a request with an Idempotency-Key again on a new connection when the
// idle one it wrote it to closes before any answer (a server that crashed
// as it ran it), and reports only the new connection's dial error. The
// request reached the server: the operation without a name stays pending,
// not abandoned as one that never connected, and its caller is not told
// that nothing was sent. Through a proxy, the dial's error comes wrapped
// in a *net.OpError "proxyconnect".
//
// A request with Expect: 100-continue has its header written and waits
// for the server's go-ahead before its body is read: a server that acts on
// the header alone and ends the idle connection unanswered (a handler that
// does not read the body, then a crash) leaves the body unread, closed,
// and net/http sends it again all the same. It stays pending too.
func TestUnnamedSentThenRedialRefusedStaysPending(t *testing.T) {
	for _, proxy := range []string{"", "http://proxy.invalid:3128"} {
		t.Run("proxy="+proxy, func(t *testing.T) { testSentThenRedialRefused(t, proxy, false) })
	}
	t.Run("expect 100-continue", func(t *testing.T) { testSentThenRedialRefused(t, "", true) })
}

func testSentThenRedialRefused(t *testing.T, proxy string, expect bool) {
	synctest.Test(t, func(t *testing.T) {
		var dials, posts atomic.Int32
		serve := func(conn net.Conn) {
			defer conn.Close()
			br := bufio.NewReader(conn)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if req.Method == "POST" {
					posts.Add(1)
					if !expect {
						io.Copy(io.Discard, req.Body)
					}
					return // read (its header alone, expecting 100-continue), then the server is gone
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}
		base := &http.Transport{ExpectContinueTimeout: time.Second, DialContext: func(context.Context, string, string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
			}
			client, server := net.Pipe()
			go serve(server)
			return client, nil
		}}
		if proxy != "" {
			u, _ := url.Parse(proxy)
			base.Proxy = http.ProxyURL(u)
		}
		defer base.CloseIdleConnections()
		// A first request leaves the connection idle in base's pool.
		warm, _ := http.NewRequest("GET", "http://pay.example/health", nil)
		resp, err := base.RoundTrip(warm)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		synctest.Wait()

		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 2}}
		req, _ := http.NewRequest("POST", "http://pay.example/charges", strings.NewReader(`{"amount":1}`))
		if expect {
			req.Header.Set("Expect", "100-continue")
		}
		_, err = tr.RoundTrip(req)
		if posts.Load() != 1 {
			t.Fatalf("the server read %d POSTs; want 1 (on the idle connection)", posts.Load())
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, new(*idem.PendingError)) {
			t.Errorf("RoundTrip: %v; want a *PendingError with the dial's error", err)
		}
		if r := onlyRecord(t, jar); r.State != idem.StatePending || r.Attempts != 2 {
			t.Errorf("record: %s, %d attempts, note %q; want pending, 2 attempts (the first reached the server)", r.State, r.Attempts, r.Note)
		}
	})
}

// TestFreshConnectionClosedBeforeTheRequestIsRetried: a server that
// closes a new connection before the request is written to it (a server at
// its connection limit, a balancer draining) makes net/http's Transport
// fail the request with "http: server closed idle connection", an error of
// no type that it sends again itself only on a reused connection. Nothing
// was sent; it is a network fault like the EOF that the same close gives
// a moment later, and is retried under the same key.
func TestFreshConnectionClosedBeforeTheRequestIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dials atomic.Int32
		var keys []string
		serve := func(conn net.Conn) {
			defer conn.Close()
			br := bufio.NewReader(conn)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				keys = append(keys, req.Header.Get(idem.KeyHeader))
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}
		base := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			if dials.Add(1) == 1 {
				server.Close() // closed as soon as accepted
			} else {
				go serve(server)
			}
			return client, nil
		}}
		defer base.CloseIdleConnections()
		// The connection's reader sees the close before the request is
		// queued on it, as it does when the server is quicker than the
		// client's goroutines.
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if dials.Load() == 1 {
					synctest.Wait()
				}
			},
		})
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 2}}
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://pay.example/charges", strings.NewReader(`{"amount":1}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("RoundTrip: %v; want the second attempt's 200", err)
		}
		resp.Body.Close()
		if len(keys) != 1 || keys[0] == "" {
			t.Errorf("the server read keys %q; want one", keys)
		}
		if r := onlyRecord(t, jar); r.State != idem.StateDone || r.Attempts != 2 {
			t.Errorf("record: %s, %d attempts; want done, 2 attempts", r.State, r.Attempts)
		}
	})
}

// TestUnnamedRefusedCertificateIsAbandoned: net/http sets up TLS with the
// server before it writes anything of the request: a certificate the
// client refuses sends nothing. The operation without a name is abandoned
// when the call stops, as one whose dial failed: pending, a resume of
// every pending operation would send it once the certificate is fixed,
// after its caller was told the call failed.
func TestUnnamedRefusedCertificateIsAbandoned(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { posts.Add(1) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake the client ends
	srv.StartTLS()                                   // its certificate is not in the client's pool
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	jar := &idem.MemoryJar{}
	tr := &idem.Transport{Base: base, Jar: jar}
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount":1}`))
	_, err := tr.RoundTrip(req)
	if !errors.As(err, new(*tls.CertificateVerificationError)) || errors.As(err, new(*idem.PendingError)) {
		t.Errorf("RoundTrip: %v; want the handshake's error, and no *PendingError", err)
	}
	if r := onlyRecord(t, jar); r.State != idem.StateAbandoned || r.Holder != "" {
		t.Errorf("record: %s, holder %q, note %q; want abandoned, no holder", r.State, r.Holder, r.Note)
	}
	if n := posts.Load(); n != 0 {
		t.Errorf("the server ran %d requests; want 0", n)
	}
}

// TestUnnamedNeverConnectedAbandonedWhenCancelled: an operation without a
// name whose every attempt failed to connect is abandoned when its
// caller cancels the call as it waits to retry, as when its attempts run
// out: pending, a resume of every pending operation would send it once
// the host answers, after its caller was told it failed.
func TestUnnamedNeverConnectedAbandonedWhenCancelled(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		base := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, refused }}
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Base: base, Jar: jar, Hooks: idem.Hooks{OnRetry: func(e idem.Event) {
			if e.Attempt == 2 {
				cancel() // the caller gives up as the call waits for its third attempt
			}
		}}}
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://pay.invalid/charges", strings.NewReader(`{}`))
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) || errors.As(err, new(*idem.PendingError)) {
			t.Errorf("RoundTrip: %v; want the context's error, and no *PendingError", err)
		}
		if r := onlyRecord(t, jar); r.State != idem.StateAbandoned || r.Holder != "" {
			t.Errorf("record: %s, %d attempts, holder %q; want abandoned, no holder", r.State, r.Attempts, r.Holder)
		}
	})
}

// TestUnnamedNeverConnectedAbandonedAtDeadline: so is one whose context's
// deadline comes before its next attempt could be sent.
func TestUnnamedNeverConnectedAbandonedAtDeadline(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	synctest.Test(t, func(t *testing.T) {
		base := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, refused }}
		jar := &idem.MemoryJar{}
		tr := &idem.Transport{Base: base, Jar: jar, Policy: retry.Policy{MaxAttempts: 100}}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://pay.invalid/charges", strings.NewReader(`{}`))
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, new(*idem.PendingError)) {
			t.Errorf("RoundTrip: %v; want the deadline's error, and no *PendingError", err)
		}
		if r := onlyRecord(t, jar); r.State != idem.StateAbandoned || r.Holder != "" {
			t.Errorf("record: %s, %d attempts, holder %q; want abandoned, no holder", r.State, r.Attempts, r.Holder)
		}
	})
}

// TestJarErrorSaysNothingSent: the message of a *JarError says that the
// call sent nothing, as its type does, so that a log line read without the
// code tells an operator that the jar failed before the send and not after
// it (the outcome is not unknown: no key went out in this call).
func TestJarErrorSaysNothingSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, rec, mj := newTransport(t, status(201))
		tr.Jar = lostBeginJar{mj}
		_, err := post(t, idem.WithOperation(context.Background(), "op"), tr, `{}`)
		var je *idem.JarError
		if !errors.As(err, &je) || rec.attempts() != 0 || !strings.Contains(err.Error(), "nothing sent") {
			t.Fatalf("got %v after %d sends; want a *JarError whose message says nothing was sent", err, rec.attempts())
		}
	})
}
