package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/ctlesc"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/secrethdr"
	"github.com/idemkit/idem/retry"
)

func flagString(fs *flag.FlagSet, name string) string { return fs.Lookup(name).Value.String() }

func oneArg(name string, args []string) (string, error) {
	if len(args) != 1 {
		return "", cliflag.Usagef("%s needs exactly one operation name, got %d arguments", name, len(args))
	}
	return args[0], nil
}

// checkOneArg returns the check of a command that takes one operation name.
func checkOneArg(name string) func(fs *flag.FlagSet, args []string) error {
	return func(_ *flag.FlagSet, args []string) error {
		_, err := oneArg(name, args)
		return err
	}
}

func checkList(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 {
		return cliflag.Usagef("list takes no arguments, got %s", dsn.Quote(args...))
	}
	if st := idem.State(flagString(fs, "status")); st != "" && !st.Valid() {
		return cliflag.Usagef("unknown --status %s: pending, done, failed, reconcile or abandoned", dsn.Quote(string(st)))
	}
	return nil
}

func list(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	st := idem.State(flagString(fs, "status"))
	// Each page is aligned on its own, and printed before the next is
	// read: the table's columns are as wide as the widest cell of their
	// page.
	tw := tabwriter.NewWriter(interruptible{ctx, s.stdout}, 0, 4, 2, ' ', 0)
	n, bad := 0, 0
	err := eachPage(ctx, s.jar, idem.Filter{State: st}, func(page []idem.Record) error {
		if n == 0 && len(page) > 0 {
			fmt.Fprintln(tw, "OP\tSTATE\tATTEMPTS\tSTORED\tLAST\tNEXT ATTEMPT\tNOTE")
		}
		for _, r := range page {
			if err := ctx.Err(); err != nil {
				return interrupted(err)
			}
			// The name whole, however long: an operator gives it back to
			// show, resume, abandon or forget, and two names cut alike
			// would name either.
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cell(r.Op, 0), cell(string(r.State), 0), r.Attempts,
				stamp(r.Created), cell(last(r), 40), stamp(r.NextAttempt), cell(r.Note, 60))
		}
		n += len(page)
		return tw.Flush()
	}, s.undecodable(&bad))
	if err != nil {
		return err
	}
	if bad > 0 {
		// Each said on stderr.
		return errFailed
	}
	if n == 0 {
		// With --status, "no operations" would read as an empty jar.
		what := "operations"
		if st != "" {
			what = string(st) + " " + what
		}
		fmt.Fprintln(s.stdout, "no", what)
	}
	return nil
}

// pageSize is how many operations list, export and resume --all read from
// the jar at a time, each page its own read (one statement): they hold a
// page in memory, not the jar, and a long walk keeps no read transaction
// open on a jar file, whose checkpoints it would hold back. Tests change
// it.
var pageSize = 1000

// errNotPaged is eachPage's error for a jar whose List does not honour
// idem.Filter's After and Limit (a jar of one's own, written before them):
// a walk would read its first page again and again.
var errNotPaged = errors.New("it cannot be read in pages: its List does not keep to idem.Filter's After and Limit")

// eachPage calls fn with the operations of jar that pass f, in List's
// order (oldest first), a page of at most pageSize at a time, each page
// read after the last operation of the one before: an operation deleted
// meanwhile changes nothing else, and one created meanwhile is read if it
// comes after the page being read. It returns fn's first error, or the
// jar's, and an interrupted error once ctx is done.
//
// A record that does not decode (*idem.RecordError) fails the List of its
// whole page: eachPage then reads that page again one record at a time
// (readPast), calls bad with each record that does not decode, and goes on
// past it, so that one damaged record hides no other.
func eachPage(ctx context.Context, jar client.Jar, f idem.Filter, fn func(page []idem.Record) error, bad func(*idem.RecordError)) error {
	f.Limit = pageSize
	for {
		if err := ctx.Err(); err != nil {
			return interrupted(err)
		}
		page, err := jar.List(ctx, f)
		n, last := len(page), idem.Cursor{}
		if n > 0 {
			last = page[n-1].Cursor()
		}
		if re := (*idem.RecordError)(nil); errors.As(err, &re) {
			page, n, last, err = readPast(ctx, jar, f, bad)
		}
		if err != nil {
			return err
		}
		if n > f.Limit {
			return fmt.Errorf("this jar (%T): %w", jar, errNotPaged)
		}
		for i, r := range page {
			if prev := f.After; i > 0 || !prev.IsZero() {
				if i > 0 {
					prev = page[i-1].Cursor()
				}
				if prev.Compare(r.Cursor()) >= 0 {
					return fmt.Errorf("this jar (%T): %w", jar, errNotPaged)
				}
			}
		}
		if err := fn(page); err != nil {
			return err
		}
		if n < f.Limit {
			return nil
		}
		f.After = last
	}
}

// readPast reads the page of f (its After and Limit) one record at a time,
// as List could not read it whole: it returns the records that decode, how
// many it read, those that do not decode included, and the cursor of the
// last one, and calls bad with each that does not decode. A record that
// does not decode and is not after the one before (a jar whose List does
// not keep to f) ends it with its error.
func readPast(ctx context.Context, jar client.Jar, f idem.Filter, bad func(*idem.RecordError)) (page []idem.Record, n int, last idem.Cursor, err error) {
	one := f
	one.Limit = 1
	for n < f.Limit { // each round reads one record, or ends
		if err := ctx.Err(); err != nil {
			return nil, 0, last, interrupted(err)
		}
		recs, err := jar.List(ctx, one)
		var re *idem.RecordError
		switch {
		case errors.As(err, &re):
			c := re.Record.Cursor()
			if !one.After.IsZero() && one.After.Compare(c) >= 0 {
				return nil, 0, last, err
			}
			if bad != nil {
				bad(re)
			}
			one.After = c
		case err != nil:
			return nil, 0, last, err
		case len(recs) == 0:
			return page, n, last, nil
		case len(recs) > 1:
			return nil, 0, last, fmt.Errorf("this jar (%T): %w", jar, errNotPaged)
		default:
			page = append(page, recs[0])
			one.After = recs[0].Cursor()
		}
		n++
		last = one.After
	}
	return page, n, last, nil
}

// undecodable returns the bad function of eachPage for a command that
// reads the records of s.jar: it says on stderr which record does not
// decode, and counts it in *n.
func (s *session) undecodable(n *int) func(*idem.RecordError) {
	return func(re *idem.RecordError) {
		*n++
		r := re.Record
		fmt.Fprintf(s.stderr, "idemctl: %s: skipped: its record does not decode (%s); key %s, %s, stored %s; %s\n",
			cell(r.Op, 0), oneLine(re.Error()), cell(r.Key, 0), cell(string(r.State), 0), stamp(r.Created), undecodedAdvice(r))
	}
}

func show(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	op, err := oneArg("show", args)
	if err != nil {
		return err
	}
	r, err := s.jar.Get(ctx, op)
	if errors.Is(err, idem.ErrNotFound) {
		// Perhaps a key, as a server's log shows it: an operation without
		// a name has a UUID v7 of its own, not its key.
		found, err := byKey(ctx, s.jar, op)
		if re := (*idem.RecordError)(nil); errors.As(err, &re) && re.Record.Key == op {
			return undecoded(re)
		}
		if err != nil {
			return err
		}
		if len(found) == 0 {
			return fmt.Errorf("no operation named %s and none with that key in %s", dsn.Quote(op), s.path)
		}
		for i, rec := range found {
			if i > 0 {
				fmt.Fprintln(s.stdout)
			}
			if err := showRecord(s, rec); err != nil {
				return err
			}
		}
		return nil
	}
	if re := (*idem.RecordError)(nil); errors.As(err, &re) && re.Record.Op == op {
		return undecoded(re)
	}
	if err != nil {
		return err
	}
	if err := showRecord(s, r); err != nil {
		return err
	}
	if r.Key != op {
		return nil
	}
	// Named by its key, as an operation sent without a name under the
	// caller's Idempotency-Key is: other operations sent with that key
	// (under names of their own) are what show by key would find too.
	// Another operation whose key is the name of one with a key of its
	// own is not looked for: that would read all of the jar for every
	// name.
	found, err := byKey(ctx, s.jar, op)
	if err != nil && ctx.Err() == nil {
		// An aside: the operation named op was shown, and show succeeds.
		// The look fails on another record with that key that does not
		// decode, or on a large PostgreSQL jar past --lock-timeout.
		why := oneLine(s.describe(err).Error())
		if re := (*idem.RecordError)(nil); errors.As(err, &re) {
			why = "the record of " + cell(re.Record.Op, 0) + ", which has that key, does not decode: show " + cell(re.Record.Op, 0) + " says more"
		}
		fmt.Fprintf(s.stderr, "idemctl: note: show printed the operation named %s; the look for other operations with that key as theirs failed: %s\n", cell(op, 0), why)
		return nil
	}
	if err != nil {
		return err
	}
	var others []string
	for _, rec := range found {
		if rec.Op != op {
			others = append(others, cell(rec.Op, 0))
		}
	}
	if len(others) > 0 {
		const most = 5
		list := strings.Join(others[:min(len(others), most)], ", ")
		if len(others) > most {
			list += fmt.Sprintf(" and %d more", len(others)-most)
		}
		fmt.Fprintf(s.stderr, "idemctl: note: %s is also the key of %s: show printed the operation named %s; show those by name\n", cell(op, 0), list, cell(op, 0))
	}
	return nil
}

// undecoded is show's error for a record that does not decode: one record
// damaged, not the jar, said with what did decode.
func undecoded(re *idem.RecordError) error {
	r := re.Record
	return fmt.Errorf("%s: its record does not decode (%s); key %s, %s, stored %s; %s",
		cell(r.Op, 0), re.Err, cell(r.Key, 0), cell(string(r.State), 0), stamp(r.Created), undecodedAdvice(r))
}

// byKey returns the operations of jar whose key is key. Every jar idemctl
// opens (keyjar, pgjar) finds them on the database's side; no index leads
// from keys to operations, so it reads them all.
func byKey(ctx context.Context, jar client.Jar, key string) ([]idem.Record, error) {
	bk, ok := jar.(interface {
		ByKey(ctx context.Context, key string) ([]idem.Record, error)
	})
	if !ok {
		return nil, fmt.Errorf("this jar (%T) cannot look operations up by key", jar)
	}
	return bk.ByKey(ctx, key)
}

func showRecord(s *session, r idem.Record) error {
	tw := tabwriter.NewWriter(s.stdout, 0, 4, 1, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	field("op", cell(r.Op, 0))
	field("key", cell(r.Key, 0))
	field("state", cell(string(r.State), 0))
	field("request", cell(r.Method+" "+dsn.MaskURL(r.URL), 0))
	h := shownHeader(r.Header)
	for _, name := range sortedKeys(h) {
		switch {
		case name == idem.AddedCredentials && len(h[name]) == 0:
			// No header of that name: its program added credentials to
			// each attempt, as client.Options.Header does.
			field("header", "credentials its program added to each attempt, as client.Options.Header does (not stored)")
		case secrethdr.IsWithheld(name, h[name]):
			// Withheld: the first send carried it, a resume must too.
			field("header", cell(name, 0)+" (not stored)")
		}
		for _, v := range h[name] {
			field("header", cell(name+": "+v, 0))
		}
	}
	switch {
	case r.BodySize == 0:
		field("body", "none")
	case !r.BodyStored():
		field("body", fmt.Sprintf("%d bytes, not stored: %s", r.BodySize, onlyItsProgram))
	case utf8.Valid(r.Body):
		field("body", fmt.Sprintf("%d bytes: %s", r.BodySize, cell(string(r.Body), 2000)))
	default:
		field("body", fmt.Sprintf("%d bytes, binary", r.BodySize))
	}
	field("fingerprint", cell(r.Fingerprint, 0))
	field("key stored", stamp(r.Created))
	field("updated", stamp(r.Updated))
	field("attempts", strconv.Itoa(r.Attempts))
	field("last", cell(last(r), 0))
	field("next attempt", stamp(r.NextAttempt))
	field("note", cell(r.Note, 0))
	// As a jar's Acquire and the Transport read it: a lease whose time has
	// passed holds nothing, and one whose holder process on this host is
	// gone is taken over at once by a resume here.
	lease := "free"
	switch held := fmt.Sprintf("held by %s until %s", cell(r.Holder, 0), stamp(r.LeaseUntil)); {
	case r.Holder == "":
	case !time.Now().Before(r.LeaseUntil):
		lease = "free (" + held + ", which has passed)"
	case idem.HolderGone(r.Holder):
		lease = "free on this host (" + held + ", a process that is gone)"
	default:
		lease = held
	}
	field("lease", lease)
	return tw.Flush()
}

// headerFlag is the repeatable --header 'Name: value'. A value that is not
// one is remembered in bad, not refused by Set: the flag package would
// quote it in its error, and it may hold a credential.
type headerFlag struct {
	h   http.Header
	bad bool
}

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	if !f.add(v) {
		f.bad = true
	}
	return nil
}

// add adds the header line v, and reports whether it is 'Name: value'
// that net/http sends: a name that is a token, a value without control
// characters but tabs. net/http refuses another only once the resume has
// counted the attempt in the jar. The name is taken as given: net/http
// refuses a name with a space or tab around it rather than send it
// trimmed, as net/textproto refuses "X-A : v" in a header it reads, so
// "X-A : v" is refused, not sent as X-A. The value loses the spaces, tabs,
// CRs and LFs around it, as net/http takes them off a value it writes, and
// nothing else: strings.TrimSpace would also take a vertical tab (which
// net/http refuses in a value) or a no-break space (which it sends) off a
// value's ends.
func (f *headerFlag) add(v string) bool {
	name, value, ok := strings.Cut(v, ":")
	value = textproto.TrimString(value)
	if !ok || name == "" || strings.IndexFunc(name, notTokenChar) >= 0 ||
		strings.IndexFunc(value, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }) >= 0 {
		return false
	}
	if f.h == nil {
		f.h = make(http.Header)
	}
	f.h.Add(textproto.CanonicalMIMEHeaderKey(name), value)
	return true
}

// notTokenChar reports whether r may not be in a header's name, a token
// (RFC 9110, section 5.6.2).
func notTokenChar(r rune) bool {
	return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
}

// notAHeader is the error for a header line that is not 'Name: value', or
// not one that can be sent. It does not quote the line, which may hold a
// credential.
const notAHeader = "a header is not 'Name: value', with no space or separator in its name and no control character in its value (not shown: it may hold a credential)"

func resumeFlags(fs *flag.FlagSet) {
	fs.Bool("all", false, "resume every pending operation, oldest first")
	fs.Var(&headerFlag{}, "header", "a header to send, 'Name: value' (repeatable); also $IDEM_HEADER, one per line")
	fs.String("host", "", "the scheme and host the headers are for, as https://api.example.com, which headers need: "+
		"an operation that goes to another is not sent")
	fs.Bool("without-credentials", false, "send an operation whose first send carried credentials (shown as 'not stored') "+
		"without those the headers given lack, and, given no header, any operation, rather than refuse it")
	// The default is the retry policy's MaxElapsed, a minute: an attempt
	// that hangs that long spends the call's budget, so that a resume ends
	// after about a minute an operation whose server never answers.
	cliflag.Duration(fs, "attempt-timeout", (retry.Policy{}).Defaults().MaxElapsed,
		"how long one attempt waits for the server's answer (a `duration`, at most the retry horizon, 24h); "+
			"the default, 1m (the horizon when shorter), is the retry policy's MaxElapsed: a hung attempt spends it and the resume ends")
	// The jar does not record the horizon of the program that sent an
	// operation. Its server keeps keys for a while; past that, a send
	// under the key runs the request again: the program's shorter horizon
	// must not be stretched to the default, nor a longer one cut.
	cliflag.Duration(fs, "horizon", (retry.Policy{}).Defaults().Horizon,
		"the retry horizon of the program that sent the operations (a `duration`; its retry.Policy.Horizon, 24h by default): "+
			"an operation first sent longer ago is not sent again but marked for reconciliation")
}

// resumePolicy returns the retry policy of resume's --attempt-timeout and
// --horizon, or a usage error when the horizon is not positive (0 would be
// the default, not what was asked) or the attempt timeout given is not a
// positive duration of at most the horizon: past the horizon no timed-out
// attempt is retried, and 0 would be no limit, the hang the flag is there
// to end. Not given, it is a minute or the horizon, whichever is shorter.
func resumePolicy(fs *flag.FlagSet) (retry.Policy, error) {
	get := func(name string) time.Duration { return fs.Lookup(name).Value.(flag.Getter).Get().(time.Duration) }
	p := retry.Policy{AttemptTimeout: get("attempt-timeout"), Horizon: get("horizon")}
	if p.Horizon <= 0 {
		return p, cliflag.Usagef("--horizon %v: want a positive duration", p.Horizon)
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "attempt-timeout" })
	if !given {
		// The default, a minute, is at most the horizon: a shorter
		// --horizon alone is no usage error.
		p.AttemptTimeout = min(p.AttemptTimeout, p.Horizon)
	}
	if p.AttemptTimeout <= 0 || p.AttemptTimeout > p.Horizon {
		return p, cliflag.Usagef("--attempt-timeout %v: want a positive duration of at most %v, the retry horizon (--horizon)", p.AttemptTimeout, p.Horizon)
	}
	return p, nil
}

// resumeBase is the client.Options.Base that resume sends through: nil,
// the Client's own. Tests replace it.
var resumeBase http.RoundTripper

// checkResume checks resume's arguments and flags, and adds the headers of
// IDEM_HEADER to those of --header.
func checkResume(fs *flag.FlagSet, args []string) error {
	all := flagString(fs, "all") == "true"
	if all == (len(args) > 0) || len(args) > 1 {
		return cliflag.Usagef("resume needs one operation name or --all")
	}
	if _, err := resumePolicy(fs); err != nil {
		return err
	}
	hf := fs.Lookup("header").Value.(*headerFlag)
	if hf.bad {
		return cliflag.Usagef("--header: %s", notAHeader)
	}
	for i, line := range strings.Split(os.Getenv("IDEM_HEADER"), "\n") {
		// Blank as net/textproto trims a line, the rule add applies to
		// a value: strings.TrimSpace would also skip a line of a no-break
		// space or a NEL, which --header refuses.
		if textproto.TrimString(line) == "" {
			continue
		}
		if !hf.add(line) {
			return cliflag.Usagef("IDEM_HEADER: line %d: %s", i+1, notAHeader)
		}
	}
	if host := flagString(fs, "host"); host != "" {
		if _, ok := origin(host); !ok {
			// Not shown: it may hold a password.
			return cliflag.Usagef("--host: want a scheme, http or https, and a host alone, as https://api.example.com or http://127.0.0.1:8080")
		}
	} else if len(hf.h) > 0 {
		return cliflag.Usagef("headers (--header, IDEM_HEADER) need --host, the scheme and host they are for, as https://api.example.com: " +
			"the jar says where each operation goes, and the headers go there only when it is that host")
	}
	return nil
}

// origin returns s, the value of --host, as opHost writes where an
// operation goes: scheme://host, the host with its port when s has one.
// It reports false for an s that is not an http or https URL with a host
// alone (no user, path but "/", query or fragment).
func origin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return "", false
	}
	return originOf(u.Scheme, u.Host), true
}

// originOf returns scheme://host in lower case, without the scheme's
// default port (80 for http, 443 for https), which net/http sends to
// whether the URL writes it or not.
func originOf(scheme, host string) string {
	scheme, host = strings.ToLower(scheme), strings.ToLower(host)
	switch scheme {
	case "http":
		host = strings.TrimSuffix(host, ":80")
	case "https":
		host = strings.TrimSuffix(host, ":443")
	}
	return scheme + "://" + host
}

// elsewhere reports whether a request that goes to where, as opHost says
// it, goes to another host than host, the origin of --host ("" for any):
// whether its URL's origin is another, whatever Host it names there. Both
// are originOf's: schemes and hosts match in any case, as DNS names do,
// and a default port written or not.
func elsewhere(host, where string) bool {
	addr, _, _ := strings.Cut(where, " ")
	return host != "" && addr != host
}

// addHeaders adds h to r, a request that resume sends, unless r goes to
// another host than host (elsewhere): its record was rewritten in the jar
// since resume read it, and the Client sends what the jar holds then.
func addHeaders(r *http.Request, h http.Header, host string) error {
	if where := reqHost(r.URL, r.Host); elsewhere(host, where) {
		return fmt.Errorf("not sent: it goes to %s, not to %s (--host), which the headers are for", cell(where, 0), cell(host, 0))
	}
	for name, vs := range h {
		r.Header[name] = append([]string(nil), vs...)
	}
	return nil
}

// hostError is resume's refusal of operations that go to another host than
// --host, the one the headers given are for: nothing is sent.
type hostError struct {
	Host  string   // --host, as origin returns it
	Op    string   // the operation resumed by name; "" for resume --all
	Hosts []string // where the operations go, sorted
}

func (e *hostError) Error() string {
	goes := cell(e.Hosts[0], 0)
	if len(e.Hosts) > 1 {
		goes = fmt.Sprintf("%d hosts (%s)", len(e.Hosts), ctlesc.Escape(strings.Join(e.Hosts, ", ")))
	}
	if e.Op != "" {
		return fmt.Sprintf("%s goes to %s, not to %s (--host), which the headers are for: nothing was sent; if that is where you meant it to go, give its --host and its headers",
			cell(e.Op, 0), goes, cell(e.Host, 0))
	}
	return fmt.Sprintf("the pending operations go to %s, not to %s (--host) alone, which the headers are for: nothing was sent; resume them by name, each with its own host's --host and headers",
		goes, cell(e.Host, 0))
}

func resume(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	all := flagString(fs, "all") == "true"
	policy, err := resumePolicy(fs)
	if err != nil {
		return err
	}
	hf := fs.Lookup("header").Value.(*headerFlag)
	host, _ := origin(flagString(fs, "host")) // "" when not given; checkResume refused a bad one
	// The records are read first, for their methods: the Client keys the
	// methods of the operations it resumes, whichever Methods the programs
	// that sent them keyed, and no other. A redirect that turns one into a
	// GET is followed without a key, as by default, unless a GET is
	// resumed too. --all reads them in pages, twice: for their methods and
	// hosts, then to resume them, up to the last one the first walk read.
	var (
		methods []string
		hosts   = map[string]bool{}
		last    idem.Cursor // --all: the last operation the first walk read
		total   int
		bad     int         // --all: pending records that do not decode, which the first walk said
		one     idem.Record // not --all: the operation
	)
	note := func(r idem.Record) {
		hosts[opHost(r)] = true
		if !slices.Contains(methods, r.Method) {
			methods = append(methods, r.Method)
		}
		last = r.Cursor()
		total++
	}
	if all {
		err := eachPage(ctx, s.jar, idem.Filter{State: idem.StatePending}, func(page []idem.Record) error {
			for _, r := range page {
				note(r)
			}
			return nil
		}, s.undecodable(&bad))
		if err != nil {
			return err
		}
		for h := range hosts {
			if elsewhere(host, h) || (host != "" && len(hosts) > 1) {
				// Every request gets the same headers: one API's
				// credential would reach the others, virtual hosts at
				// --host's address included.
				return &cliflag.UsageError{Err: &hostError{Host: host, Hosts: slices.Sorted(maps.Keys(hosts))}}
			}
		}
		if total == 0 && bad > 0 {
			return errFailed
		}
		if total == 0 {
			fmt.Fprintln(s.stdout, "nothing pending")
			return nil
		}
	} else {
		r, err := s.jar.Get(ctx, args[0])
		if re := (*idem.RecordError)(nil); errors.As(err, &re) && re.Record.Op == args[0] {
			// One record damaged, not the jar: said as show says it.
			return fmt.Errorf("%w; not resumed", undecoded(re))
		}
		if err != nil {
			return s.unknown(args[0], err)
		}
		one = r
		note(r)
		if elsewhere(host, opHost(r)) {
			return &cliflag.UsageError{Err: &hostError{Host: host, Op: r.Op, Hosts: []string{opHost(r)}}}
		}
	}
	withoutCredentials := flagString(fs, "without-credentials") == "true"
	header := func(r *http.Request) error { return addHeaders(r, hf.h, host) }
	c, err := client.New(ctx, "", &client.Options{Jar: s.jar, Base: resumeBase, Methods: methods, Header: header,
		Policy: policy, ResumeWithoutCredentials: withoutCredentials})
	if err != nil {
		return err
	}
	defer c.Close()
	failed := 0
	toldNoCredentials := false
	send := func(r idem.Record) {
		op := r.Op
		if elsewhere(host, opHost(r)) {
			// Pending since the first walk read the hosts, and bound
			// elsewhere: the headers are not for it.
			failed++
			fmt.Fprintf(s.stderr, "idemctl: %s: not sent: it goes to %s, not to %s (--host), which the headers are for; resume it by name with its own host's --host and headers\n", cell(op, 0), cell(opHost(r), 0), cell(host, 0))
			return
		}
		if missing := secrethdr.Lacking(hf.h, r.Withheld()); len(missing) > 0 && !withoutCredentials {
			// Refused per operation, as client.Resume refuses one it has
			// no Options.Header for: resume --all sends the others.
			failed++
			fmt.Fprintf(s.stderr, "idemctl: %s: not sent: its first send carried %s, which the jar does not keep: give them with --header or IDEM_HEADER (or, to send it without them, --without-credentials)\n",
				cell(op, 0), cell(strings.Join(missing, ", "), 0))
			return
		}
		if !givesCredential(hf.h) && !withoutCredentials && r.State == idem.StatePending && r.BodyStored() && !carriesCredentials(r) {
			// Credentials that a program added outside the request the
			// jar stored (client.Options.Header, a base transport) leave
			// no name in it to check. A server that scopes keys by
			// credential, as the reference server does, takes a request
			// without them for a new operation and runs it again: a
			// charge made twice. Sending with none is asked for, not
			// assumed. (One whose body the jar lacks is refused below
			// for that, whatever its credentials.)
			failed++
			why := "" // said once
			if !toldNoCredentials {
				toldNoCredentials = true
				why = "; those a program adds itself, as client.Options.Header does, are not kept in it, and a server that scopes keys by credential runs a request without them again, as a new one: give the first send's credentials, or, if it carried none, --without-credentials"
			}
			given := "no header given (--header, IDEM_HEADER)"
			if len(hf.h) > 0 {
				given = "the headers given (--header, IDEM_HEADER) hold no credential"
			}
			fmt.Fprintf(s.stderr, "idemctl: %s: nothing sent: %s, and the jar keeps none%s\n", cell(op, 0), given, why)
			return
		}
		// Resume waits for a lease, a minute by default, and for the next
		// attempt time the server asked for, up to MaxRetryAfter: say so,
		// rather than leave the shell silent.
		now := time.Now()
		switch {
		case r.Holder != "" && now.Before(r.LeaseUntil) && !idem.HolderGone(r.Holder):
			fmt.Fprintf(s.stderr, "idemctl: %s: another process holds its lease, until %s: waiting for it to be given back (Ctrl-C to stop: it stays pending)\n",
				cell(op, 0), stamp(r.LeaseUntil))
		case now.Before(r.NextAttempt) && r.NextAttempt.Sub(now) <= policy.Defaults().MaxRetryAfter:
			fmt.Fprintf(s.stderr, "idemctl: %s: the server asked for its next attempt at %s: waiting for it (Ctrl-C to stop: it stays pending)\n",
				cell(op, 0), stamp(r.NextAttempt))
		}
		resp, err := c.Resume(ctx, op)
		if errors.Is(err, client.ErrState) && doneMeanwhile(ctx, s, r) {
			return
		}
		if errors.Is(err, client.ErrBodyNotStored) {
			err = fmt.Errorf("the jar does not hold its request's body (larger than the program's MaxStoredBody): %s; or abandon it once you know it did not happen and is not running", onlyItsProgram)
		}
		if err != nil {
			failed++
			fmt.Fprintf(s.stderr, "idemctl: %s: %s\n", cell(op, 0), oneLine(s.describe(s.unknown(op, err)).Error()))
			return
		}
		resp.Body.Close()
		replayed := ""
		if resp.Replayed {
			replayed = " (replayed)"
		}
		fmt.Fprintf(s.stdout, "%s: %s%s, key %s\n", cell(op, 0), cell(resp.Status, 0), replayed, cell(resp.Key, 0))
	}
	done := 0
	resumeNext := func(r idem.Record) error {
		if err := ctx.Err(); err != nil {
			return interrupted(err)
		}
		sent := failed
		send(r)
		if err := ctx.Err(); err != nil && all && failed > sent {
			// Cut off by the interruption: still pending, counted with
			// the operations --all did not reach.
			return interrupted(err)
		}
		done++
		return nil
	}
	if all {
		err = eachPage(ctx, s.jar, idem.Filter{State: idem.StatePending}, func(page []idem.Record) error {
			for _, r := range page {
				if last.Compare(r.Cursor()) < 0 {
					return errWalked // pending since the first walk ended
				}
				if err := resumeNext(r); err != nil {
					return err
				}
			}
			return nil
		}, nil) // the first walk said which records do not decode
	} else {
		err = resumeNext(one)
	}
	if err != nil && ctx.Err() != nil {
		// Interrupted: the rest would each fail on the context.
		fmt.Fprintf(s.stderr, "idemctl: interrupted: %d operation(s) not resumed, still pending\n", max(total-done, 0))
		return errFailed
	}
	if err != nil && !errors.Is(err, errWalked) {
		return err
	}
	if failed > 0 || bad > 0 {
		return errFailed
	}
	return nil
}

// doneMeanwhile reports, and prints, that r, pending when resume read it,
// which Resume did not send because it was no longer pending, was done
// meanwhile under r's key with a 2xx answer: by the program that held its
// lease, as resume would have done it. One failed, abandoned or forgotten
// meanwhile is not: resume fails for it.
func doneMeanwhile(ctx context.Context, s *session, r idem.Record) bool {
	if r.State != idem.StatePending && r.State != idem.StateReconcile {
		return false // not pending when read: nothing happened meanwhile
	}
	now, err := s.jar.Get(ctx, r.Op)
	if err != nil || now.Key != r.Key || now.State != idem.StateDone || now.LastStatus < 200 || now.LastStatus > 299 {
		return false
	}
	fmt.Fprintf(s.stdout, "%s: %d %s, key %s, by another process meanwhile; nothing was sent\n",
		cell(r.Op, 0), now.LastStatus, http.StatusText(now.LastStatus), cell(now.Key, 0))
	return true
}

// givesCredential reports whether h, the headers given to resume, holds
// a credential (a name idem.SecretHeader names, with a value): a header
// of another kind (a trace id, a User-Agent) sends a request without
// credentials all the same.
func givesCredential(h http.Header) bool {
	for name, values := range h {
		if len(values) > 0 && idem.SecretHeader(name) {
			return true
		}
	}
	return false
}

// carriesCredentials reports whether r holds credentials that a resume
// sends: as records of earlier versions may, a URL's userinfo, or the
// value of a header that idem.SecretHeader names now.
func carriesCredentials(r idem.Record) bool {
	if u, err := url.Parse(r.URL); err == nil && u.User != nil {
		return true
	}
	return givesCredential(r.Header)
}

// errWalked ends resume --all's second walk at the last operation its
// first walk read.
var errWalked = errors.New("walked")

func checkAbandon(fs *flag.FlagSet, args []string) error {
	op, err := oneArg("abandon", args)
	if err != nil {
		return err
	}
	if strings.TrimSpace(flagString(fs, "reason")) == "" {
		return cliflag.Usagef("abandon needs --reason: how you established that %s did not happen and is not running", dsn.Quote(op))
	}
	return nil
}

func abandon(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	op, err := oneArg("abandon", args)
	if err != nil {
		return err
	}
	reason := flagString(fs, "reason")
	// Abandon of an abandoned operation changes nothing, its note (the
	// reason given then) included: say so, and what that reason was,
	// rather than let this one seem recorded.
	before, err := s.jar.Get(ctx, op)
	if re := (*idem.RecordError)(nil); errors.As(err, &re) && re.Record.Op == op {
		return abandonUndecodable(ctx, s, re, reason)
	}
	if err != nil {
		return s.unknown(op, err)
	}
	if before.State == idem.StateAbandoned {
		s.alreadyAbandoned(before)
		return nil
	}
	c, err := client.New(ctx, "", &client.Options{Jar: s.jar})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Abandon(ctx, op, reason); err != nil {
		return s.unknown(op, err)
	}
	// Another process may have abandoned it since it was read, with its
	// own reason, which Abandon then kept.
	if now, err := s.jar.Get(ctx, op); err == nil && now.Key == before.Key && now.State == idem.StateAbandoned && now.Note != reason {
		s.alreadyAbandoned(now)
		return nil
	}
	fmt.Fprintf(s.stdout, "%s: abandoned; a new call with this name gets a new key\n", cell(op, 0))
	return nil
}

// abandonUndecodable abandons the operation of re, a record that does not
// decode, as client.Abandon abandons one that does: pending or reconcile,
// under the key read, and not while a live process holds its lease. The
// jar changes its state, note, update time and lease alone (AbandonKey),
// reading no header: its request, which does not read back, is never
// resumed, and a new call with its name gets a new key.
func abandonUndecodable(ctx context.Context, s *session, re *idem.RecordError, reason string) error {
	r := re.Record
	now := time.Now()
	switch {
	case r.State == idem.StateAbandoned:
		s.alreadyAbandoned(r)
		return nil
	case !r.State.Valid():
		return fmt.Errorf("%w: not abandoned, its state is not one of idem's", undecoded(re))
	case r.State != idem.StatePending && r.State != idem.StateReconcile:
		return fmt.Errorf("%w: not abandoned, its outcome is known", undecoded(re))
	case !r.CanLease("", now) && !idem.HolderGone(r.Holder):
		return fmt.Errorf("%s: held by %s until %s: not abandoned; wait for that process to finish sending it, or stop it, then abandon it again",
			cell(r.Op, 0), cell(r.Holder, 0), stamp(r.LeaseUntil))
	}
	ak, ok := s.jar.(interface {
		AbandonKey(ctx context.Context, op, key, holder, note string, now time.Time) error
	})
	if !ok {
		return fmt.Errorf("this jar (%T) cannot abandon an operation whose record does not decode", s.jar)
	}
	holder := "" // the lease is free or expired, or its holder is gone
	if idem.HolderGone(r.Holder) {
		holder = r.Holder
	}
	err := ak.AbandonKey(ctx, r.Op, r.Key, holder, reason, now)
	if errors.Is(err, idem.ErrNotAbandoned) {
		return fmt.Errorf("%s changed after it was read (settled, begun again under a new key, or leased): not abandoned", cell(r.Op, 0))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(s.stdout, "%s: abandoned; its record does not decode, and it is never resumed; a new call with this name gets a new key\n", cell(r.Op, 0))
	return nil
}

// alreadyAbandoned says that r was abandoned before abandon recorded its
// reason, and with which, which it keeps.
func (s *session) alreadyAbandoned(r idem.Record) {
	fmt.Fprintf(s.stdout, "%s: already abandoned (updated %s, note %s), and left as it is: the reason given was not recorded\n",
		cell(r.Op, 0), stamp(r.Updated), cell(r.Note, 0))
}

// undecodedAdvice says what an operator can do with r, the fields of a
// record that does not decode (idem.RecordError).
func undecodedAdvice(r idem.Record) string {
	if r.State == idem.StatePending {
		// Never resumed: its request does not read back. Forget keeps a
		// pending operation's key.
		return "it is pending, its outcome unknown: ask its server what happened under its key; forget refuses a pending operation, abandon --reason marks it abandoned once you know it did not happen and is not running"
	}
	return "forget removes it"
}

func forget(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	op, err := oneArg("forget", args)
	if err != nil {
		return err
	}
	c, err := client.New(ctx, "", &client.Options{Jar: s.jar})
	if err != nil {
		return err
	}
	defer c.Close()
	err = c.Forget(ctx, op)
	var re *idem.RecordError
	if errors.As(err, &re) && re.Record.Op == op {
		// Its record does not decode, which Forget reads first: what did
		// decode says its state and key, which ForgetKey deletes in one
		// statement, unless it is pending, or has another key by then.
		err = forgetUndecodable(ctx, s, re.Record)
	}
	if err != nil {
		return s.unknown(op, err)
	}
	fmt.Fprintf(s.stdout, "%s: forgotten\n", cell(op, 0))
	return nil
}

// forgetUndecodable forgets r, the fields of a record that does not decode,
// as client.Forget forgets one that does: not when it is pending, and only
// under r's key.
func forgetUndecodable(ctx context.Context, s *session, r idem.Record) error {
	if r.State == idem.StatePending {
		return fmt.Errorf("%s is pending, its outcome unknown, and its record does not decode: not forgotten; ask its server what happened under its key %s, and abandon it once you know it did not happen and is not running",
			cell(r.Op, 0), cell(r.Key, 0))
	}
	kf, ok := s.jar.(client.KeyForgetter)
	if !ok {
		return fmt.Errorf("this jar (%T) cannot forget an operation by its key", s.jar)
	}
	err := kf.ForgetKey(ctx, r.Op, r.Key)
	if errors.Is(err, idem.ErrNotForgotten) {
		return fmt.Errorf("%s changed after it was read (begun again under a new key, or pending): not forgotten", cell(r.Op, 0))
	}
	return err
}

func checkPrune(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 {
		return cliflag.Usagef("prune takes no arguments, got %s", dsn.Quote(args...))
	}
	_, err := parseAge(flagString(fs, "older-than"))
	return err
}

func prune(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	v := flagString(fs, "older-than")
	age, err := parseAge(v)
	if err != nil {
		return err
	}
	before := time.Now().Add(-age)
	n, err := s.jar.Prune(ctx, before, 0)
	if err != nil && ctx.Err() != nil {
		// Interrupted: the jar deletes in batches, and n counts those it
		// finished. The one it was deleting may have been committed as
		// the context ended, unanswered.
		fmt.Fprintf(s.stderr, "idemctl: interrupted: pruned %d operation(s) before it stopped, and perhaps the batch it was deleting then; prune again for the rest\n", n)
		return errFailed
	}
	if err != nil {
		// Failed, perhaps part way (a lock held too long, a database
		// error): n counts the batches it finished, each deleted whole, as
		// for an interruption. The one that failed may have been committed
		// unanswered too (a PostgreSQL connection lost, the statement then
		// sent again), but not one refused for want of a privilege, which
		// no earlier attempt of the role's was granted either.
		perhaps := ", and perhaps the batch it was deleting then"
		if pgmigrate.Insufficient(err) {
			perhaps = ""
		}
		fmt.Fprintf(s.stderr, "idemctl: %s; prune deleted %d operation(s) before it failed%s: each batch is deleted whole or not at all, so the jar holds every other operation as it was; prune again for the rest\n",
			oneLine(s.describe(err).Error()), n, perhaps)
		return errFailed
	}
	fmt.Fprintf(s.stdout, "pruned %d operation(s) done, failed or abandoned and not updated for %s\n", n, v)
	if left, err := leftDue(ctx, s.jar, before); err == nil && left > 0 {
		// A PostgreSQL jar skips the rows another transaction holds
		// locked (FOR UPDATE SKIP LOCKED), rather than wait: the count
		// alone would say that none was left.
		fmt.Fprintf(s.stderr, "idemctl: %d operation(s) not updated for %s left: another transaction held them locked (a worker changing them, or another prune deleting them); prune again later\n", left, v)
	}
	return nil
}

// errEnoughRead ends leftDue's walk of a state's operations.
var errEnoughRead = errors.New("read up to the cutoff")

// leftDue counts the operations of jar that a Prune with before would
// delete and that are still there after one: those another transaction
// held locked, which a PostgreSQL jar skips. It reads each prunable state's
// operations in List's order (by creation) up to the first created after
// before, past which none was last updated before it (but for clocks that
// disagree between hosts, which it then counts short).
func leftDue(ctx context.Context, jar client.Jar, before time.Time) (int, error) {
	n := 0
	due := func(r idem.Record) bool {
		if r.Created.After(before) {
			return false
		}
		if r.Updated.IsZero() || !r.Updated.After(before) {
			n++
		}
		return true
	}
	for _, st := range []idem.State{idem.StateDone, idem.StateFailed, idem.StateAbandoned} {
		err := eachPage(ctx, jar, idem.Filter{State: st}, func(page []idem.Record) error {
			for _, r := range page {
				if !due(r) {
					return errEnoughRead
				}
			}
			return nil
		}, func(re *idem.RecordError) { due(re.Record) })
		if err != nil && !errors.Is(err, errEnoughRead) {
			return n, err
		}
	}
	return n, nil
}

// parseAge reads --older-than: a Go duration (720h) or a number of days (30d).
func parseAge(v string) (time.Duration, error) {
	if v == "" {
		return 0, cliflag.Usagef("prune needs --older-than, such as 720h or 30d")
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n > 100_000 {
			return 0, cliflag.Usagef("--older-than %s: want a duration such as 720h or 30d", dsn.Quote(v))
		}
		if n <= 0 { // before the multiplication, which a large negative n overflows
			return 0, cliflag.Usagef("--older-than %s: want a positive age", dsn.Quote(v))
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			return 0, cliflag.Usagef("--older-than %s: want a duration such as 720h or 30d", dsn.Quote(v))
		}
	}
	if d <= 0 {
		return 0, cliflag.Usagef("--older-than %s: want a positive age", dsn.Quote(v))
	}
	return d, nil
}

// exported is one operation in export's JSON. JSON holds only UTF-8, and
// a jar file any bytes: a string that is not UTF-8, which encoding/json
// writes with U+FFFD for its bad bytes, has them all in the field named
// as its own with _base64 (in header_base64, each name and value of the
// header), absent for a string that is UTF-8.
type exported struct {
	Op                string              `json:"op"`
	OpBase64          []byte              `json:"op_base64,omitempty"`
	Key               string              `json:"key"`
	KeyBase64         []byte              `json:"key_base64,omitempty"`
	State             idem.State          `json:"state"`
	Fingerprint       string              `json:"fingerprint"`
	FingerprintBase64 []byte              `json:"fingerprint_base64,omitempty"`
	Method            string              `json:"method"`
	MethodBase64      []byte              `json:"method_base64,omitempty"`
	URL               string              `json:"url"`
	URLBase64         []byte              `json:"url_base64,omitempty"`
	Header            http.Header         `json:"header,omitempty"`
	HeaderBase64      map[string][]string `json:"header_base64,omitempty"`
	Body              *string             `json:"body,omitempty"`        // the stored body, when it is UTF-8
	BodyBase64        []byte              `json:"body_base64,omitempty"` // the stored body, when it is not
	BodySize          int64               `json:"body_size"`
	BodyStored        bool                `json:"body_stored"`
	Created           time.Time           `json:"created"`
	Updated           time.Time           `json:"updated"`
	Attempts          int                 `json:"attempts"`
	LastStatus        int                 `json:"last_status,omitempty"`
	LastError         string              `json:"last_error,omitempty"`
	LastErrorBase64   []byte              `json:"last_error_base64,omitempty"`
	NextAttempt       *time.Time          `json:"next_attempt,omitempty"`
	Note              string              `json:"note,omitempty"`
	NoteBase64        []byte              `json:"note_base64,omitempty"`
	Holder            string              `json:"holder,omitempty"`
	HolderBase64      []byte              `json:"holder_base64,omitempty"`
	LeaseUntil        *time.Time          `json:"lease_until,omitempty"`
}

// notUTF8 returns s's bytes when they are not UTF-8, for its _base64
// field, and nil when JSON holds s as it is.
func notUTF8(s string) []byte {
	if utf8.ValidString(s) {
		return nil
	}
	return []byte(s)
}

// headerBase64 returns h with each name and value in base64 when one of
// them is not UTF-8, and nil when JSON holds h as it is.
func headerBase64(h http.Header) map[string][]string {
	valid := true
	for name, vs := range h {
		valid = valid && notUTF8(name) == nil && !slices.ContainsFunc(vs, func(v string) bool { return notUTF8(v) != nil })
	}
	if valid {
		return nil
	}
	enc := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	out := make(map[string][]string, len(h))
	for name, vs := range h {
		ws := make([]string, len(vs))
		for i, v := range vs {
			ws[i] = enc(v)
		}
		out[enc(name)] = ws
	}
	return out
}

func checkExport(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 {
		return cliflag.Usagef("export takes no arguments, got %s", dsn.Quote(args...))
	}
	if flagString(fs, "json") != "true" {
		return cliflag.Usagef("export writes JSON only (--json)")
	}
	return nil
}

func export(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error {
	// One record at a time, each checked against ctx: a Ctrl-C stops the
	// printing of a large jar. The output is what a json.Encoder indenting
	// by two spaces writes for the whole array, read in pages.
	w := bufio.NewWriter(interruptible{ctx, s.stdout})
	n, sep, bad := 0, "[\n  ", 0
	err := eachPage(ctx, s.jar, idem.Filter{}, func(page []idem.Record) error {
		for _, r := range page {
			if err := ctx.Err(); err != nil {
				return interrupted(err)
			}
			// The password of a URL that a record of an earlier version
			// keeps in its userinfo, and in an error that quotes it, is
			// masked, and so are its credential headers.
			u, lastErr, h := dsn.MaskURL(r.URL), lastError(r), shownHeader(r.Header)
			e := exported{Op: r.Op, Key: r.Key, State: r.State, Fingerprint: r.Fingerprint, Method: r.Method, URL: u,
				Header: h, BodySize: r.BodySize, BodyStored: r.BodyStored(), Created: r.Created, Updated: r.Updated,
				Attempts: r.Attempts, LastStatus: r.LastStatus, LastError: lastErr, Note: r.Note, Holder: r.Holder,
				NextAttempt: optTime(r.NextAttempt), LeaseUntil: optTime(r.LeaseUntil)}
			if len(r.Header) == 0 {
				e.Header = nil
			}
			e.OpBase64, e.KeyBase64, e.FingerprintBase64, e.MethodBase64 = notUTF8(r.Op), notUTF8(r.Key), notUTF8(r.Fingerprint), notUTF8(r.Method)
			e.URLBase64, e.HeaderBase64, e.LastErrorBase64 = notUTF8(u), headerBase64(h), notUTF8(lastErr)
			e.NoteBase64, e.HolderBase64 = notUTF8(r.Note), notUTF8(r.Holder)
			if r.BodyStored() && r.BodySize > 0 {
				if utf8.Valid(r.Body) {
					b := string(r.Body)
					e.Body = &b
				} else {
					e.BodyBase64 = r.Body
				}
			}
			b, err := json.MarshalIndent(e, "  ", "  ")
			if err != nil {
				return err
			}
			w.WriteString(sep)
			w.Write(b)
			sep = ",\n  "
			n++
		}
		return nil
	}, s.undecodable(&bad))
	if err != nil {
		return err
	}
	if n == 0 {
		w.WriteString("[]")
	} else {
		w.WriteString("\n]")
	}
	w.WriteString("\n")
	if err := w.Flush(); err != nil {
		return err // the first error of a write, which bufio keeps
	}
	if bad > 0 {
		// Each said on stderr; the JSON holds every other record.
		return errFailed
	}
	return nil
}

// interruptible is a command's stdout that refuses to write once ctx is
// done (SIGINT, SIGTERM or SIGHUP): a command printing a large jar stops at its
// next write instead of printing all of it first.
type interruptible struct {
	ctx context.Context
	w   io.Writer
}

func (w interruptible) Write(p []byte) (int, error) {
	if err := w.ctx.Err(); err != nil {
		return 0, interrupted(err)
	}
	return w.w.Write(p)
}

func interrupted(err error) error { return fmt.Errorf("interrupted: %w", err) }

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// last is the outcome of an operation's last attempt, in a few words, its
// error as lastError gives it. A record with both a status and an error
// holds the last answer the operation got and the error of a later attempt
// that got none (a 503, then a refused connection): printed as "503:
// <error>", that read as the answer's error.
func last(r idem.Record) string {
	lastErr := lastError(r)
	status := ""
	if r.LastStatus != 0 {
		status = strings.TrimSpace(strconv.Itoa(r.LastStatus) + " " + http.StatusText(r.LastStatus))
	}
	switch {
	case lastErr != "" && status != "":
		return status + ", then " + lastErr
	case lastErr != "":
		return lastErr
	case status != "":
		return status
	}
	return "-"
}

// lastError is r's LastError fit to print: the passwords it quotes masked
// (dsn.MaskPasswords), as a record of an earlier version may hold them,
// and r's URL, where it quotes it (as net/http's errors quote a request's),
// masked as show and export print it (dsn.MaskURL): its query's secrets.
func lastError(r idem.Record) string {
	s := r.LastError
	if r.URL != "" {
		s = strings.ReplaceAll(s, r.URL, dsn.MaskURL(r.URL))
	}
	return dsn.MaskPasswords(s)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// cell makes s safe to print on one line of a table: a string with control
// characters, bidi format characters, characters that show as nothing or
// as a plain space, a space at either end, or bytes that are not UTF-8 is
// printed as a Go string literal, between double quotes, those escaped and
// so its backslashes and quotes (ctlesc.Quote): a name holding an ESC is
// not printed as the one spelled with a backslash, x, 1 and b, nor one
// holding a zero-width space as the one without. It is cut at n
// runes (0: no limit).
func cell(s string, n int) string {
	if s == "" {
		return "-"
	}
	s = ctlesc.Quote(s)
	if n > 0 && utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n]) + "…"
	}
	return s
}

// shownHeader returns h as show and export print it: the values of the
// headers that idem.SecretHeader names are "xxxxx". The jars store none,
// but a record of a version whose SecretHeader named fewer may hold one
// (an exchange's CB-ACCESS-PASSPHRASE): the jar keeps it, and a resume
// sends it as the first send did (see idem.Record.NewRequest).
func shownHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for name, vs := range h {
		if idem.SecretHeader(name) {
			vs = slices.Repeat([]string{"xxxxx"}, len(vs))
		}
		out[name] = vs
	}
	return out
}

func sortedKeys(h http.Header) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// unknown says that op is not in the jar, for an error that means it.
func (s *session) unknown(op string, err error) error {
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("no operation named %s in %s", dsn.Quote(op), s.path)
	}
	return err
}

// opHost returns where a stored request goes, which the credentials of
// resume's headers are for: its URL's scheme and host (and port), where
// the request and its credential go, followed by " (Host h)" when its
// header keeps a Host h that was not its URL's (a virtual host reached
// by address). The scheme counts: a credential for an https API must not
// go to the same host over plain http, in the clear.
// For a URL that does not parse, it is a placeholder rather than the URL,
// whose query may hold a credential.
func opHost(r idem.Record) string {
	u, err := url.Parse(r.URL)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return reqHost(u, r.Header.Get("Host"))
}

// reqHost returns where a request to u with Host host goes, as opHost
// says it.
func reqHost(u *url.URL, host string) string {
	addr := originOf(u.Scheme, u.Host)
	if host != "" && originOf(u.Scheme, host) != addr {
		return addr + " (Host " + strings.ToLower(host) + ")"
	}
	return addr
}

// onlyItsProgram says who can resume an operation whose body the jar did
// not store (it was larger than the program's MaxStoredBody): idemctl has
// nothing to send.
const onlyItsProgram = "only the program that sent it can resume it, by making the same call again"
