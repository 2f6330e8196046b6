package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// TestShowNameThatIsAlsoAKey: show K of the operation named K, as one sent
// without a name under the caller's Idempotency-Key K is, says which other
// operations have K for their key too (one named, sent with the same
// Idempotency-Key), rather than show the one named K as if it were all
// that K finds; show by key of a key no operation is named shows them all,
// as before.
func TestShowNameThatIsAlsoAKey(t *testing.T) {
	now := time.Now()
	rec := func(op, key string) idem.Record {
		return idem.Record{Op: op, Key: key, Fingerprint: "fp", State: idem.StateDone, Method: "POST",
			URL: "http://127.0.0.1/v1/charges", Created: now, Updated: now, Attempts: 1, LastStatus: 201}
	}
	const k = "3f1c9b62-5d0e-4b8a-9a57-2c4e8f6d1a90"
	path := jarWith(t, rec(k, k), rec("charge:1", k), rec("charge:2", "other-key"))
	code, out, errOut := idemctl("--jar", path, "show", k)
	if code != 0 || !strings.HasPrefix(out, "op:") || strings.Count(out, "op:") != 1 || !strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(out, "op:")), k+"\n") {
		t.Fatalf("show %s: exit %d, stdout %q; want exit 0 and the operation named %s", k, code, out, k)
	}
	if !strings.Contains(errOut, "also the key of charge:1") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("show %s: stderr %q; want one line saying that it is also the key of charge:1", k, errOut)
	}
	code, out, errOut = idemctl("--jar", path, "show", "charge:2")
	if code != 0 || errOut != "" || !strings.Contains(out, "charge:2") {
		t.Fatalf("show charge:2: exit %d, stdout %q, stderr %q; want it alone, no note", code, out, errOut)
	}
}

// TestShowNameThatIsAlsoAKeyOfADamagedRecord: show K of the operation
// named K succeeds, its record printed and exit status 0, when the look
// for other operations with key K fails (here, another one's record does
// not decode; on a large PostgreSQL jar, the scan may run out of
// --lock-timeout): that look only adds a note, which then says it failed.
func TestShowNameThatIsAlsoAKeyOfADamagedRecord(t *testing.T) {
	now := time.Now()
	rec := func(op, key string) idem.Record {
		return idem.Record{Op: op, Key: key, Fingerprint: "fp", State: idem.StateDone, Method: "POST",
			URL: "http://127.0.0.1/v1/charges", Created: now, Updated: now, Attempts: 1, LastStatus: 201}
	}
	const k = "3f1c9b62-5d0e-4b8a-9a57-2c4e8f6d1a90"
	path := jarWith(t, rec(k, k), rec("charge:1", k))
	damageHeaders(t, path, "charge:1")
	code, out, errOut := idemctl("--jar", path, "show", k)
	if code != 0 || strings.Count(out, "op:") != 1 || !strings.Contains(out, k) {
		t.Fatalf("show %s: exit %d, stdout %q, stderr %q; want exit 0 and the operation named %s", k, code, out, errOut, k)
	}
	if !strings.Contains(errOut, "other operations with that key as theirs failed") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("show %s: stderr %q; want one line saying that the look for other operations with that key failed", k, errOut)
	}
}
