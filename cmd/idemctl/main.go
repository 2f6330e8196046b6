// Command idemctl inspects and operates a key jar: the operations a program
// sent through idem, their keys and what became of them.
//
//	idemctl --jar keys.db list [--status pending]
//	idemctl --jar keys.db show charge:order-42
//	idemctl --jar keys.db resume charge:order-42 --header 'Authorization: Bearer sk_…' --host https://api.example.com
//	idemctl --jar keys.db resume --all
//	idemctl --jar keys.db abandon charge:order-42 --reason 'no charge in the ledger'
//	idemctl --jar keys.db forget charge:order-42
//	idemctl --jar keys.db prune --older-than 720h
//	idemctl --jar keys.db export --json
//
// The jar is named by --jar (before or after the command) or by the
// environment variable IDEM_JAR: the path of a jar file (package keyjar),
// or the URL of a PostgreSQL database holding a jar shared by a fleet of
// workers (package keyjar/pgjar):
//
//	idemctl --jar 'postgres://ops@db.internal:5432/payments?sslmode=verify-full' list
//
// A key=value connection string ("host=db dbname=payments") is refused:
// give the URL. A password in it is shown by the process list to every
// user of the machine: give the URL in IDEM_JAR, or the password in
// PGPASSWORD or ~/.pgpass, which pgx reads for a URL without one. A jar in a schema of its own is named by the URL's
// search_path, as pgjar.Open takes it (…/payments?search_path=jobs): idemctl
// looks for the jar in the first schema of the search_path that exists.
//
// The jar must exist: idemctl never creates one, neither a file nor the
// tables in a database, and never upgrades a jar of an older schema
// version (keyjar.ErrOldVersion, pgjar.ErrOldVersion), after which the
// program built with the earlier version of idem that uses it would refuse
// it: it says so, with the version the jar records.
//
// resume sends a pending operation again from the request stored in the jar,
// with the same Idempotency-Key. The jar never holds credentials: give them
// with --header 'Name: value' (repeatable), or, to keep them out of the
// process list, in the environment variable IDEM_HEADER (one "Name: value"
// per line, read as --header reads one; a line of spaces, tabs and CRs
// alone is skipped, one of other white space, such as a no-break space, is
// not); a line that is not one net/http sends (a space or a separator
// in or around the name, as in "X-A : v", a control character in the
// value) is a usage error, and nothing is sent. The spaces and tabs around
// a value are taken off, as net/http takes them off a value it writes, and
// nothing else. Give the credential of the first send: a server that
// scopes keys by credential (as the reference server does) would take
// another one's request for a new operation. The jar keeps the names of
// the credentials a first send carried on its request (show prints them
// as "not stored"): resume does not send an operation when the headers
// given lack one of them, but says which on stderr and counts it failed,
// unless --without-credentials is given. Credentials a program added
// another way, as client.Options.Header adds them, leave no name of their
// own (show says that its program added some): given no
// credential (no header at all, or only headers that idem.SecretHeader does
// not name, as a trace id), resume sends no pending operation (but one
// whose record holds a credential of its own, as one of an earlier version
// may): it says so on stderr, nothing sent, and counts it failed (exit
// status 1). Only --without-credentials sends it, without any. The
// headers go with every request sent, but an Idempotency-Key, which is
// always the operation's own, and only
// to the scheme and host that --host names (https://api.example.com, in
// any case, with the port unless it is the scheme's default, 80 or 443), which
// headers need: the jar says where each operation goes, and whoever can
// write it can point one elsewhere. An operation whose URL goes to
// another host (whatever Host it names there: a request sent to an
// address under another Host goes to that address, which --host names),
// or to that host over the other scheme, where the credential could cross
// the network in the clear, is refused with a usage error and nothing is
// sent; so is resume --all when any pending operation goes elsewhere, or
// to more than one Host at that address: resume those by name, each with
// its own --host. resume waits for the lease of a
// program still sending an operation, for about a minute (the retry
// policy's MaxElapsed: a lease that runs longer leaves the operation
// pending, and resume fails for it), and for a next attempt time the
// server asked for (Retry-After), up to 30 s: a line on stderr says which,
// and until when. It sends an operation only if it is still
// pending then. One that the program finished meanwhile with a 2xx answer
// is not sent again: resume prints that answer's status on stdout, as for
// one it sent, saying another process got it, and counts it done. One
// finished otherwise (failed, or an answer not 2xx), abandoned or
// forgotten meanwhile is not sent either, and resume says so and fails.
// Neither is one whose body the jar did not store (larger than the
// program's MaxStoredBody): only the program that sent it can resume it,
// by making the same call again; past its horizon, it is marked for
// reconciliation, whatever its body. resume sends an operation of any method:
// a PUT or a DELETE that a program keyed (its Methods) as a POST.
//
// resume gives up an attempt that has no answer (its response headers)
// after --attempt-timeout, 1m by default (--horizon when shorter), and sends it again with the same
// key within the retry policy's defaults: at most 5 attempts, and no wait
// for a retry that would end more than a minute (MaxElapsed) after it
// began to resume the operation. The default is that minute, so that one
// hung attempt spends it: a resume ends on its own, within about a minute
// plus --attempt-timeout per operation, even when the server accepts the
// connection and never answers, as a command run from a shell or by cron
// must. A positive duration of at most --horizon (the retry horizon) is
// taken; 0, a negative one or a longer one is a usage error. An operation whose
// attempts all timed out may have happened: resume says that its outcome
// is unknown, keeps it pending under its key, and exits with status 1; a
// later resume sends the same key, and the server replays its answer if
// the request got through. SIGINT (Ctrl-C), SIGTERM or SIGHUP (the
// terminal closed; under nohup, ignored) stops resume --all, cutting off
// the operation it is sending, which stays pending under its key: one
// line says how many it did not resume, that one included, which stay
// pending, and it exits with status 1.
//
// resume does not send an operation first sent longer ago than --horizon,
// 24h by default, or, by its record, more than an hour ahead of this
// host's clock (retry.ClockAhead: a clock that ran ahead, its age unknown):
// it marks it for reconciliation, as the program that sent it would. The jar does not record that program's retry horizon
// (retry.Policy.Horizon); give it when the program set one, so that
// resume neither sends what the server may have forgotten the key of nor
// gives up what the program would still retry. --attempt-timeout is at
// most --horizon.
//
// show X shows the operation named X when there is one, and otherwise
// every operation whose key is X, as a server's log shows it (reading all
// of the jar: no index leads from keys to operations). The name wins: of
// an operation named by its own key (one sent without a name under the
// caller's Idempotency-Key), a line on stderr names the other operations
// sent with that key, if any (or says that the look for them failed, show
// still exiting 0); an operation whose key is the name of
// another, which has a key of its own, is not looked for (that would read
// all of the jar for every name): export lists it, with its key.
//
// abandon of an operation abandoned already changes nothing, its note
// (the reason given then) included: it says so, with that note, and that
// the reason given was not recorded.
//
// forget refuses a pending operation: its outcome is unknown, so its key
// must be kept. Reconcile first (ask the server what happened), then
// abandon it (it did not happen: a new call gets a new key) or resume it.
//
// prune deletes in batches of up to 1000 operations, each whole or not at
// all. SIGINT (Ctrl-C), SIGTERM or SIGHUP stops it: one line says how
// many it had deleted (the batch it was deleting then may be gone too,
// uncounted), and it exits with status 1. A prune that fails (a jar locked past
// --lock-timeout, a database error) says so in the same way, on the line
// of its error: the jar holds every other operation as it was. On a
// PostgreSQL jar, prune skips the operations another transaction holds
// locked (a worker changing one, another prune deleting it) rather than
// wait for them: a line on stderr then says how many it left, for a later
// prune, and it exits with status 0.
//
// A jar file may be in use by a running program. list, show and export
// only read it: they do not wait for the program's writes and show what it
// has committed. resume, abandon, forget and prune write: they wait for
// the program's write to end, up to --lock-timeout, and then fail.
// SIGINT (Ctrl-C), SIGTERM or SIGHUP ends that wait: the command says it
// was interrupted, exits with status 1, and writes nothing it was waiting
// to write, resume included, which then never took the operation's lease
// and has none to give back. A resume interrupted once it holds the lease
// (its request under way) waits up to --lock-timeout at its end to give
// it back (a second signal ends it at once: the lease runs out on its
// own).
// list, show and export open a jar file for reading alone
// (keyjar.Options.ReadOnly) and write nothing there: they need read access
// to the file and its -wal and -shm files (a SQLite file in WAL mode), and
// none to their directory. (A jar last closed by a version of keyjar that
// removed its -wal and -shm files, or one of them, is opened for writing
// once, which creates them, when the user may; when the user may not, the
// command says which is missing, and whether the user may not write the
// directory, the file, which that open writes too, or both.) They read a jar of an older schema version as it is, and
// never upgrade it: keyjar upgrades it when it opens it for writing, after
// which a program built with the earlier version of idem, which may be
// running on it, refuses it (keyjar.ErrVersion). So they refuse one whose
// -wal or -shm file is missing, which only that open creates, and
// write nothing: read it with the idemctl of that version. resume,
// abandon, forget and prune upgrade it. The
// other commands open it as its
// program does, for writing: they need write access to the three files
// and the directory. A jar on a read-only file system (EROFS), which no
// user may write, is said to be on one.
//
// export writes JSON, which holds only UTF-8, where a jar file holds any
// bytes: a string of a record that is not UTF-8 (an operation's name, its
// URL, a header's name or value, a note) is written with U+FFFD for its
// bad bytes, and has them all in base64 beside it, in the field named as
// its own with _base64: op_base64, url_base64, note_base64, and so on;
// header_base64 is the whole header, each name and value in base64. A
// stored body that is not UTF-8 is in body_base64 alone.
//
// list, export and resume --all read the jar in pages of 1000 operations,
// oldest first, each page one statement (which, on a PostgreSQL jar,
// --lock-timeout bounds) that begins after the last operation of the page
// before, and print a page before they read the next: they hold one page
// in memory whatever the jar's size, and keep no read open on a jar file
// between pages. An operation created while they run is listed if it
// comes after the page being read, and one deleted is not; an error
// reading a later page ends the output there, with exit status 1 (and
// export's JSON unfinished). A record that does not decode (its header
// damaged in the database, idem.RecordError) fails none of it: list,
// export and resume --all say on stderr which it is, with its key and
// state, skip it and go on with the others, and exit with status 1 at the
// end (export's JSON whole, without it). show of one says what of it
// decodes, and so does resume of one by name, which sends nothing; forget removes it, unless it is pending, under the key it has;
// abandon of one pending or reconcile marks it abandoned, under that key
// and unless a live process holds its lease, changing its state, note and
// lease alone: it is never resumed (its request does not read back), and
// forget or prune removes it then. list
// aligns the columns of each page on its own: past 1000 operations, the
// columns of one page may be wider than those of another. resume --all
// reads the pending operations twice: for their hosts and methods (the
// check of --host above), then to resume them, up to the last one its
// first walk read; one pending since that is after it is left for the
// next resume. SIGINT (Ctrl-C), SIGTERM or SIGHUP stops list and export,
// while they read or print, with exit status 1. A second such signal ends
// idemctl at once, by that signal: an operation it was sending stays
// pending under its key, as after the first.
//
// Exit status: 0 on success, 1 when the jar cannot be used (missing,
// locked, corrupt, or a PostgreSQL jar that lost a table, an index or the
// record of its version) or an operation fails, 2 for a usage error: one
// that the command line shows is found before the jar is opened, whatever
// the jar's state (resume's refusal of an operation that goes to another
// host than --host, which reads the jar, comes after).
// Every error is one line on stderr, the password of a URL it quotes
// masked (user:xxxxx@), and its query's secrets (?api_key=xxxxx): a
// transport's error may quote one, as net/http's does for a malformed
// HTTPS_PROXY, and net/http's quote a request's URL. What idemctl prints of a jar's
// records (name, key, state, fingerprint, lease holder, URL, headers,
// body, last error, note) and of a server's answers (a status, an error's
// body) has its control characters and bidi format characters escaped
// (\x1b, \u202e), never sent to the terminal as they are. A record's field
// that has any, or a character that shows as nothing or as a plain space
// (\u200b, \u00a0), or a space at either end, is printed whole as a Go
// string literal, between double quotes ("a\x1bb", "pay:1 "), those and
// its backslashes and quotes escaped: it is not printed as one without
// them (a\x1bb, printed as it is; pay:1). Commands take
// a name as it is: one printed quoted is given as the literal says (in
// bash, $'a\x1bb'); one printed unquoted, as it is printed (one that
// begins with "-" after "--", which ends the flags). A name holding a NUL
// (\x00) cannot be given: a command line ends the argument there, at the
// name of another operation, if any; show it by its key. list prints
// a name whole, however long, so that two names that begin alike are not
// printed alike (it cuts a last error and a note, with "…"). A record written by a version
// that stored a URL's userinfo (user:password@) keeps it in its URL, and in
// its last error when that quotes the URL: list, show and export print the
// password masked, user:xxxxx@, as url.URL.Redacted does (export's
// url_base64 and last_error_base64 too). The jar keeps it, and resume
// sends the URL as it is, its userinfo as Basic credentials. So too a
// URL's query parameters whose names say they hold a secret, as a header's
// name says it to idem.SecretHeader (password, sslpassword, api_key,
// access_token, X-Amz-Signature…), and sig, pwd, pw, pass, passcode, pin,
// otp, totp, code, sid, bearer, creds and ticket, but not an
// idempotency key's (idempotency_key): list, show and export print their
// values as xxxxx, in the URL and where its last error quotes it; the jar
// keeps them (a resume needs the URL as it was), and resume sends them.
// So too a record written by a version whose idem.SecretHeader named fewer
// headers may hold one that it names now (an exchange's
// CB-ACCESS-PASSPHRASE): show and export print its value as xxxxx
// (export's header_base64 too), the jar keeps it, and resume sends it,
// unless --header gives that header.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/internal/cliflag"
	"github.com/idemkit/idem/internal/ctlesc"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/stopsig"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5/pgconn"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	// The first SIGINT, SIGTERM or SIGHUP stops the command; a second one
	// ends the process at once.
	stopsig.Notify(cancel)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// run runs idemctl with args (without the program name) and returns its
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

const usage = `usage: idemctl [--jar PATH|URL] COMMAND [ARGS]

commands:
  list [--status S]                      operations, oldest first (S: pending, done, failed, reconcile, abandoned),
                                         in pages of 1000, each with its columns aligned on its own
  show (OP | KEY)                        one operation in full, by its name or by its Idempotency-Key
  resume (OP | --all) [--header 'N: V'  send pending operations again with their keys, giving up an
         --host URL]                     attempt without an answer after D (default 1m, or H if shorter; at most H);
         [--attempt-timeout D]           one first sent more than H ago (default 24h) is marked reconcile;
         [--horizon H]                   the jar keeps no credential: give the first send's with --header
         [--without-credentials]         or, out of the process list, in $IDEM_HEADER ('N: V', one per line),
                                         and with --host the scheme and host it is for (https://api.example.com):
                                         an operation that goes elsewhere is not sent, nor one whose credentials
                                         (show: "not stored") are not all given, nor, given no credential at
                                         all, any (its program may have added them), unless --without-credentials
  abandon OP --reason R                  record that OP did not happen and is not running (also one whose
                                         record does not decode: it is never resumed)
  forget OP                              delete OP once its outcome is known
  prune --older-than D                   delete done, failed and abandoned operations not updated for D (e.g. 720h, 30d)
  export [--json]                        every operation as a JSON array; a string that is not UTF-8 has
                                         its bytes in base64 beside it (op_base64, url_base64, header_base64…)

A name is given as it is; one that begins with "-" goes after --, after the flags
(idemctl abandon --reason R -- -name).

flags of every command:
  --jar PATH|URL      the jar file, or a postgres:// URL (default: $IDEM_JAR)
  --lock-timeout D    how long to wait for a jar locked by another process (default 2s);
                      for PostgreSQL, how long each statement may run (at most 596h31m23.647s)
`

// errFailed reports that a command printed its own errors: exit status 1.
var errFailed = errors.New("some operations failed")

// session is what a command works with.
type session struct {
	jar         client.Jar
	path        string // the jar's name, fit to print
	lockTimeout time.Duration
	// hint is what of the command may need a longer --lock-timeout on
	// a large PostgreSQL jar (timeoutHint).
	hint   string
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	run func(ctx context.Context, s *session, fs *flag.FlagSet, args []string) error
	// flags declares the command's own flags on the command's flag set.
	flags func(fs *flag.FlagSet)
	// check refuses the arguments and flags that the command cannot take,
	// with a usage error, before the jar is opened: a usage error is one
	// whatever the jar's state. run takes what check let through.
	check func(fs *flag.FlagSet, args []string) error
	// readOnly: the command only reads the jar, which it opens so.
	readOnly bool
}

// takesName reports whether the command called name takes an operation's
// name as its argument.
func takesName(name string) bool {
	return name == "show" || name == "resume" || name == "abandon" || name == "forget"
}

// lookup returns the command called name.
func lookup(name string) (command, bool) {
	switch name {
	case "list":
		return command{run: list, check: checkList, readOnly: true, flags: func(set *flag.FlagSet) { set.String("status", "", "only operations in this state") }}, true
	case "show":
		return command{run: show, check: checkOneArg("show"), readOnly: true}, true
	case "resume":
		return command{run: resume, check: checkResume, flags: resumeFlags}, true
	case "abandon":
		return command{run: abandon, check: checkAbandon, flags: func(set *flag.FlagSet) { set.String("reason", "", "how you established that it did not happen") }}, true
	case "forget":
		return command{run: forget, check: checkOneArg("forget")}, true
	case "prune":
		return command{run: prune, check: checkPrune, flags: func(set *flag.FlagSet) { set.String("older-than", "", "age of the last update, such as 720h or 30d") }}, true
	case "export":
		return command{run: export, check: checkExport, readOnly: true, flags: func(set *flag.FlagSet) { set.Bool("json", true, "JSON (the only format)") }}, true
	}
	return command{}, false
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "idemctl: internal error: %s\n", oneLine(fmt.Sprint(r)))
			code = 1
		}
	}()
	err := dispatch(ctx, args, stdout, stderr)
	var ue *cliflag.UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "idemctl: %s (idemctl help for usage)\n", oneLine(ue.Error()))
		return 2
	case errors.Is(err, errFailed):
		return 1
	}
	fmt.Fprintf(stderr, "idemctl: %s\n", oneLine(err.Error()))
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	global := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	jarPath := global.String("jar", os.Getenv("IDEM_JAR"), "")
	lockTimeout := cliflag.Duration(global, "lock-timeout", 2*time.Second, "")
	if err := global.Parse(args); err != nil {
		return flagError(err, args)
	}
	args = global.Args()
	if len(args) == 0 {
		return cliflag.Usagef("no command")
	}
	name, args := args[0], args[1:]
	if name == "help" || name == "-h" || name == "--help" {
		return flag.ErrHelp
	}
	cmd, ok := lookup(name)
	if !ok {
		return cliflag.Usagef("unknown command %s", dsn.Quote(name))
	}
	set := flag.NewFlagSet(name, flag.ContinueOnError)
	set.SetOutput(io.Discard)
	set.StringVar(jarPath, "jar", *jarPath, "")
	cliflag.DurationVar(set, lockTimeout, "lock-timeout", *lockTimeout, "")
	if cmd.flags != nil {
		cmd.flags(set)
	}
	pos, err := parseInterspersed(set, args)
	if err != nil {
		if takesName(name) && strings.HasPrefix(err.Error(), "flag provided but not defined") {
			// list prints a name that begins with "-" as it is.
			return cliflag.Usagef("%s; a name that begins with \"-\" goes after --, as in idemctl %s -- -name",
				dsn.Scrub(err.Error(), args...), name)
		}
		return flagError(err, args)
	}
	if *jarPath == "" {
		return cliflag.Usagef("no jar: give --jar PATH or set IDEM_JAR")
	}
	if *lockTimeout <= 0 {
		return cliflag.Usagef("--lock-timeout must be positive")
	}
	if why := dsn.Refused(*jarPath); why != "" {
		return cliflag.Usagef("--jar: %s", why)
	}
	if dsn.IsURL(*jarPath) && *lockTimeout > maxPgLockTimeout {
		return cliflag.Usagef("--lock-timeout %v is above %v, the longest a PostgreSQL statement may run", *lockTimeout, maxPgLockTimeout)
	}
	if err := cmd.check(set, pos); err != nil {
		return err
	}
	jar, closeJar, err := openJarFn(ctx, *jarPath, *lockTimeout, cmd.readOnly)
	if err != nil {
		return err
	}
	out := &counting{w: stdout}
	defer func() {
		// Close writes what the command left deferred (an outcome, a
		// lease's release) and syncs the jar: its failure is the
		// command's, unless the command failed first.
		cerr := closeJar()
		switch {
		case errors.Is(cerr, idem.ErrDropped) && out.n > 0:
			// resume's answers, printed, whose outcome the jar did not
			// write (another process held it past --lock-timeout).
			cerr = fmt.Errorf("%w; an answer printed above may not be recorded: its operation then stays pending, and a later resume of it gets the server's saved answer", cerr)
		case errors.Is(cerr, idem.ErrDropped):
			// Nothing printed: a lease's release, or the outcome of a
			// call that printed no answer.
			cerr = fmt.Errorf("%w; the operation stays as the jar last recorded it (a lease it records runs out on its own)", cerr)
		}
		if cerr != nil && (err == nil || errors.Is(err, errFailed)) {
			// A command whose failures are printed already (resume --all
			// of which some failed) exits 1 all the same: the close's
			// error is said, rather than nothing more.
			err = cerr
		}
	}()
	s := &session{jar: jar, path: printable(*jarPath), lockTimeout: *lockTimeout, hint: timeoutHint(name, set), stdout: out, stderr: stderr}
	err = cmd.run(ctx, s, set, pos)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) && !strings.HasPrefix(err.Error(), "interrupted: ") {
		// SIGINT, SIGTERM or SIGHUP ended a jar's call (abandon's,
		// forget's, waiting for another process's lock): said as such,
		// as list and export say it.
		err = interrupted(err)
	}
	return s.describe(err)
}

// parseInterspersed parses set's flags wherever they are among args, as in
// "abandon OP --reason R", and returns the other arguments. Every argument
// after "--" is positional.
func parseInterspersed(set *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	var pos []string
	for len(args) > 0 { // each round consumes at least one argument
		if err := set.Parse(args); err != nil {
			return nil, err
		}
		args = set.Args()
		if len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	return append(pos, rest...), nil
}

// flagError returns the flag package's error of parsing args as a usage
// error, each argument that names a database in it as dsn.Quote gives it:
// the flag package quotes a value it refuses whole (a --jar URL given to
// --lock-timeout), password and all.
func flagError(err error, args []string) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return cliflag.Usagef("%s", dsn.Scrub(err.Error(), args...))
}

// openJar opens the jar that spec names, choosing its kind by spec's form:
// a PostgreSQL URL (postgres:// or postgresql://) opens a pgjar, anything
// else is the path of a SQLite key jar file. Either must exist already.
// With readOnly, a jar file is opened for reading alone; a PostgreSQL jar
// is opened as for writing. openJarFn is openJar; tests replace it.
var openJarFn = openJar

func openJar(ctx context.Context, spec string, lockTimeout time.Duration, readOnly bool) (client.Jar, func() error, error) {
	if dsn.IsURL(spec) {
		return openPostgres(ctx, spec, lockTimeout)
	}
	// Nothing is checked before: the open itself refuses a missing file
	// (which could be removed after any check) and one without a jar.
	j, err := openKeyjar(ctx, spec, &keyjar.Options{BusyTimeout: lockTimeout, MustExist: true, ReadOnly: readOnly})
	if readOnly && errors.Is(err, keyjar.ErrReadOnly) && !errors.Is(err, keyjar.ErrOldVersion) {
		// Its -wal and -shm files are missing (a version of keyjar that
		// removed them at Close was the last to close it): opened for
		// writing, as every command did before, which creates them, when
		// this user may; when it may not, the read-only open's error says
		// why, and any other failure (a damaged file) is the open's. A
		// jar of an older schema version without the files
		// (keyjar.ErrOldVersion) is not: an open for writing would upgrade
		// it, after which a program built with the earlier version of
		// idem, which may be running on it, refuses it.
		jw, werr := openKeyjar(ctx, spec, &keyjar.Options{BusyTimeout: lockTimeout, MustExist: true})
		if werr == nil {
			return jw, jw.Close, nil
		}
		if !errors.Is(werr, fs.ErrPermission) || errors.Is(werr, syscall.EROFS) {
			// A read-only file system is said as such: no user may
			// create the files there.
			err = werr
		} else if refusedFile(werr, spec) {
			// The jar file itself is read-only to this user, whatever
			// its directory.
			err = fmt.Errorf("%w (%w)", err, errJarFileReadOnly)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s: no such jar file", spec)
	}
	if err != nil {
		return nil, nil, explain(spec, lockTimeout, err)
	}
	return j, j.Close, nil
}

// openKeyjar is keyjar.Open; tests replace it.
var openKeyjar = keyjar.Open

// errJarFileReadOnly marks the error of a read-only open of a jar file
// without its -wal and -shm files that this user may not open for writing,
// which creates them, as the file itself is read-only to the user.
var errJarFileReadOnly = errors.New("the jar file is read-only to this user")

// refusedFile reports whether err, a keyjar.Open's permission error, is
// the refusal of the jar file at path itself, rather than of its directory
// or the files beside it.
func refusedFile(err error, path string) bool {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return false
	}
	refused, err1 := os.Stat(pe.Path)
	jar, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(refused, jar)
}

// walMissing says which of the -wal and -shm files of the jar file at
// path, read-only Open's refusal of which (keyjar.ErrReadOnly) says that
// one is missing, are missing now, with what them refers to, the file or
// the files.
func walMissing(path string) (missing, them string) {
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p // SQLite's -wal and -shm files are beside the file
	}
	var gone []string
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Lstat(path + suffix); errors.Is(err, fs.ErrNotExist) {
			gone = append(gone, suffix)
		}
	}
	switch len(gone) {
	case 1:
		return "its " + gone[0] + " file is missing", "it"
	case 0: // created since the open
		return "its -wal or -shm file was missing", "it"
	}
	return "its -wal and -shm files are missing", "them"
}

// connectTimeout bounds connecting to a PostgreSQL jar and opening it.
const connectTimeout = 30 * time.Second

// maxPgLockTimeout is the longest --lock-timeout of a PostgreSQL jar:
// PostgreSQL's longest statement_timeout, 2^31-1 ms, above which pgjar
// refuses its QueryTimeout.
const maxPgLockTimeout = math.MaxInt32 * time.Millisecond

// openPostgres opens the pgjar in the database dsn names. The database
// must already hold a jar (a worker's pgjar.Open creates it): idemctl
// never creates one, so a URL naming the wrong database fails instead of
// showing an empty jar. Each statement runs for at most lockTimeout.
func openPostgres(ctx context.Context, dsn string, lockTimeout time.Duration) (client.Jar, func() error, error) {
	octx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// Nothing is checked before: the open itself refuses a database
	// without the jar's tables (which could be dropped after any check).
	j, err := openPgjar(octx, dsn, &pgjar.Options{QueryTimeout: lockTimeout, MustExist: true})
	if err != nil {
		return nil, nil, explainOpen(octx, printable(dsn), lockTimeout, err)
	}
	return j, j.Close, nil
}

// openPgjar is pgjar.Open; tests replace it.
var openPgjar = pgjar.Open

// explainOpen is explain for pgjar.Open's error, run within ctx. pgjar waits
// for a statement at most twice its QueryTimeout (--lock-timeout) and then
// returns an error wrapping context.DeadlineExceeded; on a loaded machine or
// network that can come before the server's own statement_timeout does. It
// is the same timeout, unless ctx, the connection's whole time, ran out.
func explainOpen(ctx context.Context, where string, lockTimeout time.Duration, err error) error {
	var (
		parseErr   *pgconn.ParseConfigError
		connectErr *pgconn.ConnectError
		pgErr      *pgconn.PgError
	)
	switch {
	case errors.Is(err, pgjar.ErrOldVersion): // before ErrNoJar, which it matches too
		// pgjar gives the schema and the version it records after the
		// sentinel.
		_, version, _ := strings.Cut(err.Error(), pgjar.ErrOldVersion.Error())
		return fmt.Errorf("%s holds a key jar of an older schema version%s, which idemctl does not upgrade, nothing written: a program built with this version of idem upgrades it when it opens it, after which one built with the earlier version refuses it. Use the idemctl of that version; once every program that uses the jar runs this version, the first to start upgrades it", where, version)
	case errors.Is(err, pgjar.ErrNoJar):
		// pgjar says what is missing after the sentinel; and, when the
		// search_path led past a jar in another schema (ErrSchema or
		// ErrPrivilege too), where it is and what to do: a program
		// would refuse to create one.
		_, missing, _ := strings.Cut(err.Error(), pgjar.ErrNoJar.Error())
		if errors.Is(err, pgjar.ErrSchema) || errors.Is(err, pgjar.ErrPrivilege) {
			return fmt.Errorf("%s holds no key jar%s", where, missing)
		}
		return fmt.Errorf("%s holds no key jar%s; a program using pgjar creates it", where, missing)
	case errors.Is(err, pgjar.ErrNoSchema):
		// pgjar gives the search_path after the sentinel, then what a
		// program would do, which idemctl says in its own words.
		_, path, _ := strings.Cut(err.Error(), pgjar.ErrNoSchema.Error()+": ")
		path, _, _ = strings.Cut(path, "; ")
		return fmt.Errorf("%s holds no key jar: %s; name the jar's schema with search_path=… in the URL, and grant the role USAGE on it", where, path)
	case errors.Is(err, pgjar.ErrSchema):
		// pgjar names what is missing after the sentinel (a table, an
		// index, the record of the version): a table dropped took its
		// keys with it, and pgjar re-creates nothing.
		_, missing, _ := strings.Cut(err.Error(), pgjar.ErrSchema.Error()+": ")
		if errors.Is(err, pgmigrate.ErrPathDropped) {
			// Nothing is wrong with the tables: the session looks for
			// them elsewhere, and pgjar says why and what to do.
			return fmt.Errorf("%s: %s", where, missing)
		}
		if errors.Is(err, pgmigrate.ErrIndexOnly) {
			// pgjar says which index and how to create it: a restore
			// from a backup would lose the keys written since.
			return fmt.Errorf("%s: the key jar's schema lacks an index, nothing written (%s)", where, missing)
		}
		return fmt.Errorf("%s: the key jar's schema is damaged (%s); keys may be lost: restore the jar's tables from a backup", where, missing)
	case errors.Is(err, pgjar.ErrPrivilege), errors.Is(err, pgjar.ErrPool):
		// pgjar names the table and what to grant, or the setting a
		// pooler dropped and where to set it; the line names the
		// database, as every other refusal at open does.
		return fmt.Errorf("%s: %w", where, err)
	case errors.Is(err, context.DeadlineExceeded):
		if ctx.Err() != nil {
			return fmt.Errorf("%s: no answer within %v", where, connectTimeout)
		}
		return statementTimeout(where, lockTimeout, "")
	case errors.As(err, &connectErr) && errors.As(err, &pgErr):
		// The server's refusal (no such database, a wrong password)
		// alone: pgx lists every address and TLS mode it tried, and the
		// default sslmode, prefer, makes the first line a refused TLS
		// attempt. A PgBouncer's refusal of a startup parameter is
		// followed by what to do about it.
		if hint := pgmigrate.PoolerHint(pgErr); hint != "" {
			return fmt.Errorf("%s: %w; %s", where, pgErr, hint)
		}
		return fmt.Errorf("%s: %w", where, pgErr)
	case errors.As(err, &connectErr):
		// No answer (a dial error, a timeout): pgx tries each address
		// with TLS and then without, and lists each attempt's error, the
		// same one twice. Each once.
		return fmt.Errorf("%s: %s", where, pgmigrate.Unreachable(err))
	case errors.As(err, &parseErr):
		return fmt.Errorf("%s: %w", where, parseErr)
	}
	return explain(where, lockTimeout, err)
}

// statementTimeout is the error of a PostgreSQL statement that ran out of
// --lock-timeout; hint, what of the command may need a longer one on a
// large jar ("" for none: a command, or the open, whose statements each
// read or write one operation, or the jar's schema).
func statementTimeout(where string, lockTimeout time.Duration, hint string) error {
	if hint != "" {
		hint = ": a large jar may need a longer one, as " + hint
	}
	return fmt.Errorf("%s: a statement ran out of --lock-timeout (%v), waiting for another process or on a slow database; try again later or raise --lock-timeout%s", where, lockTimeout, hint)
}

// timeoutHint returns the hint of statementTimeout for the command called
// name, whose flags are set: what of it reads much of the jar in one
// statement.
func timeoutHint(name string, set *flag.FlagSet) string {
	switch name {
	case "show":
		return "show by key reads all of it (and so does show of a name it does not hold, which it then looks up as a key)"
	case "list", "export":
		return name + " reads it 1000 operations per statement"
	case "resume":
		if f := set.Lookup("all"); f != nil && f.Value.String() == "true" {
			return "resume --all reads its pending operations 1000 per statement"
		}
	case "prune":
		return "prune counts all of the operations it may delete in one statement, then deletes them 1000 per statement"
	}
	return ""
}

// printable returns the jar's name fit to print: a PostgreSQL URL without
// its password, in the userinfo or the query.
func printable(spec string) string {
	if !dsn.IsURL(spec) {
		return spec
	}
	return dsn.Redacted(spec, "the PostgreSQL database")
}

// explain turns a jar error into a sentence for the operator.
func explain(path string, lockTimeout time.Duration, err error) error {
	return explainHint(path, lockTimeout, "", err)
}

// explainHint is explain for a command whose statementTimeout hint is hint.
func explainHint(path string, lockTimeout time.Duration, hint string, err error) error {
	switch {
	case errors.Is(err, keyjar.ErrCorrupt):
		// keyjar says what it found after the sentinel's words: the
		// server's database, another program's, not SQLite at all.
		_, found, _ := strings.Cut(err.Error(), strings.TrimPrefix(keyjar.ErrCorrupt.Error(), "keyjar: "))
		return fmt.Errorf("%s is not a key jar or is corrupt%s", path, found)
	case errors.Is(err, keyjar.ErrLocked):
		return fmt.Errorf("%s is locked by another process (waited %v); try again later or raise --lock-timeout", path, lockTimeout)
	case errors.Is(err, keyjar.ErrVersion), errors.Is(err, pgjar.ErrVersion):
		return fmt.Errorf("%s was written by a newer version of idem; use a newer idemctl", path)
	case isStatementTimeout(err), isJarDeadline(err):
		return statementTimeout(path, lockTimeout, hint)
	case errors.Is(err, keyjar.ErrOldVersion) && errors.Is(err, keyjar.ErrReadOnly):
		missing, them := walMissing(path)
		return fmt.Errorf("%s: the jar has an older schema version and %s: list, show and export read such a jar only by opening it for writing, which creates %s and upgrades it, after which the program built with the earlier version of idem that uses it refuses it; nothing written. Read it with the idemctl of that version, or while its program has it open (which keeps the files); once every program that uses the jar runs this version, the first to open it upgrades it", path, missing, them)
	case errors.Is(err, keyjar.ErrOldVersion):
		// keyjar gives the version after the sentinel.
		_, version, _ := strings.Cut(err.Error(), strings.TrimPrefix(keyjar.ErrOldVersion.Error(), "keyjar: "))
		version, _, _ = strings.Cut(version, ",")
		return fmt.Errorf("%s holds a key jar of an older schema version%s, which idemctl does not upgrade, nothing written: a program built with this version of idem upgrades it when it opens it, after which one built with the earlier version refuses it. Use the idemctl of that version; once every program that uses the jar runs this version, the first to open it upgrades it", path, version)
	case errors.Is(err, keyjar.ErrReadOnly):
		missing, them := walMissing(path)
		who := "the jar's directory"
		if errors.Is(err, errJarFileReadOnly) {
			// Its directory may be writable: the open that creates
			// them writes the file too.
			dir := path
			if p, err := filepath.EvalSymlinks(path); err == nil {
				dir = p
			}
			switch ok, known := mayWrite(filepath.Dir(dir)); {
			case ok:
				who = "the jar file"
				missing += ", and this user may not write the jar file, which the open that creates " + them + " writes"
			case known:
				who = "the jar file and its directory"
				missing += ", and this user may write neither the jar file, which the open that creates " + them + " writes, nor its directory"
			default:
				who = "the jar file and its directory"
				missing += ", and this user may not write the jar file, which the open that creates " + them + " writes"
			}
		} else {
			missing += ", and this user may not create " + them
		}
		return fmt.Errorf("%s: %s: list, show and export read a jar without writing only when its -wal and -shm files exist. Run any idemctl command once as a user who may write %s, or start the program that uses the jar: keyjar creates them and keeps them from then on", path, missing, who)
	case errors.Is(err, syscall.EROFS): // before fs.ErrPermission, which keyjar makes it match too
		return fmt.Errorf("%s: the file system it is on is read-only (EROFS), which no user may write: list, show and export read the jar without writing, when its -wal and -shm files are there; resume, abandon, forget and prune write it, and its -wal and -shm files beside it: remount the file system read-write to run them", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: permission denied; list, show and export read the file and its -wal and -shm files, the other commands write them and their directory: run idemctl as a user who may", path)
	case pgmigrate.Insufficient(err) && !errors.Is(err, pgjar.ErrPrivilege): // pgjar's says what to grant
		// Open with MustExist checks no write privilege: a role that may
		// read the jar opens it, and the command that writes is refused.
		return fmt.Errorf("%s: %w; list, show and export read the jar, resume, abandon, forget and prune write it too: they need SELECT, INSERT, UPDATE and DELETE on its table, granted to the URL's user", path, err)
	}
	return err
}

// describe makes a command's error clear: the jar's failures as in
// explain.
func (s *session) describe(err error) error {
	if err == nil {
		return nil
	}
	var ue *cliflag.UsageError
	if errors.As(err, &ue) || errors.Is(err, errFailed) {
		return err
	}
	return explainHint(s.path, s.lockTimeout, s.hint, err)
}

// isStatementTimeout reports whether PostgreSQL cancelled a statement
// that ran longer than its statement_timeout.
func isStatementTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014" // query_canceled
}

// isJarDeadline reports whether err is a jar's that wraps
// context.DeadlineExceeded: pgjar waits for a statement at most twice its
// QueryTimeout (--lock-timeout), as explainOpen says, and the command's own
// context has no deadline. A request's error that wraps one (resume's
// *idem.PendingError) is not the jar's.
func isJarDeadline(err error) bool {
	var pe *idem.PendingError
	return errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &pe)
}

// oneLine makes s, an error's message, one line fit to print: its runs of
// white space are one space each, and its other control characters, its
// bidi format characters and bytes that are not UTF-8 are escaped (\x1b,
// \a, \u202e) by ctlesc.Escape, as they may come from a server's answer or
// a jar, and a terminal would run them or reorder what it shows. The
// passwords of the URLs it quotes, and their queries' secrets, are masked
// (dsn.MaskPasswords), as a transport's error may quote one (net/http's,
// for a malformed HTTPS_PROXY), which the jar keeps masked.
func oneLine(s string) string {
	return ctlesc.Escape(dsn.MaskPasswords(strings.Join(strings.Fields(s), " ")))
}

// counting is an io.Writer that counts the bytes written through it to w:
// whether a command printed anything (an answer whose outcome Close may
// then drop).
type counting struct {
	w io.Writer
	n int64
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
