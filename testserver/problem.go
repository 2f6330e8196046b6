package testserver

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem types sent by the Middleware, as the "type" member of its
// application/problem+json bodies (RFC 9457). Each is documented in the
// package README under the same anchor.
const (
	problemBase = "https://github.com/idemkit/idem/blob/main/testserver/README.md#"

	ProblemKeyMissing       = problemBase + "key-missing"        // 400: the method requires an Idempotency-Key
	ProblemKeyInvalid       = problemBase + "key-invalid"        // 400: ParseKey refused the header
	ProblemKeyRepeated      = problemBase + "key-repeated"       // 400: the header was sent more than once
	ProblemBodyUnreadable   = problemBase + "body-unreadable"    // 400: the request body could not be read; 408: not in time; 500: a handler outside the Middleware parsed it as a multipart form
	ProblemBodyTooLarge     = problemBase + "body-too-large"     // 413: the body is larger than MaxBody
	ProblemInFlight         = problemBase + "in-flight"          // 409: the key is being processed; retry after Retry-After
	ProblemTakenOver        = problemBase + "taken-over"         // 409: this worker lost its claim; retry to get the saved answer
	ProblemMismatch         = problemBase + "mismatch"           // 422: the key was first used with another request
	ProblemStoreUnavailable = problemBase + "store-unavailable"  // 503: the key store failed; nothing ran
	ProblemHandlerFailed    = problemBase + "handler-failed"     // 500: the handler panicked or sent less than its Content-Length
	ProblemResponseTooLarge = problemBase + "response-too-large" // 500 on replay: the first answer was larger than MaxSavedResponse
	ProblemLeaseEnded       = problemBase + "lease-ended"        // 503: the handler's lease ended before it answered anything
)

// Problem is an RFC 9457 problem details object, the body of every error
// the Middleware answers itself.
type Problem struct {
	Type   string `json:"type"`   // a URI naming the kind of problem (the Problem* constants)
	Title  string `json:"title"`  // a short summary of the kind, the same for every occurrence
	Status int    `json:"status"` // the HTTP status, repeated
	Detail string `json:"detail"` // what happened to this request, for a person
	// Key is the Idempotency-Key the problem is about, when there is one.
	Key string `json:"idempotency_key,omitempty"`
	// OriginalStatus is set on ProblemResponseTooLarge: the status of the
	// first answer, which was sent to the first caller but not saved.
	OriginalStatus int `json:"original_status,omitempty"`
}

// WriteProblem writes p as an application/problem+json response with status
// p.Status. When retryAfter is positive it also sets Retry-After, in seconds.
func WriteProblem(w http.ResponseWriter, p Problem, retryAfter int) {
	writeProblem(w, p, retryAfter, false)
}

// writeProblem is WriteProblem, the answer sent with its Content-Length
// when sized: complete once flushed, before the handler returns.
func writeProblem(w http.ResponseWriter, p Problem, retryAfter int, sized bool) {
	body := p.body()
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if sized {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}

func (p Problem) body() []byte {
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: only strings and ints
		panic(err)
	}
	return append(b, '\n')
}
