package retry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"syscall"

	"github.com/idemkit/idem/retry"
)

// Classify judges one attempt's answer, or its error. A retryable status
// that the server replayed (Idempotent-Replayed: true) is its saved answer
// for the key, final like any other.
func ExampleClassify() {
	answer := func(code int, replayed bool) *http.Response {
		resp := &http.Response{StatusCode: code, Header: http.Header{}}
		if replayed {
			resp.Header.Set("Idempotent-Replayed", "true")
		}
		return resp
	}
	for _, c := range []struct {
		what string
		resp *http.Response
		err  error
	}{
		{"201", answer(201, false), nil},
		{"409", answer(409, false), nil},
		{"503", answer(503, false), nil},
		{"503 replayed", answer(503, true), nil},
		{"422", answer(422, false), nil},
		{"500", answer(500, false), nil},
		{"connection reset", nil, syscall.ECONNRESET},
		{"unexpected EOF", nil, io.ErrUnexpectedEOF},
		{"context canceled", nil, context.Canceled},
	} {
		fmt.Printf("%-17s %v\n", c.what, retry.Classify(c.resp, c.err))
	}
	// Output:
	// 201               final
	// 409               retry
	// 503               retry
	// 503 replayed      final
	// 422               stop
	// 500               final
	// connection reset  retry
	// unexpected EOF    retry
	// context canceled  stop
}
