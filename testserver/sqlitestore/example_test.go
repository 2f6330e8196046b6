package sqlitestore_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/sqlitestore"
)

// The Middleware in front of an existing handler, its keys in a SQLite
// file: a retry that comes after the server restarted still gets the first
// answer, and the handler ran once.
func ExampleOpen() {
	var sent atomic.Int32
	send := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"id":"msg_%d"}`, sent.Add(1))
	})
	dir, err := os.MkdirTemp("", "sqlitestore-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "server.db") // created with mode 0600
	ctx := context.Background()

	for run := 1; run <= 2; run++ { // the second run is the server restarted
		store, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			log.Fatal(err)
		}
		mw := &testserver.Middleware{Store: store} // run mw.Prune(ctx) at start and then hourly
		mux := http.NewServeMux()
		mux.Handle("POST /v1/messages", mw.Wrap(send))
		srv := httptest.NewServer(mux)

		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(`{"to":"a@example.com"}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("run %d: %d replayed=%q %s\n", run, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)

		srv.Close()
		if err := store.Close(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("sent:", sent.Load())
	// Output:
	// run 1: 202 replayed="" {"id":"msg_1"}
	// run 2: 202 replayed="true" {"id":"msg_1"}
	// sent: 1
}
