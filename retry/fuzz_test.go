package retry_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/retry"
)

func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"", "0", "7", "120", "-1", "1.5", " 3 ", "99999999999999999999",
		"Mon, 30 Nov 2026 12:01:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := retry.ParseRetryAfter(v, now)
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v; want never negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 when not ok", v, d)
		}
		// The same value through a response header gives the same answer.
		h := http.Header{}
		h.Set("Retry-After", v)
		d2, ok2 := retry.RetryAfter(&http.Response{Header: h}, now)
		if h.Get("Retry-After") == v && (d2 != d || ok2 != ok) {
			t.Fatalf("RetryAfter via header = %v, %v; want %v, %v", d2, ok2, d, ok)
		}
		// And so it does from a Date of now when the local clock is an
		// hour ahead: a date is measured from the Date.
		h.Set("Date", now.Format(http.TimeFormat))
		d3, ok3 := retry.RetryAfter(&http.Response{Header: h}, now.Add(time.Hour))
		if h.Get("Retry-After") == v && (d3 != d || ok3 != ok) {
			t.Fatalf("RetryAfter via header, Date an hour behind the clock = %v, %v; want %v, %v", d3, ok3, d, ok)
		}
		// A capped schedule never waits longer than the cap in-call.
		s := retry.Policy{MaxRetryAfter: 30 * time.Second, MaxElapsed: time.Hour}.Schedule()
		if wait, more, _ := s.Next(d, ok); more && wait > 30*time.Second {
			t.Fatalf("Retry-After %q: schedule waits %v in-call; want at most the 30s cap", v, wait)
		}
	})
}
