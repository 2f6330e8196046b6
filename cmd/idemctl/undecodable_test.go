package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/jackc/pgx/v5"
)

// damageHeaders makes the header of each of ops, in the jar that spec
// names, a string that is not the JSON the jars write: a record that does
// not decode (idem.RecordError).
func damageHeaders(t *testing.T, spec string, ops ...string) {
	t.Helper()
	alter(t, spec, "header = 'not json'", ops...)
}

// alter sets the columns of each of ops, in the jar that spec names, as
// set says ("header = 'not json'"), in SQL that both jars read alike.
func alter(t *testing.T, spec, set string, ops ...string) {
	t.Helper()
	for _, op := range ops {
		if dsn.IsURL(spec) {
			conn, err := pgx.Connect(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(t.Context(), "UPDATE idem_operations SET "+set+" WHERE op = $1", op)
			conn.Close(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		db, err := sql.Open("sqlite", "file:"+spec)
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.Exec("UPDATE operations SET "+set+" WHERE op = ?", op)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// listed returns the names in the first column of list's output, after its
// header.
func listed(out string) []string {
	var names []string
	for i, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); i > 0 && len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// wantSkipped fails t unless stderr says, one line each, that ops were
// skipped, in that order, and nothing else.
func wantSkipped(t *testing.T, what, stderr string, ops ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) != len(ops) {
		t.Errorf("%s: stderr %q; want one line for each of %q", what, stderr, ops)
		return
	}
	for i, op := range ops {
		if !strings.HasPrefix(lines[i], "idemctl: "+op+": skipped: its record does not decode") || !strings.Contains(lines[i], "key ") {
			t.Errorf("%s: stderr line %q; want it to say that %s was skipped, with its key", what, lines[i], op)
		}
	}
}

// TestUndecodableRecordHidesNoOther: a record whose header does not decode
// fails neither list, export nor resume --all for the others, each said on
// stderr with exit status 1, wherever it lies in a page; forget removes it
// unless it is pending.
func TestUndecodableRecordHidesNoOther(t *testing.T) { eachJar(t, testUndecodableRecordHidesNoOther) }

func testUndecodableRecordHidesNoOther(t *testing.T, srv *server, path string) {
	// List's order: the four settled operations (created at one time, by
	// name), then charge:p1 and charge:p2. Pages of two: the damaged ones
	// begin the second and third pages.
	setPageSize(t, 2)
	damageHeaders(t, path, "charge:failed", "charge:p1")
	code, out, errOut := idemctl("--jar", path, "list")
	if want := []string{"charge:abandoned", "charge:done", "charge:reconcile", "charge:p2"}; code != 1 || !slices.Equal(listed(out), want) {
		t.Errorf("list: exit %d, stdout %q; want exit 1 and %q listed", code, out, want)
	}
	wantSkipped(t, "list", errOut, "charge:failed", "charge:p1")
	if !strings.Contains(errOut, "forget removes it") || !strings.Contains(errOut, "forget refuses a pending operation") {
		t.Errorf("list: stderr %q; want it to say what forget does with each", errOut)
	}
	code, out, errOut = idemctl("--jar", path, "list", "--status", "pending")
	if want := []string{"charge:p2"}; code != 1 || !slices.Equal(listed(out), want) {
		t.Errorf("list --status pending: exit %d, stdout %q; want exit 1 and %q listed", code, out, want)
	}
	wantSkipped(t, "list --status pending", errOut, "charge:p1")

	code, _, errOut = idemctl("--jar", path, "show", "charge:failed")
	wantError(t, code, errOut, 1, "charge:failed: its record does not decode")
	if !strings.Contains(errOut, "key key-failed, failed, stored ") || !strings.Contains(errOut, "forget removes it") || strings.Contains(errOut, path+" is not a key jar") {
		t.Errorf("show of a record that does not decode: %q; want its key and state, and what forget does, not the jar said damaged", errOut)
	}
	// Shown by its key, as a server's log names it.
	code, _, errOut = idemctl("--jar", path, "show", "key-failed")
	wantError(t, code, errOut, 1, "charge:failed: its record does not decode")
	if !strings.Contains(errOut, "key key-failed, failed, stored ") || !strings.Contains(errOut, "forget removes it") || strings.Contains(errOut, path+" is not a key jar") {
		t.Errorf("show by key of a record that does not decode: %q; want its key and state, and what forget does, not the jar said damaged", errOut)
	}

	code, out, errOut = idemctl("--jar", path, "export")
	var exp []exported
	if err := json.Unmarshal([]byte(out), &exp); err != nil {
		t.Fatalf("export: %v; stdout %q", err, out)
	}
	var ops []string
	for _, e := range exp {
		ops = append(ops, e.Op)
	}
	if want := []string{"charge:abandoned", "charge:done", "charge:reconcile", "charge:p2"}; code != 1 || !slices.Equal(ops, want) {
		t.Errorf("export: exit %d, operations %q; want exit 1 and %q", code, ops, want)
	}
	wantSkipped(t, "export", errOut, "charge:failed", "charge:p1")

	code, out, errOut = idemctl("--jar", path, "resume", "--all", "--without-credentials")
	if code != 1 || !strings.HasPrefix(out, "charge:p2: 201 Created") || !strings.Contains(errOut, "idemctl: charge:p1: skipped") {
		t.Errorf("resume --all: exit %d, stdout %q, stderr %q; want exit 1, charge:p2 resumed and charge:p1 skipped", code, out, errOut)
	}

	// By name: the record's problem, as show says it, not the jar's.
	code, _, errOut = idemctl("--jar", path, "resume", "charge:p1")
	wantError(t, code, errOut, 1, "charge:p1: its record does not decode")
	if !strings.Contains(errOut, "not resumed") || !strings.Contains(errOut, "pending") || strings.Contains(errOut, path+" is not a key jar") {
		t.Errorf("resume of a record that does not decode: %q; want it named, pending and not resumed, not the jar said damaged", errOut)
	}

	code, out, errOut = idemctl("--jar", path, "forget", "charge:failed")
	if code != 0 || out != "charge:failed: forgotten\n" {
		t.Errorf("forget of a record that does not decode: exit %d, stdout %q, stderr %q; want it forgotten", code, out, errOut)
	}
	if _, err := jarState(t, path, "charge:failed"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("after forget, charge:failed: %v; want ErrNotFound", err)
	}
	code, _, errOut = idemctl("--jar", path, "forget", "charge:p1")
	wantError(t, code, errOut, 1, "charge:p1 is pending")
	var re *idem.RecordError
	if _, err := jarState(t, path, "charge:p1"); !errors.As(err, &re) || re.Record.State != idem.StatePending {
		t.Errorf("after forget, charge:p1: %v; want its record kept, pending and undecodable", err)
	}
}

// TestAbandonUndecodable: abandon of a pending record that does not decode
// marks it abandoned with the reason given, under its key, the record kept
// otherwise (its header as damaged as it was), after which resume leaves it
// and forget removes it; not while a live process holds its lease, and not
// one whose outcome is known.
func TestAbandonUndecodable(t *testing.T) { eachJar(t, testAbandonUndecodable) }

func testAbandonUndecodable(t *testing.T, srv *server, path string) {
	damageHeaders(t, path, "charge:p1", "charge:done")
	const reason = "no charge in the ledger"
	code, _, errOut := idemctl("--jar", path, "abandon", "charge:done", "--reason", reason)
	wantError(t, code, errOut, 1, "charge:done: its record does not decode")
	if !strings.Contains(errOut, "not abandoned, its outcome is known") {
		t.Errorf("abandon of a done record that does not decode: %q; want it refused, its outcome known", errOut)
	}

	alter(t, path, fmt.Sprintf("holder = 'worker-7', lease_until = %d", time.Now().Add(time.Hour).UnixNano()), "charge:p1")
	code, _, errOut = idemctl("--jar", path, "abandon", "charge:p1", "--reason", reason)
	wantError(t, code, errOut, 1, "charge:p1: held by worker-7 until ")
	alter(t, path, "holder = '', lease_until = NULL", "charge:p1")

	code, out, errOut := idemctl("--jar", path, "abandon", "charge:p1", "--reason", reason)
	if code != 0 || !strings.HasPrefix(out, "charge:p1: abandoned;") || errOut != "" {
		t.Fatalf("abandon of a pending record that does not decode: exit %d, stdout %q, stderr %q; want it abandoned", code, out, errOut)
	}
	var re *idem.RecordError
	if _, err := jarState(t, path, "charge:p1"); !errors.As(err, &re) || re.Record.State != idem.StateAbandoned ||
		re.Record.Note != reason || re.Record.Key == "" || re.Record.Attempts != 1 {
		t.Errorf("after abandon, charge:p1: %v, %+v; want it abandoned with the reason, its key and attempts kept, and its header as it was", err, re)
	}
	code, out, _ = idemctl("--jar", path, "abandon", "charge:p1", "--reason", "again")
	if code != 0 || !strings.Contains(out, "already abandoned") || !strings.Contains(out, reason) {
		t.Errorf("second abandon: exit %d, stdout %q; want it already abandoned, with the first reason", code, out)
	}
	code, out, _ = idemctl("--jar", path, "resume", "--all", "--without-credentials")
	if code != 0 || !strings.HasPrefix(out, "charge:p2: 201 Created") || strings.Contains(out, "charge:p1") {
		t.Errorf("resume --all: exit %d, stdout %q; want charge:p2 resumed alone", code, out)
	}
	if code, out, errOut := idemctl("--jar", path, "forget", "charge:p1"); code != 0 || out != "charge:p1: forgotten\n" {
		t.Errorf("forget of the abandoned record: exit %d, stdout %q, stderr %q; want it forgotten", code, out, errOut)
	}
}

// TestUnknownState: a record whose state is none of idem's, which keyjar's
// table does not refuse (pgjar's CHECK does), does not decode: show says
// so with its key and its state, escaped, list skips it, abandon refuses
// it for that state (not for an outcome known), and forget removes it.
func TestUnknownState(t *testing.T) {
	now := time.Now()
	path := jarWith(t, idem.Record{Op: "charge:1", Key: "k1", State: idem.StatePending, Method: "POST",
		URL: "http://127.0.0.1/v1/charges", Created: now, Updated: now})
	alter(t, path, "state = 'done\x1b[2J'", "charge:1")
	code, out, errOut := idemctl("--jar", path, "show", "charge:1")
	wantError(t, code, errOut, 1, `charge:1: its record does not decode`)
	if !strings.Contains(errOut, `key k1, "done\x1b[2J", stored `) || !strings.Contains(errOut, "forget removes it") || len(controls(out+errOut)) > 0 {
		t.Errorf("show: stdout %q, stderr %q; want its key and state, escaped, and what forget does", out, errOut)
	}
	code, out, errOut = idemctl("--jar", path, "list")
	if code != 1 || len(listed(out)) > 0 || len(controls(out+errOut)) > 0 {
		t.Errorf("list: exit %d, stdout %q, stderr %q; want exit 1 and nothing listed", code, out, errOut)
	}
	wantSkipped(t, "list", errOut, "charge:1")
	code, _, errOut = idemctl("--jar", path, "abandon", "charge:1", "--reason", "no charge in the ledger")
	wantError(t, code, errOut, 1, "not abandoned, its state is not one of idem's")
	if code, out, errOut := idemctl("--jar", path, "forget", "charge:1"); code != 0 || out != "charge:1: forgotten\n" {
		t.Errorf("forget: exit %d, stdout %q, stderr %q; want it forgotten", code, out, errOut)
	}
}
