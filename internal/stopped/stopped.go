// Package stopped lets package client read why the Transport stopped
// retrying when it returned the last retryable answer (a 503 after its
// attempts or the retry budget ran out), so that the *idem.PendingError
// client builds from that answer says it as the Transport's own does,
// without exported API for it.
package stopped

import (
	"context"
	"net/http"
)

type key struct{}

// Mark records why on resp's Request, a shallow copy of it with a context
// that holds it. It does nothing to a response without a Request.
func Mark(resp *http.Response, why string) {
	if resp == nil || resp.Request == nil {
		return
	}
	resp.Request = resp.Request.WithContext(context.WithValue(resp.Request.Context(), key{}, why))
}

// Reason returns what Mark recorded on resp, or "".
func Reason(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	why, _ := resp.Request.Context().Value(key{}).(string)
	return why
}
