package reconnect

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// hungPool returns a pool of at most one connection to a server that
// accepts connections and never answers, as a PostgreSQL server that hangs
// or a network that drops its packets: every connection the pool makes is
// one end of a net.Pipe whose other end nobody reads. It is closed, and
// the pipes with it, when t ends.
func hungPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:5432/db?sslmode=disable&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		peers []net.Conn
	)
	cfg.ConnConfig.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	cfg.ConnConfig.DialFunc = func(context.Context, string, string) (net.Conn, error) {
		c, s := net.Pipe()
		mu.Lock()
		peers = append(peers, s)
		mu.Unlock()
		return c, nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, s := range peers {
			s.Close()
		}
	})
	return pool
}

// TestAcquireNoConnection: when no connection comes within the bound
// (the server does not answer, or the pool's connections are all busy),
// Acquire's error says so, and still wraps context.DeadlineExceeded.
// Before, it was pgxpool's bare "context deadline exceeded", which a
// store returned as it was ("pgstore: claim: context deadline exceeded"):
// nothing told a database that does not answer from the caller's own
// deadline. When the caller's context ends first, its error is returned
// as it is.
func TestAcquireNoConnection(t *testing.T) {
	for _, tc := range []struct {
		name     string
		busy     bool // the pool's one connection is taken
		deadline time.Duration
		want     string // in the error; "" for the caller's own error alone
	}{
		{"server does not answer", false, time.Minute, "no connection to the database within 10s"},
		{"every connection busy", true, time.Minute, "no connection to the database within 10s"},
		{"caller's deadline first", false, time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pool := hungPool(t)
				if tc.busy {
					// Taken in the background, it is busy until the test
					// ends: its connect never completes.
					go pool.Acquire(t.Context())
					synctest.Wait()
				}
				ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
				defer cancel()
				start := time.Now()
				conn, _, _, err := Acquire(ctx, pool, 10*time.Second)
				if conn != nil {
					t.Fatal("Acquire returned a connection")
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Acquire = %v; want an error wrapping context.DeadlineExceeded", err)
				}
				if tc.want == "" {
					if err == nil || err.Error() != context.DeadlineExceeded.Error() {
						t.Errorf("Acquire = %v; want the caller's context's error as it is", err)
					}
				} else if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Acquire = %v; want it to say %q", err, tc.want)
				}
				if d, want := time.Since(start), min(tc.deadline, 10*time.Second); d != want {
					t.Errorf("Acquire returned after %v; want %v", d, want)
				}
			})
		})
	}
}
