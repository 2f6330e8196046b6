package redirect

import (
	"net/http"
	"testing"
)

// chain returns n requests, each made to follow a redirect of the one
// before it, the last's Response leading to the one at loopTo (-1: to
// none, the first made by no redirect).
func chain(n, loopTo int) []*http.Request {
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = &http.Request{Method: http.MethodGet}
		if i > 0 {
			reqs[i].Response = &http.Response{Request: reqs[i-1]}
		}
	}
	if loopTo >= 0 {
		reqs[0].Response = &http.Response{Request: reqs[loopTo]}
	}
	return reqs
}

func TestWalk(t *testing.T) {
	for n := 1; n <= 8; n++ {
		reqs := chain(n, -1)
		var got []*http.Request
		Walk(reqs[n-1], func(r *http.Request) bool { got = append(got, r); return true })
		if len(got) != n-1 {
			t.Fatalf("a chain of %d: %d visited; want %d", n, len(got), n-1)
		}
		for i, r := range got {
			if r != reqs[n-2-i] {
				t.Fatalf("a chain of %d: visit %d is not the request %d before it", n, i, i+1)
			}
		}
		if First(reqs[n-1]) != reqs[0] {
			t.Fatalf("a chain of %d: First is not its first", n)
		}
		visits := 0
		Walk(reqs[n-1], func(*http.Request) bool { visits++; return false })
		if want := min(n-1, 1); visits != want {
			t.Fatalf("a chain of %d: %d visits after visit returned false; want %d", n, visits, want)
		}
	}
}

// TestWalkLoop: a chain whose first request's Response leads back into
// it (loopTo, its own included) is walked in at most 2n+2 visits.
func TestWalkLoop(t *testing.T) {
	for n := 1; n <= 20; n++ {
		for loopTo := range n {
			reqs := chain(n, loopTo)
			visits := 0
			Walk(reqs[n-1], func(*http.Request) bool {
				visits++
				return visits <= 10*n // a bound for the test, well above Walk's
			})
			if visits > 2*n+2 {
				t.Errorf("%d requests looping to request %d: %d visits; want at most %d", n, loopTo, visits, 2*n+2)
			}
		}
	}
}
