package keyjar_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar"
)

// A key persisted by Begin survives a restart: the program that opens the
// jar again and begins the same operation gets the same key back, and the
// credential it forgot to strip was never stored.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "keyjar-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keys.db")
	ctx := context.Background()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		log.Fatal(err)
	}
	rec, created, err := jar.Begin(ctx, idem.Record{
		Op:      "charge:order-42",
		Key:     "5f0c6d1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f",
		State:   idem.StatePending,
		Method:  http.MethodPost,
		URL:     "https://payments.example/charges",
		Header:  http.Header{"Authorization": {"Bearer sk_live_x"}, "Content-Type": {"application/json"}},
		Created: now,
		Updated: now,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first run:", rec.Key, "created:", created)
	if err := jar.Close(); err != nil {
		log.Fatal(err)
	}

	// A restart.
	jar, err = keyjar.Open(ctx, path, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close()
	rec, created, err = jar.Begin(ctx, idem.Record{
		Op: "charge:order-42", Key: "a-fresh-key-that-is-not-used", Created: now, Updated: now,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after restart:", rec.Key, "created:", created)
	fmt.Printf("stored headers: %v\n", rec.Header)
	fmt.Printf("withheld, for a resume to add: %v\n", rec.Withheld())
	fi, err := os.Stat(path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("file mode:", fi.Mode().Perm())
	// Output:
	// first run: 5f0c6d1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f created: true
	// after restart: 5f0c6d1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f created: false
	// stored headers: map[Authorization:[] Content-Type:[application/json]]
	// withheld, for a resume to add: [Authorization]
	// file mode: -rw-------
}

// The jar keeps every operation until it is pruned. A program that runs for
// long prunes now and then what was settled long ago; a pending operation
// is kept whatever its age, since its key is needed to resume it.
func ExampleJar_Prune() {
	dir, err := os.MkdirTemp("", "keyjar-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	jar, err := keyjar.Open(ctx, filepath.Join(dir, "keys.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close()

	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC) // a program passes time.Now()
	longAgo := now.AddDate(0, -2, 0)
	for _, r := range []idem.Record{
		{Op: "charge:order-41", Key: "k41", State: idem.StateDone, Created: longAgo, Updated: longAgo},
		{Op: "charge:order-42", Key: "k42", State: idem.StatePending, Created: longAgo, Updated: longAgo},
		{Op: "charge:order-43", Key: "k43", State: idem.StateDone, Created: now, Updated: now},
	} {
		if _, _, err := jar.Begin(ctx, r); err != nil {
			log.Fatal(err)
		}
	}

	n, err := jar.Prune(ctx, now.AddDate(0, -1, 0), 0) // settled more than a month ago
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pruned:", n)
	kept, err := jar.List(ctx, idem.Filter{})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range kept {
		fmt.Println("kept:", r.Op, r.State)
	}
	// Output:
	// pruned: 1
	// kept: charge:order-42 pending
	// kept: charge:order-43 done
}

// A program that only inspects or resumes the operations of a jar opens it
// with MustExist: a wrong path is an error, not a new, empty jar.
func ExampleOptions_mustExist() {
	dir, err := os.MkdirTemp("", "keyjar-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	path := filepath.Join(dir, "keys.db")
	mustExist := &keyjar.Options{MustExist: true}

	_, err = keyjar.Open(ctx, path, mustExist)
	fmt.Println("missing file:", errors.Is(err, fs.ErrNotExist))
	_, err = os.Stat(path)
	fmt.Println("file created:", err == nil)

	if err := os.WriteFile(path, nil, 0o600); err != nil {
		log.Fatal(err)
	}
	_, err = keyjar.Open(ctx, path, mustExist)
	fmt.Println("empty file:", errors.Is(err, keyjar.ErrCorrupt))

	// The program that sends creates the jar.
	jar, err := keyjar.Open(ctx, path, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, _, err := jar.Begin(ctx, idem.Record{Op: "charge:order-42", Key: "k42", State: idem.StatePending}); err != nil {
		log.Fatal(err)
	}
	if err := jar.Close(); err != nil {
		log.Fatal(err)
	}

	jar, err = keyjar.Open(ctx, path, mustExist)
	if err != nil {
		log.Fatal(err)
	}
	defer jar.Close()
	rec, err := jar.Get(ctx, "charge:order-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("existing jar:", rec.Op, rec.Key)
	// Output:
	// missing file: true
	// file created: false
	// empty file: true
	// existing jar: charge:order-42 k42
}
