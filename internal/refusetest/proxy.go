package refusetest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
)

// Proxy returns an http.Transport whose Proxy function fails with err for
// every request, which net/http returns before it dials, and how many
// dials it made (each one fails).
func Proxy(err error) (tr *http.Transport, dials func() int) {
	var n atomic.Int32
	return &http.Transport{
		Proxy: func(*http.Request) (*url.URL, error) { return nil, err },
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			n.Add(1)
			return nil, errors.New("dialled")
		},
	}, func() int { return int(n.Load()) }
}
