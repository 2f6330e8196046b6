// Package redirect walks the redirect chain of a request that http.Client
// made to follow a redirect.
package redirect

import "net/http"

// Walk calls visit with each request before r in its redirect chain, the
// one redirected to r first and the chain's first last, until visit
// returns false. http.Client sets Response on a request it makes to follow
// a redirect, and that Response's Request is the one redirected. A chain
// that comes round to a request again, which http.Client does not make but
// a caller that sets Response by hand may, is walked until the loop shows,
// in at most twice as many visits as it has requests, and two.
func Walk(r *http.Request, visit func(*http.Request) bool) {
	slow := r // one step for two of r's: r comes round to it in a loop
	for i := 0; r.Response != nil && r.Response.Request != nil; i++ {
		r = r.Response.Request
		if r == slow || !visit(r) {
			return
		}
		if i%2 == 1 {
			slow = slow.Response.Request
		}
	}
}

// First returns the first request of r's redirect chain: r itself when no
// redirect made it, and the last one Walk visits in a chain that loops.
func First(r *http.Request) *http.Request {
	first := r
	Walk(r, func(prev *http.Request) bool { first = prev; return true })
	return first
}
