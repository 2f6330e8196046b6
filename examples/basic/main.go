// Command basic wraps an http.Client with idem against a local server that
// fails the first attempt, then shows that a restart reuses the same key.
//
//	go run ./examples/basic
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/retry"
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.SetFlags(0)
		log.Fatal(err)
	}
}

// server is a tiny payments API: it drops the first attempt of each key
// with a 503 and remembers the answer it gave each key, a 201 and its
// body, which it replays, as an idempotency-aware server does.
type server struct {
	out     io.Writer
	mu      sync.Mutex
	seen    map[string]int
	answers map[string]string
	charges int
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[key]++
	fmt.Fprintf(s.out, "  server: attempt %d with key %s\n", s.seen[key], key)
	if s.seen[key] == 1 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if a, ok := s.answers[key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, a)
		return
	}
	s.charges++
	s.answers[key] = fmt.Sprintf(`{"charge":"ch_%d"}`, s.charges)
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, s.answers[key])
}

func run(out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &server{out: out, seen: map[string]int{}, answers: map[string]string{}}
	go http.Serve(ln, srv)
	url := "http://" + ln.Addr().String() + "/v1/charges"

	dir, err := os.MkdirTemp("", "idem-basic-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keys.db")

	for i, what := range []string{"first run", "after a restart (jar reopened)"} {
		fmt.Fprintf(out, "%d. %s\n", i+1, what)
		if err := charge(out, path, url); err != nil {
			return err
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	fmt.Fprintf(out, "the server charged %d time(s)\n", srv.charges)
	return nil
}

// charge opens the jar, sends one named operation and closes the jar, as
// one run of a program would.
func charge(out io.Writer, path, url string) error {
	ctx := context.Background()
	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		return err
	}
	defer jar.Close()
	hc := &http.Client{Transport: &idem.Transport{Jar: jar, Policy: retry.Policy{InitialInterval: 1}}}

	ctx = idem.WithOperation(ctx, "charge:order-42")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":4200,"currency":"eur"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	rec, err := jar.Get(ctx, "charge:order-42")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  client: %d %s replayed=%v; jar: key %s, state %s, %d attempt(s)\n",
		resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed") == "true", rec.Key, rec.State, rec.Attempts)
	return nil
}
