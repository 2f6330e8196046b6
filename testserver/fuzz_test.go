package testserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
)

// validKey is the rule ParseKey documents, restated: 1 to 255 printable
// ASCII characters, no space at either end.
func validKey(k string) bool {
	if k == "" || len(k) > testserver.MaxKeyLen || k[0] == ' ' || k[len(k)-1] == ' ' {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// validBare is the rule for the bare form, restated: a valid key without a
// comma, which would read as two keys joined into one line.
func validBare(k string) bool { return validKey(k) && !strings.Contains(k, ",") }

// sfString is the RFC 8941 sf-string encoding of a key: the only one, since
// '"' and '\' must be escaped and nothing else may be.
func sfString(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

// FuzzParseKey: ParseKey never panics; what it accepts is a valid key that
// round-trips through the quoted form (and the bare form, when the key does
// not start with a quote and holds no comma); what it refuses is a
// *KeyError matching ErrInvalidKey that names the value, and never a valid
// bare key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"", "k", "8e03978e-40d5-43e8-bc93-6894a57f9324", `"order-42"`, `""`, `"a\"b\\c"`, `"a\nb"`,
		`"a", "b"`, "a, b", "a,b", `"a,b"`, `"abc`, `"a"b`, `"\`, `\"`, " a", "a ", `" a"`, "a\tb", "a\x00b", "a\x7fb", "clé",
		"\xff", strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`,
		`"` + strings.Repeat(`\\`, 255) + `"`, `"` + strings.Repeat(`\\`, 256) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := testserver.ParseKey(v)
		bare := !strings.HasPrefix(v, `"`)
		if err != nil {
			var ke *testserver.KeyError
			if !errors.As(err, &ke) || !errors.Is(err, testserver.ErrInvalidKey) || ke.Value != v || ke.Reason == "" {
				t.Fatalf("ParseKey(%q) error %#v; want a *KeyError with the value and a reason, matching ErrInvalidKey", v, err)
			}
			if key != "" {
				t.Fatalf("ParseKey(%q) = %q with an error; want \"\"", v, key)
			}
			if bare && validBare(v) {
				t.Fatalf("ParseKey(%q) refused a valid bare key: %v", v, err)
			}
			return
		}
		if !validKey(key) {
			t.Fatalf("ParseKey(%q) = %q (%d bytes); want 1 to 255 printable ASCII, no space at the ends", v, key, len(key))
		}
		if bare && (key != v || !validBare(key)) {
			t.Fatalf("ParseKey(%q) = %q; want a bare key unchanged, without a comma", v, key)
		}
		if !bare && v != sfString(key) {
			t.Fatalf("ParseKey(%q) = %q, but its sf-string is %q; want only the canonical quoted form accepted", v, key, sfString(key))
		}
		if got, err := testserver.ParseKey(sfString(key)); err != nil || got != key {
			t.Fatalf("ParseKey(%q) = %q, %v; want the quoted form of %q to round-trip", sfString(key), got, err, key)
		}
		if !strings.HasPrefix(key, `"`) && !strings.Contains(key, ",") {
			if got, err := testserver.ParseKey(key); err != nil || got != key {
				t.Fatalf("ParseKey(%q) = %q, %v; want the bare form to round-trip", key, got, err)
			}
		}
	})
}

// takeOverCounter is a MemoryStore that counts won take-overs per scope
// and key: the only way the Middleware may run a handler twice for one key.
type takeOverCounter struct {
	testserver.MemoryStore
	wins map[scopeKey]int
}

type scopeKey struct{ scope, key string }

func (s *takeOverCounter) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	won, err := s.MemoryStore.TakeOver(ctx, scope, key, old, new)
	if won {
		s.wins[scopeKey{scope, key}]++
	}
	return won, err
}

// fuzzInput hands out the fuzzer's bytes; past the end it gives zeros.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fuzzInput) bytes(n int) []byte {
	n = min(n, len(in.b))
	b := in.b[:n]
	in.b = in.b[n:]
	return b
}

// The vocabulary of a fuzzed request. Each request of a program is seven
// bytes, each picking from one list. The key, body and Content-Type bytes
// pick one past their list's end for raw input instead: a length byte and
// that many bytes (for a header, a name and then a value).
var (
	fuzzMethods  = []string{"POST", "PATCH", "PUT", "GET", "DELETE", "post", "FOO", ""}
	fuzzTenants  = [][]string{nil, {"Bearer A"}, {"Bearer B"}, {"Bearer A", "Bearer B"}}
	fuzzKeys     = [][]string{nil, {"k1"}, {`"k1"`}, {"k2"}, {`"k\"2"`}, {""}, {strings.Repeat("x", 256)}, {"a\x01b"}, {"k1", "k1"}, {"k1", "k2"}}
	fuzzBodies   = []string{"", `{"a":1,"b":2}`, `{"b":2, "a":1}`, `{"a":1,"b":3}`, "fail", "panic", "nest"}
	fuzzTypes    = []string{"", "application/json", "application/json; charset=utf-8", "text/plain", "application/"}
	fuzzAdvances = []time.Duration{0, time.Millisecond, time.Second, time.Minute - time.Nanosecond, time.Minute, 25 * time.Hour}
	fuzzPaths    = []string{"/v1/charges", "/v1/charges?x=1", "/v1/refunds"}
)

const (
	maxNest = 4  // how deep "nest" bodies nest requests
	maxOps  = 64 // requests per program
)

// pick returns the list element the next byte selects; with raw, it may
// select one past the end, and then reports true.
func pick[T any](in *fuzzInput, list []T, raw bool) (T, bool) {
	n := len(list)
	if raw {
		n++
	}
	i := int(in.byte()) % n
	if i == len(list) {
		var zero T
		return zero, true
	}
	return list[i], false
}

// rawString reads a length byte (modulo max) and that many bytes.
func (in *fuzzInput) rawString(max int) string { return string(in.bytes(int(in.byte()) % max)) }

// middlewareFuzz runs one program of requests through a Middleware on a
// MemoryStore and checks it after each answer and at the end.
type middlewareFuzz struct {
	t     *testing.T
	in    *fuzzInput
	mw    *testserver.Middleware
	srv   http.Handler
	clk   *clock
	store *takeOverCounter
	ops   int

	protectedRuns int
	takenOverRuns int                // runs whose Claim says TakenOver
	runs          map[scopeKey][]int // committing runs of the handler: their numbers
	nextRun       int
}

type depthKey struct{}

// protects mirrors Middleware.protects for the fuzzed configuration:
// names match in any case.
func (z *middlewareFuzz) protects(method string) bool {
	methods := z.mw.Methods
	if methods == nil {
		methods = []string{"POST", "PATCH"}
	}
	return slices.ContainsFunc(methods, func(m string) bool { return strings.EqualFold(m, method) })
}

// ServeHTTP is the handler under the Middleware. It answers 201 with the
// tenant, key and run number in a JSON body, 500 for "fail", panics for
// "panic", and for "nest" serves the program's next request before it
// answers, while it holds its claim.
func (z *middlewareFuzz) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	run := z.nextRun
	z.nextRun++
	vals := r.Header.Values("Idempotency-Key")
	var key string
	protected := z.protects(r.Method) && len(vals) > 0
	if z.protects(r.Method) {
		if len(vals) > 1 || (len(vals) == 0 && !z.mw.Optional) {
			z.t.Errorf("handler ran for %s with Idempotency-Key %q; want it refused", r.Method, vals)
		}
		if len(vals) == 1 {
			var err error
			if key, err = testserver.ParseKey(vals[0]); err != nil {
				z.t.Errorf("handler ran with an invalid key: %v", err)
			}
		}
	}
	c, claimed := testserver.ClaimFrom(r.Context())
	if claimed != protected || claimed && (c.Key != key || c.Scope != testserver.CredentialScope(r)) {
		z.t.Errorf("handler ran for %s with Idempotency-Key %q under claim %+v, %v; want a claim of that key and scope exactly when it is protected", r.Method, vals, c, claimed)
	}
	if c.TakenOver {
		z.takenOverRuns++
	}
	status := http.StatusCreated
	switch string(body) {
	case "fail":
		status = http.StatusInternalServerError
	case "nest":
		if d, _ := r.Context().Value(depthKey{}).(int); d < maxNest {
			z.step(d + 1)
		}
	}
	if protected {
		z.protectedRuns++
		if (status < 500 && string(body) != "panic") || z.mw.OnError == testserver.SaveError {
			sk := scopeKey{testserver.CredentialScope(r), key}
			z.runs[sk] = append(z.runs[sk], run)
		}
	}
	if string(body) == "panic" {
		if protected {
			panic("handler panics") // the Middleware recovers it
		}
		status = http.StatusInternalServerError // unprotected, nobody would
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(fuzzAnswer{Tenant: strings.Join(r.Header.Values("Authorization"), ","), Key: key, Run: run})
}

type fuzzAnswer struct {
	Tenant string `json:"t"`
	Key    string `json:"k"`
	Run    int    `json:"run"`
}

// step decodes one request, sends it and checks its answer. It reports
// false when the program has ended.
func (z *middlewareFuzz) step(depth int) bool {
	if len(z.in.b) == 0 || z.ops >= maxOps {
		return false
	}
	z.ops++
	in := z.in
	method, _ := pick(in, fuzzMethods, false)
	tenant, _ := pick(in, fuzzTenants, false)
	keys, raw := pick(in, fuzzKeys, true)
	if raw {
		keys = []string{in.rawString(32)}
	}
	body, raw := pick(in, fuzzBodies, true)
	if raw {
		body = in.rawString(80)
	}
	ctype, rawHeader := pick(in, fuzzTypes, true)
	advance, _ := pick(in, fuzzAdvances, false)
	path, _ := pick(in, fuzzPaths, false)

	h := http.Header{}
	for _, a := range tenant {
		h.Add("Authorization", a)
	}
	for _, k := range keys {
		h.Add("Idempotency-Key", k)
	}
	if rawHeader {
		name := in.rawString(24)
		h.Add(name, in.rawString(24))
	} else if ctype != "" {
		h.Set("Content-Type", ctype)
	}
	u, err := url.Parse(path)
	if err != nil {
		z.t.Fatal(err)
	}
	r := &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Host: "api.example.test", RemoteAddr: "192.0.2.1:1234", RequestURI: path}
	r.Body = http.NoBody // as a server's request: never nil
	if body != "" {
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	}
	r = r.WithContext(context.WithValue(context.Background(), depthKey{}, depth))
	z.clk.Add(advance)

	w := httptest.NewRecorder()
	z.srv.ServeHTTP(w, r)
	z.checkAnswer(r, w)
	return true
}

// checkAnswer: an answer never belongs to another tenant or key, and a
// replay is the answer of a run for the same tenant and key.
func (z *middlewareFuzz) checkAnswer(r *http.Request, w *httptest.ResponseRecorder) {
	t := z.t
	vals := r.Header.Values("Idempotency-Key")
	var key string
	protected := z.protects(r.Method) && len(vals) == 1
	if protected {
		var err error
		if key, err = testserver.ParseKey(vals[0]); err != nil {
			protected = false
		}
	}
	tenant := strings.Join(r.Header.Values("Authorization"), ",")
	switch ct := w.Header().Get("Content-Type"); ct {
	case "application/json":
		var a fuzzAnswer
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", w.Body, err)
		}
		if a.Tenant != tenant || (protected && a.Key != key) {
			t.Fatalf("request of tenant %q, key %q got the answer of tenant %q, key %q", tenant, key, a.Tenant, a.Key)
		}
		if w.Header().Get("Idempotent-Replayed") == "true" {
			sk := scopeKey{testserver.CredentialScope(r), key}
			found := false
			for _, n := range z.runs[sk] {
				found = found || n == a.Run
			}
			if !protected || !found {
				t.Fatalf("replay of run %d for tenant %q, key %q; that key's committed runs are %v", a.Run, tenant, key, z.runs[sk])
			}
		}
	case "application/problem+json":
		var p testserver.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("problem %q: %v", w.Body, err)
		}
		if p.Status != w.Code || p.Type == "" || (p.Key != "" && p.Key != key) {
			t.Fatalf("problem %+v for a %d answer to key %q", p, w.Code, key)
		}
	default:
		t.Fatalf("answer %d with Content-Type %q: %q", w.Code, ct, w.Body)
	}
}

// FuzzMiddleware feeds the Middleware arbitrary programs of requests:
// methods, tenants, well and badly formed keys, bodies, headers, time
// jumps, and requests nested inside a running handler (so that a claim is
// in flight, and stale when the clock jumps). The Middleware never panics;
// the handler never runs for a protected method without exactly one valid
// key (unless Optional lets a keyless request through); every run follows
// a claim or a take-over, and ClaimFrom tells it which, with its key and
// scope; for each tenant and key, at most one run is committed (answered
// below 500, or any answer under SaveError) plus one per take-over of a
// stale claim; and no answer or replay belongs to another tenant or key.
func FuzzMiddleware(f *testing.F) {
	// A program is a configuration byte, then requests: method, tenant,
	// key, body, Content-Type, clock advance and path selectors, where a
	// raw key, body or header is its selector, a length and the bytes.
	program := func(config byte, ops ...[]byte) []byte { return append([]byte{config}, bytes.Join(ops, nil)...) }
	op := func(b ...byte) []byte { return b }
	raw := func(sel byte, s string) []byte { return append([]byte{sel, byte(len(s))}, s...) }
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	// Claims, a replay of the same JSON in another order, another tenant, a mismatch.
	f.Add(program(0, op(0, 1, 1, 1, 1, 0, 0), op(0, 1, 1, 2, 1, 0, 0), op(0, 2, 1, 1, 1, 0, 0), op(0, 1, 2, 3, 1, 0, 0)))
	// A failing and a panicking handler, under SaveError.
	f.Add(program(1, op(0, 0, 1, 4, 0, 0, 0), op(0, 0, 1, 4, 0, 0, 0), op(1, 3, 3, 5, 0, 0, 0), op(1, 3, 3, 5, 0, 0, 0)))
	// Nested: the same key while in flight (409); after the lease, a
	// take-over, inside which the key is in flight again; then a replay.
	f.Add(program(0, op(0, 1, 1, 6, 0, 0, 0), op(0, 1, 1, 6, 0, 0, 0), op(0, 1, 1, 1, 0, 0, 0)))
	f.Add(program(0, op(0, 1, 1, 6, 0, 0, 0), op(0, 1, 1, 6, 0, 4, 0), op(0, 1, 1, 6, 0, 0, 0), op(0, 1, 1, 6, 0, 0, 0)))
	// Optional keys, pass-through methods, repeated keys, a day later.
	f.Add(program(2, op(0, 0, 0, 1, 0, 0, 0), op(2, 0, 1, 1, 0, 0, 0), op(6, 0, 8, 1, 0, 0, 0), op(0, 0, 9, 0, 0, 5, 2)))
	// Bad keys, and a raw key "k1" with a NUL, with the marker for large answers.
	f.Add(program(4, op(0, 1, 5, 1, 1, 0, 0), op(0, 1, 6, 1, 1, 0, 0), op(0, 1, 7, 1, 1, 0, 0),
		join(op(0, 1), raw(10, "k1\x00"), op(1, 1, 0, 0)), op(0, 1, 1, 1, 1, 0, 0), op(0, 1, 1, 1, 1, 0, 0)))
	// Two keys joined into one line by a proxy, bare and quoted; a quoted
	// key that holds a comma, claimed and then replayed.
	f.Add(program(0, join(op(0, 1), raw(10, "k1, k2"), op(1, 1, 0, 0)), join(op(0, 1), raw(10, `"k1","k2"`), op(1, 1, 0, 0)),
		join(op(0, 1), raw(10, `"k,1"`), op(1, 1, 0, 0)), join(op(0, 1), raw(10, `"k,1"`), op(1, 1, 0, 0))))
	// Raw bodies: one small, one larger than MaxBody; a raw header.
	f.Add(program(9, join(op(0, 2, 1), raw(7, "xyz"), op(0, 0, 0)), join(op(2, 2, 1), raw(7, strings.Repeat("y", 70)), op(0, 0, 0)),
		join(op(0, 1, 1, 1), raw(5, "Idempotency-Key"), []byte{2, 'k', '2'}, op(0, 0))))

	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzInput{b: data}
		config := in.byte()
		clk := newClock()
		store := &takeOverCounter{wins: map[scopeKey]int{}}
		// A Logger that discards: without one, each panic would be logged
		// with its stack, many times a second.
		mw := &testserver.Middleware{Store: store, Now: clk.Now, LockTimeout: time.Minute, MaxBody: 64, Logger: slog.New(slog.DiscardHandler)}
		if config&1 != 0 {
			mw.OnError = testserver.SaveError
		}
		mw.Optional = config&2 != 0
		if config&4 != 0 {
			mw.MaxSavedResponse = 32 // smaller than most answers: the marker is saved
		}
		if config&8 != 0 {
			mw.Methods = []string{"POST", "PUT", "FOO"}
		}
		z := &middlewareFuzz{t: t, in: in, mw: mw, clk: clk, store: store, runs: map[scopeKey][]int{}}
		z.srv = mw.Wrap(z)
		for z.step(0) {
		}

		s := mw.Stats()
		if int64(z.protectedRuns) != s.Claims+s.Takeovers {
			t.Fatalf("the handler ran %d times for keyed requests; claims %d + take-overs %d", z.protectedRuns, s.Claims, s.Takeovers)
		}
		if int64(z.takenOverRuns) != s.Takeovers {
			t.Fatalf("the handler was told %d times that it took a claim over; take-overs %d", z.takenOverRuns, s.Takeovers)
		}
		for sk, runs := range z.runs {
			if len(runs) > 1+store.wins[sk] {
				t.Fatalf("key %q of scope %q: %d committed runs %v with %d take-overs; want at most one run per claim",
					sk.key, sk.scope, len(runs), runs, store.wins[sk])
			}
		}
	})
}
