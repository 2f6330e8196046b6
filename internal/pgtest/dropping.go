package pgtest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Dropping starts a relay on 127.0.0.1 in front of the server dsn names
// that removes the startup parameters names from each new session, as
// PgBouncer does with those its ignore_startup_parameters lists, and
// passes everything else on as it is. It returns dsn with the relay's
// address in place of the server's; t's end closes the relay and its
// connections.
func Dropping(t testing.TB, dsn string, names ...string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	target := u.Host
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() { dropRelay(c, target, names, track) })
		}
	})
	u.Host = ln.Addr().String()
	return u.String()
}

// dropRelay reads c's startup message, refusing TLS, sends it to target
// without names, and then copies both ways until either side closes.
func dropRelay(c net.Conn, target string, names []string, track func(net.Conn)) {
	defer c.Close()
	b := pgproto3.NewBackend(c, c)
	var sm *pgproto3.StartupMessage
	for sm == nil {
		msg, err := b.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.Write([]byte{'N'}); err != nil {
				return
			}
		case *pgproto3.StartupMessage:
			sm = m
		default:
			return
		}
	}
	for _, name := range names {
		delete(sm.Parameters, name)
	}
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	track(s)
	defer s.Close()
	buf, err := sm.Encode(nil)
	if err != nil {
		return
	}
	if _, err := s.Write(buf); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); s.Close(); done <- struct{}{} }()
	go func() { io.Copy(c, s); c.Close(); done <- struct{}{} }()
	<-done
	<-done
}
