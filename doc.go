// Package idem makes non-idempotent HTTP calls (charge a card, send an
// email, append a row: any POST) safe to retry.
//
// A Transport gives each logical operation one Idempotency-Key (a UUID v4),
// persists it in a Jar before the first byte is sent, and retries with the
// same key on network errors, 408, 409, 425, 429, 502, 503 and 504. The server claims
// the key atomically and replays its first answer, so a retry never charges
// twice. Because the key is in the jar, an operation whose outcome is
// unknown when the process dies is resumed after a restart with the same
// key, by the next call under its name: the jar lists the pending ones,
// each with its request, which Record.NewRequest rebuilds. After the
// retry horizon (24 h) it is handed to reconciliation instead.
//
//	jar, err := keyjar.Open(ctx, "keys.db", nil)
//	if err != nil { ... }
//	defer jar.Close()
//	hc := &http.Client{Transport: &idem.Transport{Jar: jar}}
//	ctx = idem.WithOperation(ctx, "charge:order-42")
//	req, err := http.NewRequestWithContext(ctx, "POST", url, body)
//	if err != nil { ... }
//	resp, err := hc.Do(req)
//	if err != nil { ... }
//	defer resp.Body.Close()
//
// The root package defines the Jar interface and imports no jar: keyjar
// (SQLite) and keyjar/pgjar (PostgreSQL) implement it, as net/http/cookiejar
// implements http.CookieJar. MemoryJar is for tests and for programs
// that accept losing their keys on exit. Package client adds
// typed errors, Pending, Resume and Abandon on top; package testserver is
// the reference server side.
package idem
