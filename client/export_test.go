package client

import "net/http"

// MaxIdleConnsPerHost returns the idle pool size per host of c's default
// Base, or -1 when Base is not an *http.Transport.
func MaxIdleConnsPerHost(c *Client) int {
	if t, ok := c.tr.Base.(*sender).base.(*http.Transport); ok {
		return t.MaxIdleConnsPerHost
	}
	return -1
}
