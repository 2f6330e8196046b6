package pgjar_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Workers that share a database share their operations: whichever begins
// "charge:order-42" first creates its key, every other worker sends that
// same key, one at a time, and any of them resumes what a dead one left
// pending.
func ExampleOpen() {
	ctx := context.Background()
	jar, err := pgjar.Open(ctx, "postgres://worker@db.internal:5432/app?sslmode=verify-full", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close() // after the Client's Close, which leaves it open
	c, err := client.New(ctx, "", &client.Options{Jar: jar})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.PostJSON(ctx, "charge:order-42", "https://payco.example/charges", map[string]any{"amount": 4200}, nil); err != nil {
		log.Print(err)
	}
	pending, err := c.Pending(ctx) // every worker's, the dead ones' included
	if err != nil {
		log.Fatal(err)
	}
	for _, rec := range pending {
		if _, err := c.Resume(ctx, rec.Op); err != nil {
			log.Print(err)
		}
	}
}

// A service that keeps its own tables in a database keeps its jar there
// too, on the pool it runs: the jar's statements run under READ COMMITTED
// and within the server's statement_timeout, and its keys reach stable
// storage before Begin returns (synchronous_commit is on, the server's
// default, which New checks).
func ExampleNew() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig("postgres://app@db.internal:5432/app?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "5s" // the jar's QueryTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // after the jar's Close, which leaves it open
	jar, err := pgjar.New(ctx, pool, &pgjar.Options{QueryTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err) // pgjar.ErrPool: the pool's settings do not suit the jar
	}
	defer jar.Close()

	c, err := client.New(ctx, "", &client.Options{Jar: jar})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.PostJSON(ctx, "charge:order-42", "https://payco.example/charges", map[string]any{"amount": 4200}, nil); err != nil {
		log.Print(err)
	}
	// The service's own statements share the pool.
	if _, err := pool.Exec(ctx, `UPDATE orders SET charged = true WHERE id = 42`); err != nil {
		log.Fatal(err)
	}
}

// What the Transport does with the jar, for code that sends an operation
// by other means: begin it, take its lease, and record the outcome.
func ExampleJar_Acquire() {
	ctx := context.Background()
	jar, err := pgjar.Open(ctx, "postgres://worker@db.internal:5432/app?sslmode=verify-full", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close()

	now := time.Now()
	rec, created, err := jar.Begin(ctx, idem.Record{
		Op: "charge:order-42", Key: "0b6f6f8e-4f4b-4d0e-9a63-2f7d1c1f4f2a", State: idem.StatePending,
		Method: http.MethodPost, URL: "https://payco.example/charges", Created: now, Updated: now,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Key, created)

	// A holder id from idem.NewHolder names this process, so that if it dies
	// holding the lease, a restart on this host takes it over at once.
	holder, err := idem.NewHolder()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := jar.Acquire(ctx, rec.Op, holder, now, time.Minute); err != nil {
		log.Fatal(err) // idem.ErrLeased: another worker is sending it
	}
	// … send the request with Idempotency-Key: rec.Key, then record the outcome:
	if _, err := jar.Update(ctx, rec.Op, holder, idem.Change{
		Now: time.Now(), State: idem.StateDone, Attempts: 1, LastStatus: 201, Release: true,
	}); err != nil {
		log.Fatal(err) // idem.ErrLeaseLost: the lease expired and another worker took over
	}
}
