package client

import (
	"net/http"
	"testing"
)

// DefaultBase returns c's default Base, or nil when Options.Base was set
// to something else than an *http.Transport.
func DefaultBase(c *Client) *http.Transport {
	t, _ := c.tr.Base.(*sender).base.(*http.Transport)
	return t
}

// SetHTTP2HealthCheck makes the default Base of the Clients that New
// makes until t ends check HTTP/2 connections with h.
func SetHTTP2HealthCheck(t testing.TB, h http.HTTP2Config) {
	old := http2HealthCheck
	http2HealthCheck = h
	t.Cleanup(func() { http2HealthCheck = old })
}
