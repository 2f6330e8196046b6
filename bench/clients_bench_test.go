package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem"
)

// charge is the request every client sends: a small JSON charge.
var charge = []byte(`{"amount":1000,"currency":"eur","order":"order-42","customer":"cus_8f2a"}`)

// BenchmarkClients: a plain http.Client, idem.Transport with a MemoryJar
// and go-retryablehttp (its StandardClient, as it is used under an
// http.Client), 1 and 32 callers, against one loopback server, over the
// same base transport (http.DefaultTransport with MaxIdleConnsPerHost 64).
func BenchmarkClients(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConns, base.MaxIdleConnsPerHost = 64, 64
	defer base.CloseIdleConnections()

	clients := []struct {
		name string
		hc   func() *http.Client
	}{
		{"plain", func() *http.Client { return &http.Client{Transport: base} }},
		{"idem", func() *http.Client {
			return &http.Client{Transport: &idem.Transport{Base: base, Jar: &idem.MemoryJar{}}}
		}},
		{"retryablehttp", func() *http.Client {
			rc := retryablehttp.NewClient()
			rc.HTTPClient = &http.Client{Transport: base}
			rc.Logger = nil
			return rc.StandardClient()
		}},
	}
	for _, callers := range []int{1, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			for _, c := range clients {
				b.Run("client="+c.name, func(b *testing.B) {
					hc := c.hc()
					send := func() error { return send(b.Context(), hc, srv.URL) }
					if callers == 1 {
						for b.Loop() {
							if err := send(); err != nil {
								b.Fatal(err)
							}
						}
						return
					}
					b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := send(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		})
	}
}

// send posts the charge and reads the answer to the end.
func send(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(charge))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d; want 200", resp.StatusCode)
	}
	return nil
}
