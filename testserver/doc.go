// Package testserver is the reference server side of idem: an
// http.Handler middleware (Middleware) that runs each request carrying an
// Idempotency-Key at most once per scope and key and replays its first
// answer to every retry, over a Store (MemoryStore here; sqlitestore and
// pgstore for files and fleets) that claims keys atomically and fences
// late writes. storetest is the conformance suite of stores, payments a
// small payments API behind the middleware, and cmd/idemserver runs it.
// README.md in this directory has the decision table, the problem types
// and the choices.
//
// # Answering a failure
//
// A handler tells idem's clients whether to try again by its status.
// idem.Transport sends again, with the same key, what retry.Classify calls
// Retry: 408, 409, 425, 429, 502, 503 and 504, after their Retry-After, unless the
// answer is a replay (Idempotent-Replayed: true). A 500 is Final: the
// Transport returns it and marks the operation done.
//
// So a handler that fails for a time (a dependency down, a downstream
// timeout) answers 503 with Retry-After. Under the default ErrorPolicy,
// ReleaseClaim, the Middleware releases the claim after every status of
// 500 or more, 429, 408 and 425, and the client's retry runs the handler again. A
// 500 says the failure is final: its claim is released as well, and no
// idem client retries it within the call; but a later call that names the
// same operation sends it again under its key (idem.Transport asks again
// for a done operation's saved answer), and with the claim released the
// handler runs again. Under SaveError each of these answers is saved
// and replayed, and a replayed 503 is final too: a transient failure then
// sticks to its key.
//
// A handler that returns without answering anything once its lease ended
// (its context is done) answers 503 ProblemLeaseEnded, a failure as the
// others, never the empty 200 net/http would send.
//
// A panic answers 500, as does a call of runtime.Goexit (t.FailNow). A
// panic with http.ErrAbortHandler, and a body shorter than the
// Content-Length the handler set, break the connection off instead;
// when nothing of the answer was sent yet (it was smaller than
// MaxSavedResponse), idem.Transport retries that as any network error,
// with the same key.
package testserver
