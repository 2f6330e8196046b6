package pgstore_test

import (
	"context"
	"log"
	"time"

	"github.com/idemkit/idem/testserver/pgstore"
)

// Every server instance opens the same database; the first one creates the
// schema, and they share the keys.
func ExampleOpen() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, "postgres://idem@db.internal:5432/idem?sslmode=verify-full&pool_max_conns=20",
		&pgstore.Options{QueryTimeout: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// Prune keys older than the retention, a batch at a time.
	if _, err := store.Prune(ctx, time.Now().Add(-48*time.Hour), 10_000); err != nil {
		log.Print(err)
	}
}
