package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/retry"
)

// stalledBodyRT answers every request with status, its headers at once,
// and a body that sends nothing until the request's context ends: a server
// that stalls after the headers.
type stalledBodyRT struct{ status int }

func (s stalledBodyRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	pr, pw := io.Pipe()
	context.AfterFunc(r.Context(), func() { pw.CloseWithError(r.Context().Err()) })
	return &http.Response{StatusCode: s.status, Status: http.StatusText(s.status), Header: http.Header{},
		Body: pr, ContentLength: -1, Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// TestStalledAnswerBodyEndsTheCall: the body that Do reads for a
// StatusError, and PostJSON for its value, is read for no longer than the
// Policy's AttemptTimeout: a body that stalls after the headers held the
// call, and Close with it, without end.
func TestStalledAnswerBodyEndsTheCall(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusOK} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, err := client.New(context.Background(), "", &client.Options{Jar: &idem.MemoryJar{}, Base: stalledBodyRT{status},
					Policy: retry.Policy{AttemptTimeout: time.Second}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel() // ends the stalled body if the call did not
				start := time.Now()
				var out struct{}
				if status == http.StatusOK {
					_, err = c.PostJSON(ctx, "charge:1", "http://127.0.0.1:1/charges", struct{}{}, &out)
				} else {
					req, _ := http.NewRequest("POST", "http://127.0.0.1:1/charges", strings.NewReader(`{}`))
					_, err = c.Do(ctx, "charge:1", req)
				}
				if d := time.Since(start); d != time.Second {
					t.Errorf("the call returned after %v; want the AttemptTimeout, 1s", d)
				}
				var se *client.StatusError
				switch {
				case status == http.StatusOK && !errors.Is(err, context.DeadlineExceeded):
					t.Errorf("PostJSON: %v; want the deadline of the body's read", err)
				case status != http.StatusOK && !errors.As(err, &se):
					t.Errorf("Do: %v; want a *client.StatusError", err)
				}
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		})
	}
}
