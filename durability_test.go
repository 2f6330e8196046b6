package idem_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// The key is on disk before the first attempt reaches the server: the
// handler reads the jar file through its own connection, before it answers.
func TestKeyPersistedBeforeFirstSend(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer jar.Close()

	var mu sync.Mutex
	var sentKeys, foundKeys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Error(err)
			return
		}
		defer db.Close()
		var key string
		err = db.QueryRowContext(r.Context(), "SELECT key FROM operations WHERE op = ?", "charge:order-1").Scan(&key)
		mu.Lock()
		sentKeys = append(sentKeys, r.Header.Get(idem.KeyHeader))
		if err == nil {
			foundKeys = append(foundKeys, key)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	send := func(jar idem.Jar) {
		t.Helper()
		hc := &http.Client{Transport: &idem.Transport{Jar: jar}}
		req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, "charge:order-1"), http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send(jar)
	if len(foundKeys) != 1 || foundKeys[0] != sentKeys[0] || sentKeys[0] == "" {
		t.Fatalf("the handler found keys %q in the jar file while answering keys %q; want the sent key already there", foundKeys, sentKeys)
	}

	// A restart: close, open the file again, same operation name.
	if err := jar.Close(); err != nil {
		t.Fatal(err)
	}
	jar2, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer jar2.Close()
	send(jar2)
	if len(sentKeys) != 2 || sentKeys[1] != sentKeys[0] {
		t.Fatalf("after the restart the key sent was %q; want the first run's %q", sentKeys[1], sentKeys[0])
	}
}

var _ idem.Jar = (*keyjar.Jar)(nil)
