package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Relay is a TCP relay on 127.0.0.1 in front of a PostgreSQL server that
// can lose the answer to a statement the server applied, as a connection
// that breaks after the commit does, and tells when it found the server
// down. It reads the server's side of the
// protocol (sslmode=disable, as the cluster's DSNs have it) message by
// message.
type Relay struct {
	ln     net.Listener
	target string
	drop   []string // the startup parameters to remove from each session (Dropping)

	refused chan struct{} // see Refused

	mu    sync.Mutex
	lose  string // the command tag to lose the next answer of; "" for none
	lost  chan struct{}
	hold  string        // the command tag to hold the next answer of; "" for none
	held  chan struct{} // closed once that answer is held
	let   chan struct{} // closed to pass it on
	done  chan struct{} // closed by close, which passes nothing on
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewRelay starts a relay to the server dsn names, which t's end closes,
// and returns it and dsn with the relay's address in place of the server's.
func NewRelay(t testing.TB, dsn string) (*Relay, string) {
	t.Helper()
	return newRelay(t, dsn, nil)
}

// newRelay is NewRelay, the relay removing the startup parameters drop
// from each session.
func newRelay(t testing.TB, dsn string, drop []string) (*Relay, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: u.Host, drop: drop, refused: make(chan struct{}, 1), conns: make(map[net.Conn]struct{}), done: make(chan struct{})}
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	u.Host = ln.Addr().String()
	return r, u.String()
}

// LoseNext makes the relay lose the next answer to a statement whose
// command tag begins with tag ("UPDATE", say): when that CommandComplete
// comes from the server, the relay closes both connections instead of
// passing it on. The server sends it once the statement has committed (it
// flushes its answers with ReadyForQuery, after the Sync that ends an
// implicit transaction). The returned channel is closed once an answer was
// lost.
func (r *Relay) LoseNext(tag string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lose, r.lost = tag, make(chan struct{})
	return r.lost
}

// HoldNext makes the relay hold the next answer to a statement whose
// command tag begins with tag ("UPDATE", say): when that CommandComplete
// comes from the server, which sends it once the statement has committed
// (see LoseNext), the relay closes held and passes it on, and what follows
// it, only once let is called. The client waits for the answer meanwhile,
// as across a slow network, and its context may end while the statement
// is committed. let may be called more than once.
func (r *Relay) HoldNext(tag string) (held <-chan struct{}, let func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, l := make(chan struct{}), make(chan struct{})
	r.hold, r.held, r.let = tag, h, l
	var once sync.Once
	return h, func() { once.Do(func() { close(l) }) }
}

// Refused returns a channel that receives when the relay could not reach
// the server for a client (it then closed the client's connection), as
// while the server is down. Refusals that nobody received in between count
// as one.
func (r *Relay) Refused() <-chan struct{} { return r.refused }

// refuse signals a refusal on r.refused, unless one is pending there.
func (r *Relay) refuse() {
	select {
	case r.refused <- struct{}{}:
	default:
	}
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			r.refuse() // before the close, which the client sees
			c.Close()
			continue
		}
		if !r.track(c, s) {
			return
		}
		r.wg.Go(func() {
			if len(r.drop) == 0 || dropStartup(c, s, r.drop) == nil {
				io.Copy(s, c)
			}
			s.Close()
			c.Close()
		})
		r.wg.Go(func() {
			r.answers(c, s)
			s.Close()
			c.Close()
		})
	}
}

// track records the two connections of one client, or closes them and
// reports false when the relay is closed.
func (r *Relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

// answers passes the server's messages to the client, one at a time, until
// either side closes or an answer is to be lost.
func (r *Relay) answers(client, server net.Conn) {
	var head [5]byte // type, length (which counts itself)
	for {
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[1:])
		if n < 4 {
			return
		}
		msg := make([]byte, 5+int(n)-4)
		copy(msg, head[:])
		if _, err := io.ReadFull(server, msg[5:]); err != nil {
			return
		}
		if head[0] == 'C' && r.loses(msg[5:]) {
			return
		}
		if head[0] == 'C' {
			if let := r.holds(msg[5:]); let != nil {
				select {
				case <-let:
				case <-r.done:
					return
				}
			}
		}
		if _, err := client.Write(msg); err != nil {
			return
		}
	}
}

// loses reports whether the CommandComplete with tag is the one to lose,
// and disarms the relay when it is.
func (r *Relay) loses(tag []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lose == "" || !bytes.HasPrefix(tag, []byte(r.lose)) {
		return false
	}
	r.lose = ""
	close(r.lost)
	return true
}

// holds returns, when the CommandComplete with tag is the one to hold, the
// channel that lets it pass, and disarms the relay; nil otherwise.
func (r *Relay) holds(tag []byte) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hold == "" || !bytes.HasPrefix(tag, []byte(r.hold)) {
		return nil
	}
	r.hold = ""
	close(r.held)
	return r.let
}

func (r *Relay) close() {
	close(r.done)
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

// CallDuringRestart restarts c, calls call in a goroutine while the server
// is down, and starts the server again once r refused a connection during
// call, as it does to call's first statement: call runs across the restart.
// It returns call's error, once call returned, and fails t when the restart
// failed.
func CallDuringRestart(t testing.TB, c *Cluster, r *Relay, call func() error) error {
	t.Helper()
	return callDuringRestart(t, c.Restart, r, call)
}

// callDuringRestart is CallDuringRestart with restart for c.Restart.
func callDuringRestart(t testing.TB, restart func(context.Context, func()) error, r *Relay, call func() error) error {
	t.Helper()
	result := make(chan error, 1)
	err := restart(t.Context(), func() {
		// A refusal still pending is an earlier call's: a retry of it
		// refused after its restart had received the first.
		select {
		case <-r.refused:
		default:
		}
		go func() { result <- call() }()
		<-r.refused
	})
	if err != nil {
		t.Fatal(err)
	}
	return <-result
}
