package faultproxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/faultproxy"
)

// upstream is a server that counts requests and echoes the path, query and
// body.
type upstream struct {
	srv   *httptest.Server
	calls atomic.Int64
	seen  chan string // receives each request's body, when not nil
}

func newUpstream(t *testing.T, seen chan string) *upstream {
	t.Helper()
	u := &upstream{seen: seen}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		if u.seen != nil {
			u.seen <- string(b)
		}
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+string(b))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func start(t *testing.T, p *faultproxy.Proxy) *faultproxy.Proxy {
	t.Helper()
	if err := p.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func checkStats(t *testing.T, p *faultproxy.Proxy, want faultproxy.Stats) {
	t.Helper()
	if got := p.Stats(); got != want {
		t.Fatalf("Stats: got %+v; want %+v", got, want)
	}
}

// freshClient opens a new connection per request, so that net/http never
// re-sends a request on its own after a dropped connection.
func freshClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

func post(ctx context.Context, c *http.Client, url, body string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestStartRefusesBadConfig(t *testing.T) {
	up := newUpstream(t, nil)
	cases := []struct {
		name string
		p    *faultproxy.Proxy
		want error
	}{
		{"negative rate", &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Reset: -0.1}}, faultproxy.ErrBadRates},
		{"rate above one", &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Delay: 1.5}}, faultproxy.ErrBadRates},
		{"sum above one", &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{DropResponse: 0.5, Reset: 0.4, Delay: 0.2}}, faultproxy.ErrBadRates},
		{"remote host", &faultproxy.Proxy{Target: "http://example.com"}, faultproxy.ErrNotLoopback},
		{"remote address", &faultproxy.Proxy{Target: "http://10.0.0.1:80"}, faultproxy.ErrNotLoopback},
		{"https", &faultproxy.Proxy{Target: "https://127.0.0.1:443"}, faultproxy.ErrNotLoopback},
		{"not a URL", &faultproxy.Proxy{Target: "::"}, faultproxy.ErrNotLoopback},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Start()
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start: got %v; want %v", err, tc.want)
			}
			// A proxy that never started closes as a no-op.
			if err := tc.p.Shutdown(t.Context()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if err := tc.p.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

func TestListensOnLoopbackOnly(t *testing.T) {
	up := newUpstream(t, nil)
	p := start(t, &faultproxy.Proxy{Target: up.srv.URL})
	tcp, ok := p.Addr().(*net.TCPAddr)
	if !ok || !tcp.IP.Equal(net.IPv4(127, 0, 0, 1)) || tcp.Port == 0 {
		t.Fatalf("Addr: got %v; want 127.0.0.1 with a chosen port", p.Addr())
	}
	if !strings.HasPrefix(p.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL: got %q", p.URL())
	}
}

func TestFaultIsDeterministicBySeed(t *testing.T) {
	rates := faultproxy.Rates{DropResponse: 0.3, Reset: 0.3, Delay: 0.3}
	a := &faultproxy.Proxy{Seed: 1, Rates: rates}
	b := &faultproxy.Proxy{Seed: 1, Rates: rates}
	c := &faultproxy.Proxy{Seed: 2, Rates: rates}
	const n = 10000
	counts := map[faultproxy.Kind]int{}
	differ := 0
	for i := range uint64(n) {
		k := a.Fault(i)
		if k2 := b.Fault(i); k2 != k {
			t.Fatalf("Fault(%d): seed 1 gave %v then %v", i, k, k2)
		}
		if c.Fault(i) != k {
			differ++
		}
		counts[k]++
	}
	if differ == 0 {
		t.Fatal("seeds 1 and 2 gave the same faults for every request")
	}
	// 30 % each, 10 % forwarded: allow a wide margin around the expectation.
	for k, want := range map[faultproxy.Kind]int{faultproxy.DropResponse: 3000, faultproxy.Reset: 3000, faultproxy.Delay: 3000, faultproxy.Forward: 1000} {
		if got := counts[k]; got < want-300 || got > want+300 {
			t.Errorf("%v: got %d of %d; want about %d", k, got, n, want)
		}
	}
	zero := &faultproxy.Proxy{Seed: 7}
	for i := range uint64(1000) {
		if k := zero.Fault(i); k != faultproxy.Forward {
			t.Fatalf("zero rates: Fault(%d) = %v; want forward", i, k)
		}
	}
}

func TestForward(t *testing.T) {
	up := newUpstream(t, nil)
	p := start(t, &faultproxy.Proxy{Target: up.srv.URL, Seed: 1})
	resp, body, err := post(t.Context(), freshClient(), p.URL()+"/v1/charges?x=1", `{"a":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("got %d %v; want 201 with the upstream's headers", resp.StatusCode, resp.Header)
	}
	if want := `POST /v1/charges?x=1 {"a":1}`; body != want {
		t.Fatalf("body: got %q; want %q", body, want)
	}
	checkStats(t, p, faultproxy.Stats{Received: 1, Forwarded: 1, Answered: 1})
}

func TestDropResponseAfterTheServerAnswered(t *testing.T) {
	up := newUpstream(t, nil)
	p := start(t, &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{DropResponse: 1}})
	_, _, err := post(t.Context(), freshClient(), p.URL()+"/v1/charges", "x")
	if err == nil {
		t.Fatal("got an answer; want the connection closed without one")
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v; want EOF from the closed connection", err)
	}
	if got := up.calls.Load(); got != 1 {
		t.Fatalf("upstream calls: got %d; want 1 (the server did the work)", got)
	}
	checkStats(t, p, faultproxy.Stats{Received: 1, Forwarded: 1, Dropped: 1})
}

func TestResetBeforeForwarding(t *testing.T) {
	up := newUpstream(t, nil)
	p := start(t, &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Reset: 1}})
	_, _, err := post(t.Context(), freshClient(), p.URL()+"/v1/charges", "x")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("got %v; want ECONNRESET", err)
	}
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := up.calls.Load(); got != 0 {
		t.Fatalf("upstream calls: got %d; want 0", got)
	}
	checkStats(t, p, faultproxy.Stats{Received: 1, Reset: 1})
}

// gate is a Delay hold that the test releases: held receives when a request
// is held, and closing release lets it go.
type gate struct {
	held    chan time.Duration
	release chan struct{}
}

func newGate() *gate { return &gate{held: make(chan time.Duration, 8), release: make(chan struct{})} }

func (g *gate) wait(ctx context.Context, d time.Duration) error {
	g.held <- d
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestDelayOutlivesTheClientThenForwards(t *testing.T) {
	seen := make(chan string, 1)
	up := newUpstream(t, seen)
	g := newGate()
	p := &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Delay: 1}, Delay: 5 * time.Second}
	p.SetWait(g.wait)
	start(t, p)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(ctx, freshClient(), p.URL()+"/v1/charges", "late")
		errc <- err
	}()
	if d := <-g.held; d != 5*time.Second {
		t.Fatalf("held for %v; want Delay (5s)", d)
	}
	cancel() // the client's attempt times out while the request is held
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: got %v; want its own cancellation", err)
	}
	if got := up.calls.Load(); got != 0 {
		t.Fatalf("upstream calls while held: got %d; want 0", got)
	}
	close(g.release)
	if body := <-seen; body != "late" {
		t.Fatalf("upstream got body %q; want %q", body, "late")
	}
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Received != 1 || st.Delayed != 1 || st.Forwarded != 1 {
		t.Fatalf("Stats: got %+v; want 1 received, delayed and forwarded", st)
	}
}

func TestShutdownWaitsForHeldRequests(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGate()
	p := &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Delay: 1}}
	p.SetWait(g.wait)
	start(t, p)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(ctx, freshClient(), p.URL()+"/", "x")
		errc <- err
	}()
	<-g.held
	cancel()
	<-errc
	close(g.release)
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := up.calls.Load(); got != 1 {
		t.Fatalf("upstream calls after Shutdown: got %d; want 1 (the held request forwarded)", got)
	}
}

func TestCloseAbandonsHeldRequests(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGate() // never released: only Close ends the hold
	p := &faultproxy.Proxy{Target: up.srv.URL, Rates: faultproxy.Rates{Delay: 1}, Delay: time.Hour}
	p.SetWait(g.wait)
	start(t, p)
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t.Context(), freshClient(), p.URL()+"/", "x")
		errc <- err
	}()
	<-g.held
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Fatal("client got an answer from a closed proxy")
	}
	if got := up.calls.Load(); got != 0 {
		t.Fatalf("upstream calls: got %d; want 0", got)
	}
}

// TestOutcomesFollowTheSeed sends requests one at a time and checks that
// what a client observes for request i is what Fault(i) says, and that a
// second proxy with the same seed behaves the same.
func TestOutcomesFollowTheSeed(t *testing.T) {
	const n = 60
	rates := faultproxy.Rates{DropResponse: 0.25, Reset: 0.25, Delay: 0.25}
	run := func() []string {
		up := newUpstream(t, nil)
		p := &faultproxy.Proxy{Target: up.srv.URL, Seed: 42, Rates: rates}
		p.SetWait(func(context.Context, time.Duration) error { return nil })
		start(t, p)
		c := freshClient()
		var got []string
		for i := range n {
			before := up.calls.Load()
			_, _, err := post(t.Context(), c, p.URL()+"/", "x")
			reached := up.calls.Load() > before
			var obs string
			switch {
			case err == nil && reached:
				obs = "answered"
			case err != nil && reached:
				obs = "dropped"
			case err != nil && !reached:
				obs = "reset"
			default:
				t.Fatalf("request %d: answered without reaching upstream", i)
			}
			want := map[faultproxy.Kind]string{faultproxy.Forward: "answered", faultproxy.Delay: "answered",
				faultproxy.DropResponse: "dropped", faultproxy.Reset: "reset"}[p.Fault(uint64(i))]
			if obs != want {
				t.Fatalf("request %d: observed %s; Fault(%d) = %v", i, obs, i, p.Fault(uint64(i)))
			}
			got = append(got, obs)
		}
		st := p.Stats()
		if st.Received != n || st.Dropped+st.Reset+st.Delayed+(st.Answered-st.Delayed) != n {
			t.Fatalf("Stats: %+v do not add up to %d requests", st, n)
		}
		if st.Dropped == 0 || st.Reset == 0 || st.Delayed == 0 {
			t.Fatalf("Stats: %+v; want every fault at least once in %d requests", st, n)
		}
		return got
	}
	a, b := run(), run()
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Fatalf("same seed, different outcomes:\n%v\n%v", a, b)
	}
}
