package pgstore_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/pgstore"
)

// Every server instance opens the same database; the first one creates the
// schema, and they share the keys. The Middleware puts them in front of an
// existing handler, and prunes the keys older than its Retention.
func ExampleOpen() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, "postgres://idem@db.internal:5432/idem?sslmode=verify-full&pool_max_conns=20",
		&pgstore.Options{QueryTimeout: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	mw := &testserver.Middleware{Store: store, LockTimeout: time.Minute} // the same on every instance
	go func() {
		// At start, then hourly: instances restarted more often than
		// hourly (deploys, a crash loop) never prune if the first prune
		// waits an hour.
		for tick := time.Tick(time.Hour); ; <-tick {
			if _, err := mw.Prune(ctx); err != nil {
				log.Print(err)
			}
		}
	}()
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Wrap(charges))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// charges is the application's handler, which knows nothing of keys.
var charges = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
})
