// Package testserver is the reference server side of idem: an
// http.Handler middleware (Middleware) that runs each request carrying an
// Idempotency-Key at most once per scope and key and replays its first
// answer to every retry, over a Store (MemoryStore here; sqlitestore and
// pgstore for files and fleets) that claims keys atomically and fences
// late writes. storetest is the conformance suite of stores, payments a
// small payments API behind the middleware, and cmd/idemserver runs it.
// README.md in this directory has the decision table, the problem types
// and the choices.
package testserver
