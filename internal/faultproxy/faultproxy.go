// Package faultproxy is an HTTP reverse proxy on 127.0.0.1 that injects the
// network faults an idempotency key exists for, one request at a time:
//
//   - DropResponse: the request is forwarded, the server answers (and so has
//     committed its work), and the client's connection is closed without the
//     answer. The client cannot tell this from a request that never arrived.
//   - Reset: the client's connection is reset (TCP RST) before anything is
//     forwarded. Nothing happened on the server.
//   - Delay: the request is held for Proxy.Delay, longer than the client's
//     attempt timeout, and then forwarded anyway: the server commits after
//     the client gave up on that attempt, possibly after its retry.
//
// Which fault request number i gets is decided by Proxy.Seed and i alone
// (math/rand/v2, PCG seeded with (Seed, i)), so a run is reproducible even
// though concurrent requests arrive in varying order.
//
// Why not github.com/Shopify/toxiproxy/v2 (v2.5.0) as a library: its toxics
// act on TCP byte streams, not HTTP requests. "Let the server answer, then
// drop the answer" needs to know where a response ends, and a keep-alive
// connection carries many requests, while a toxic's Toxicity is drawn once
// per connection from the global math/rand source, so a run cannot be
// reproduced from a seed. Toxics register themselves in a global registry
// from init functions, and the module brings Prometheus, zerolog and
// gorilla/mux into go.mod. An HTTP-aware proxy on net/http, which hijacks
// the client connection to drop or reset it, is a hundred lines.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is what the proxy does with one request.
type Kind int

const (
	// Forward sends the request upstream and the answer back.
	Forward Kind = iota
	// DropResponse forwards the request, reads the whole answer, and closes
	// the client connection without sending it.
	DropResponse
	// Reset resets the client connection before forwarding anything.
	Reset
	// Delay holds the request for Proxy.Delay, then forwards it.
	Delay
)

func (k Kind) String() string {
	switch k {
	case Forward:
		return "forward"
	case DropResponse:
		return "drop-response"
	case Reset:
		return "reset"
	case Delay:
		return "delay"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Rates are the probabilities, each in [0, 1] and summing to at most 1, that
// a request gets each fault. The rest are forwarded untouched.
type Rates struct {
	DropResponse float64
	Reset        float64
	Delay        float64
}

// ErrBadRates is returned by Proxy.Start and Rates.Validate when a rate is outside [0, 1] or
// the rates sum to more than 1.
var ErrBadRates = errors.New("faultproxy: each rate must be in [0, 1] and their sum at most 1")

// ErrNotLoopback is returned by Proxy.Start when Target is not on a loopback
// address: this proxy breaks connections on purpose and is for tests and
// labs on one machine only.
var ErrNotLoopback = errors.New("faultproxy: target must be a loopback http URL")

// Validate returns an error wrapping ErrBadRates when r is not a valid set
// of probabilities.
func (r Rates) Validate() error {
	in := func(x float64) bool { return x >= 0 && x <= 1 }
	if in(r.DropResponse) && in(r.Reset) && in(r.Delay) && r.DropResponse+r.Reset+r.Delay <= 1 {
		return nil
	}
	return fmt.Errorf("%w: drop %v, reset %v, delay %v", ErrBadRates, r.DropResponse, r.Reset, r.Delay)
}

// Stats are the proxy's counters.
type Stats struct {
	Received       int64 `json:"received"`        // requests read from clients
	Forwarded      int64 `json:"forwarded"`       // requests sent upstream (Forward, DropResponse, Delay)
	Answered       int64 `json:"answered"`        // answers written back (a client that hung up may not get its answer)
	Dropped        int64 `json:"dropped"`         // answers withheld (DropResponse)
	Reset          int64 `json:"reset"`           // connections reset before forwarding (Reset)
	Delayed        int64 `json:"delayed"`         // requests held for Delay
	UpstreamErrors int64 `json:"upstream_errors"` // requests the upstream did not answer
}

type counters struct {
	received, forwarded, answered, dropped, reset, delayed, upstreamErrors atomic.Int64
}

// Proxy is a fault-injecting reverse proxy. Set its fields, call Start, and
// send requests to URL. Do not change the fields after Start. Every fault
// and timer ends with Close.
type Proxy struct {
	// Target is the upstream base URL, such as "http://127.0.0.1:8080". It
	// must be plain http on a loopback host.
	Target string

	// Seed makes the faults reproducible: request number i (from 0, in
	// arrival order) gets the fault Fault(i) returns.
	Seed uint64

	// Rates are the probabilities of each fault. The zero value forwards
	// every request.
	Rates Rates

	// Delay is how long a Delay fault holds a request. Zero means 1 s. Set
	// it longer than the clients' attempt timeout.
	Delay time.Duration

	// Transport sends requests upstream. Nil means a transport of the
	// proxy's own, closed with it.
	Transport http.RoundTripper

	// UpstreamTimeout bounds one upstream round trip, body included. Zero
	// means 30 s. Upstream requests are not cancelled when the client hangs
	// up: a request the proxy forwards runs to its end, as it would on a
	// real network.
	UpstreamTimeout time.Duration

	// MaxBody bounds request and response bodies, in bytes; a larger
	// request is refused with 413. Zero means 1 MiB.
	MaxBody int64

	target  *url.URL
	ln      net.Listener
	srv     *http.Server
	own     *http.Transport
	ctx     context.Context // cancelled by Close: ends delays and upstream calls
	cancel  context.CancelFunc
	mu      sync.Mutex // guards closing and wg.Add
	closing bool
	wg      sync.WaitGroup
	next    atomic.Uint64
	stats   counters
	// wait holds a Delay fault; nil means a timer. Tests replace it.
	wait func(ctx context.Context, d time.Duration) error
}

// Start validates the fields, listens on 127.0.0.1 on a port the system
// chooses, and serves in the background until Close.
func (p *Proxy) Start() error {
	if err := p.Rates.Validate(); err != nil {
		return err
	}
	u, err := url.Parse(p.Target)
	if err != nil || u.Scheme != "http" || !loopback(u.Hostname()) {
		return fmt.Errorf("%w: %q", ErrNotLoopback, p.Target)
	}
	p.target = u
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("faultproxy: listen: %w", err)
	}
	p.ln = ln
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if p.Transport == nil {
		p.own = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// URL returns the proxy's base URL, "http://127.0.0.1:<port>".
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Addr returns the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Fault returns the fault that request number i gets. It depends on Seed,
// Rates and i only.
func (p *Proxy) Fault(i uint64) Kind {
	x := rand.New(rand.NewPCG(p.Seed, i)).Float64()
	r := p.Rates
	switch {
	case x < r.DropResponse:
		return DropResponse
	case x < r.DropResponse+r.Reset:
		return Reset
	case x < r.DropResponse+r.Reset+r.Delay:
		return Delay
	}
	return Forward
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	c := &p.stats
	return Stats{Received: c.received.Load(), Forwarded: c.forwarded.Load(), Answered: c.answered.Load(),
		Dropped: c.dropped.Load(), Reset: c.reset.Load(), Delayed: c.delayed.Load(),
		UpstreamErrors: c.upstreamErrors.Load()}
}

// Shutdown stops accepting requests and waits until every request already
// received is finished: delayed ones forwarded, answers read. If ctx ends
// first, it closes the proxy as Close does and returns ctx's error.
func (p *Proxy) Shutdown(ctx context.Context) error {
	if p.srv == nil {
		return nil // never started
	}
	_ = p.srv.Shutdown(ctx)
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return p.Close()
	case <-ctx.Done():
		_ = p.Close()
		return ctx.Err()
	}
}

// Close stops the proxy at once: it closes the listener and the client
// connections, abandons held and forwarded requests, and waits for its
// handlers to return.
func (p *Proxy) Close() error {
	if p.srv == nil {
		return nil // never started
	}
	err := p.srv.Close()
	p.cancel()
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.wg.Wait()
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
	return err
}

func (p *Proxy) maxBody() int64 {
	if p.MaxBody > 0 {
		return p.MaxBody
	}
	return 1 << 20
}

func (p *Proxy) delay() time.Duration {
	if p.Delay > 0 {
		return p.Delay
	}
	return time.Second
}

func (p *Proxy) transport() http.RoundTripper {
	if p.Transport != nil {
		return p.Transport
	}
	return p.own
}

// ServeHTTP applies request's fault. It is the proxy's handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		hangUp(w, true)
		return
	}
	defer p.wg.Done()
	i := p.next.Add(1) - 1
	p.stats.received.Add(1)
	kind := p.Fault(i)

	// Read the body first: a held request must still have it after its
	// client hung up.
	body, err := io.ReadAll(io.LimitReader(r.Body, p.maxBody()+1))
	switch {
	case err != nil:
		hangUp(w, true)
		return
	case int64(len(body)) > p.maxBody():
		http.Error(w, "faultproxy: request body too large", http.StatusRequestEntityTooLarge)
		return
	}

	switch kind {
	case Reset:
		p.stats.reset.Add(1)
		hangUp(w, true)
		return
	case Delay:
		p.stats.delayed.Add(1)
		if err := p.hold(p.ctx, p.delay()); err != nil {
			hangUp(w, true)
			return
		}
	}

	resp, rbody, err := p.forward(r, body)
	if err != nil {
		p.stats.upstreamErrors.Add(1)
		http.Error(w, "faultproxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	if kind == DropResponse {
		p.stats.dropped.Add(1)
		hangUp(w, false)
		return
	}
	h := w.Header()
	for k, vs := range resp.Header {
		if !hopByHop(k) {
			h[k] = vs
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(rbody)))
	w.WriteHeader(resp.StatusCode)
	if _, err := w.Write(rbody); err == nil {
		p.stats.answered.Add(1)
	}
}

// enter counts a handler in, unless the proxy is closing.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	p.wg.Add(1)
	return true
}

func (p *Proxy) hold(ctx context.Context, d time.Duration) error {
	if p.wait != nil {
		return p.wait(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// forward sends the request upstream and reads the whole answer. It is
// bound to the proxy's lifetime, not to the client's connection.
func (p *Proxy) forward(r *http.Request, body []byte) (*http.Response, []byte, error) {
	timeout := p.UpstreamTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	out := r.Clone(ctx)
	out.RequestURI = ""
	u := *p.target
	u.Path, u.RawPath = singleJoin(p.target.Path, r.URL.Path), ""
	u.RawQuery = r.URL.RawQuery
	out.URL = &u
	out.Host = p.target.Host
	for k := range out.Header {
		if hopByHop(k) {
			out.Header.Del(k)
		}
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	p.stats.forwarded.Add(1)
	resp, err := p.transport().RoundTrip(out)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	rbody, err := io.ReadAll(io.LimitReader(resp.Body, p.maxBody()+1))
	if err != nil {
		return nil, nil, err
	}
	if int64(len(rbody)) > p.maxBody() {
		return nil, nil, fmt.Errorf("faultproxy: upstream answer longer than %d bytes", p.maxBody())
	}
	return resp, rbody, nil
}

func singleJoin(base, path string) string {
	switch {
	case base == "" || base == "/":
		return path
	case len(path) > 0 && path[0] == '/' && base[len(base)-1] == '/':
		return base + path[1:]
	}
	return base + path
}

// hangUp takes the client connection from net/http and closes it without an
// answer: with a TCP reset when reset is true (SO_LINGER 0), with a normal
// close otherwise.
func hangUp(w http.ResponseWriter, reset bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): abort the handler, which resets the stream.
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func hopByHop(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
		return true
	}
	return false
}
