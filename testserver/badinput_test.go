package testserver_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// swappableStore lets a test close the server's database under the
// Middleware and put a reopened one back.
type swappableStore struct {
	p atomic.Pointer[sqlitestore.Store]
}

func (s *swappableStore) Claim(ctx context.Context, scope, key, fp string, token testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	return s.p.Load().Claim(ctx, scope, key, fp, token, now)
}

func (s *swappableStore) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	return s.p.Load().TakeOver(ctx, scope, key, old, new)
}

func (s *swappableStore) Save(ctx context.Context, scope, key string, token testserver.Fence, resp testserver.Response) error {
	return s.p.Load().Save(ctx, scope, key, token, resp)
}

func (s *swappableStore) Release(ctx context.Context, scope, key string, token testserver.Fence) (bool, error) {
	return s.p.Load().Release(ctx, scope, key, token)
}

func (s *swappableStore) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.p.Load().Prune(ctx, before, limit)
}

// storeRows returns every row of the store's table, as text.
func storeRows(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT scope, key, fingerprint, status, response_status, response_header, hex(response_body), locked_at, created
		FROM idempotency_keys ORDER BY scope, key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var scope, key, fp, status string
		var rstatus sql.NullInt64
		var rheader, rbody sql.NullString
		var locked, created int64
		if err := rows.Scan(&scope, &key, &fp, &status, &rstatus, &rheader, &rbody, &locked, &created); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(scope, key, fp, status, rstatus, rheader, rbody, locked, created))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// rawRequest is an HTTP/1.1 request as bytes on the wire: header lines
// are written as given, so that a test can send what no Go client would.
func rawRequest(headers []string, body string) string {
	var b strings.Builder
	b.WriteString("POST /v1/charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if !strings.Contains(strings.Join(headers, "\n"), "Transfer-Encoding") {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	return b.String()
}

// sendRaw writes a request to addr and reads the answer.
func sendRaw(t *testing.T, addr, req string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestBadInputOnTheWire sends malformed requests as raw bytes over
// loopback to the Middleware on a sqlitestore file. Each gets its status
// and problem type; the handler never runs and the store holds, row for
// row, what it held before.
func TestBadInputOnTheWire(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	open := func() *sqlitestore.Store {
		s, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	store := &swappableStore{}
	store.p.Store(open())
	t.Cleanup(func() { store.p.Load().Close() })
	h := &charges{}
	mw := &testserver.Middleware{Store: store, MaxBody: 1000}
	srv := httptest.NewServer(mw.Wrap(h))
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	// Something to lose: one key, done.
	if resp, _ := sendRaw(t, addr, rawRequest([]string{"Idempotency-Key: order-1"}, chargeBody)); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	key := func(v string) []string { return []string{"Idempotency-Key: " + v} }
	rows := []struct {
		name    string
		headers []string
		body    string
		status  int
		problem string // "" when net/http refuses the request before the Middleware
		// down closes the store for the request, and reopens it after.
		down bool
	}{
		{name: "missing key", status: 400, problem: testserver.ProblemKeyMissing},
		{name: "key of 0 characters", headers: key(""), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "empty quoted key", headers: key(`""`), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "key of 256 characters", headers: key(strings.Repeat("k", 256)), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "key of 10 000 characters", headers: key(strings.Repeat("k", 10000)), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "non-ASCII key (UTF-8)", headers: key("clé-1"), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "non-ASCII key (Latin-1)", headers: key("cl\xe9-1"), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "DEL in the key", headers: key("order\x7f1"), status: 400},
		{name: "control character in the key", headers: key("order\x011"), status: 400},
		{name: "NUL in the key", headers: key("order\x001"), status: 400},
		{name: "tab in the key", headers: key("order\t1"), status: 400, problem: testserver.ProblemKeyInvalid},
		{name: "two quoted keys in one line", headers: key(`"order-1", "order-2"`), status: 400, problem: testserver.ProblemKeyRepeated},
		{name: "two keys in one line", headers: key("order-1, order-2"), status: 400, problem: testserver.ProblemKeyRepeated},
		{name: "duplicate key headers", headers: append(key("order-1"), key("order-1")...), status: 400, problem: testserver.ProblemKeyRepeated},
		{name: "duplicate key headers, differing", headers: append(key("order-2"), key("order-3")...), status: 400, problem: testserver.ProblemKeyRepeated},
		{name: "duplicate key headers, one empty", headers: append(key("order-2"), key("")...), status: 400, problem: testserver.ProblemKeyRepeated},
		{name: "body larger than MaxBody", headers: key("order-4"), body: strings.Repeat("x", 1001), status: 413, problem: testserver.ProblemBodyTooLarge},
		{name: "chunked body larger than MaxBody", headers: append(key("order-4"), "Transfer-Encoding: chunked"),
			body: fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 1001, strings.Repeat("x", 1001)), status: 413, problem: testserver.ProblemBodyTooLarge},
		{name: "store unreachable", headers: key("order-5"), body: chargeBody, status: 503, problem: testserver.ProblemStoreUnavailable, down: true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before, runs := storeRows(t, store.p.Load().DB()), h.runs.Load()
			if row.down {
				if err := store.p.Load().Close(); err != nil {
					t.Fatal(err)
				}
			}
			resp, body := sendRaw(t, addr, rawRequest(row.headers, row.body))
			if row.down {
				store.p.Store(open())
			}
			if resp.StatusCode != row.status {
				t.Errorf("status %d (%q); want %d", resp.StatusCode, body, row.status)
			}
			if row.problem != "" {
				var p testserver.Problem
				if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("Content-Type %q; want application/problem+json", ct)
				} else if err := json.Unmarshal(body, &p); err != nil || p.Type != row.problem || p.Status != row.status || p.Detail == "" {
					t.Errorf("problem %+v (%v); want type %s, status %d and a detail", p, err, row.problem, row.status)
				}
			}
			if row.down && resp.Header.Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
			if h.runs.Load() != runs {
				t.Errorf("the handler ran")
			}
			after := storeRows(t, store.p.Load().DB())
			if strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("store changed:\n got %q\nwant %q", after, before)
			}
		})
	}
	// The store came back with what it held: the first key replays.
	if resp, _ := sendRaw(t, addr, rawRequest([]string{"Idempotency-Key: order-1"}, chargeBody)); resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || h.runs.Load() != 1 {
		t.Fatalf("order-1 after the bad input: %d, replayed %q, %d runs; want its replay", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), h.runs.Load())
	}
}
