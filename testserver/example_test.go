package testserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/testserver"
)

func ExampleMiddleware() {
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})
	mw := &testserver.Middleware{Store: new(testserver.MemoryStore)}
	srv := httptest.NewServer(mw.Wrap(charge))
	defer srv.Close()

	send := func(key, body string) {
		req, err := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			panic(err)
		}
		if resp.StatusCode >= 400 {
			b = []byte(resp.Header.Get("Content-Type"))
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	send("order-42", `{"amount": 1000, "currency": "usd"}`)
	send("order-42", `{"currency": "usd", "amount": 1000}`) // same JSON, other order: a replay
	send("order-42", `{"amount": 2000, "currency": "usd"}`) // the key reused for another charge
	send("", `{"amount": 1000, "currency": "usd"}`)         // no key
	fmt.Println("charges:", charges.Load())
	s := mw.Stats()
	fmt.Println("claims:", s.Claims, "replays:", s.Replays, "mismatches:", s.Mismatches, "rejected:", s.Rejected)
	// Output:
	// 201 replayed="" {"id":"ch_1"}
	// 201 replayed="true" {"id":"ch_1"}
	// 422 replayed="" application/problem+json
	// 400 replayed="" application/problem+json
	// charges: 1
	// claims: 1 replays: 1 mismatches: 1 rejected: 1
}

func ExampleParseKey() {
	for _, v := range []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`, `"order-42"`, `"a", "b"`, ""} {
		key, err := testserver.ParseKey(v)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "order-42" <nil>
	// "" testserver: invalid Idempotency-Key "\"a\", \"b\"": text follows the closing quote; send exactly one key
	// "" testserver: invalid Idempotency-Key "": the key is empty; send 1 to 255 printable ASCII characters, e.g. a UUID
}
