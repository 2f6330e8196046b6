package main

import (
	"strings"
	"testing"
)

// TestPostgresLockTimeoutHint: the line of a statement that ran out of
// --lock-timeout says what of the command that ran it may need a longer
// one, and names no other command: show by key reads the whole jar, list,
// export and resume --all read it a page per statement, prune counts what
// is due first; abandon, forget and resume of one operation read and write
// that one alone.
func TestPostgresLockTimeoutHint(t *testing.T) {
	srv := newServer(t)
	dsn := seedPostgres(t, srv)
	opened := lockTableOnceOpen(t, dsn)
	for _, c := range []struct {
		args    []string
		want    string
		notWant []string
	}{
		{[]string{"show", "charge:done"}, "show by key", nil},
		{[]string{"list"}, "list reads", []string{"show"}},
		{[]string{"export"}, "export reads", []string{"show"}},
		{[]string{"prune", "--older-than", "1h"}, "prune counts", []string{"show"}},
		{[]string{"abandon", "charge:reconcile", "--reason", "x"}, "waiting for another process", []string{"show", "a large jar"}},
		{[]string{"forget", "charge:done"}, "waiting for another process", []string{"show", "a large jar"}},
		{[]string{"resume", "--all", "--header", "Authorization: " + secret, "--host", srv.URL}, "resume --all reads", []string{"show"}},
		{[]string{"resume", "charge:p1", "--header", "Authorization: " + secret, "--host", srv.URL}, "waiting for another process", []string{"show", "a large jar"}},
	} {
		// The open's own statements run under --lock-timeout too, and on
		// a loaded machine one may run out of 100ms before the command's
		// do: such a run says nothing of the command, and is run again.
		var code int
		var errOut string
		for range 5 {
			*opened = false
			code, _, errOut = idemctl(append([]string{"--jar", dsn, "--lock-timeout", "100ms"}, c.args...)...)
			if *opened {
				break
			}
		}
		if !*opened {
			t.Fatalf("%s: the jar did not open in 5 runs: exit %d, stderr %q", c.args[0], code, errOut)
		}
		if code != 1 || !strings.Contains(errOut, "ran out of --lock-timeout (100ms)") || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1, ran out of --lock-timeout, and %q", c.args[0], code, errOut, c.want)
		}
		for _, bad := range c.notWant {
			if strings.Contains(errOut, bad) {
				t.Errorf("%s: stderr %q; want no %q: it does not apply to %s", c.args[0], errOut, bad, c.args[0])
			}
		}
	}
}
