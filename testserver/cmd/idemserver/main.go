// Command idemserver runs the reference server: the payments API of
// testserver/payments behind the idempotency Middleware, with its keys and
// its PayCo ledger in one database: a SQLite file (testserver/sqlitestore),
// or a PostgreSQL database (testserver/pgstore) when -db is a postgres:// or
// postgresql:// URL (a key=value connection string, "host=db dbname=idem",
// is refused: give the URL). A password in the URL is shown by the process
// list to every user of the machine: give it in PGPASSWORD or ~/.pgpass,
// which pgx reads for a URL without one.
//
//	go run ./testserver/cmd/idemserver                 # listens on 127.0.0.1:8080, ./idemserver.db
//	go run ./testserver/cmd/idemserver -addr 127.0.0.1:0 -db /tmp/idem.db -on-error save
//	go run ./testserver/cmd/idemserver -db 'postgres://idem@db:5432/idem?sslmode=verify-full'
//
// It prints the address it listens on. Once it serves, and then every
// -prune-every (1 h; at least 1 s; 0 never), it deletes the keys older than -retention
// (25 h), and logs how many to stderr when it deleted some, and the error,
// at ERROR, when it failed. On SIGINT, SIGTERM or SIGHUP (its terminal
// closed; started with SIGHUP ignored, as by nohup, it ignores it) it stops
// listening and waits for the requests in flight to be answered, up to the
// time a request with an Idempotency-Key may take: 30 s for its body to
// arrive, -lock-timeout, which ends its handler, and 10 s to save its
// answer. A request without a key
// (-optional-key) that -delay holds longer is cut off. A second SIGINT,
// SIGTERM or SIGHUP ends the process at once, also when it was started with SIGINT
// ignored, as a non-interactive shell starts a background job: the keys of
// the requests it cuts off stay claimed, and their retries are answered 409,
// for up to -lock-timeout, after which a retry takes the claim over and runs
// the request again (the line that says it is stopping says so). Several
// processes may serve the same -db at once: on one machine a SQLite file,
// across machines a PostgreSQL database, where they share the keys and the
// ledger.
//
// On PostgreSQL, -query-timeout (pgstore's QueryTimeout, 5 s by default, at
// most 2^31-1 ms) is the statement_timeout of the keys' sessions and of the
// ledger's, unless the URL sets statement_timeout: the server cancels a
// statement that runs longer, and the request that ran it fails. The
// ledger's sessions run, as the keys' do, under READ COMMITTED and with
// synchronous_commit on (unless the URL sets it), whatever the database's
// or the role's defaults (see pgstore). -migration-timeout (pgstore's
// MigrationTimeout: 10 minutes, or -query-timeout when longer, by default)
// bounds the migration of the keys' schema that a server runs at start on a
// database an earlier version created, whatever the URL's
// statement_timeout: version 2 rewrites the key table and rebuilds its
// primary key, in one statement. A server whose migration, or whose wait
// for another server's, ran out of it exits with status 1, the database
// left at its version, and says to raise -migration-timeout; one whose
// -query-timeout (or the URL's statement_timeout) is too short to connect
// and read the schema at all says to raise that (it waits twice
// -query-timeout for the database's answers). After a
// restart of PostgreSQL, or a pg_terminate_backend of its sessions, the
// server works from its first request: neither the keys' pool nor the
// ledger's hands a statement a connection the server closed.
//
// Fault switches, for demos and labs: -fail-after-charge P answers 500 after
// PayCo charged, with probability P; -crash-after-charge P exits the process
// (status 3) right after PayCo charged; -delay D holds each answer; -no-dedup
// makes PayCo ignore its key; -optional-key lets requests without a key
// through unprotected. -seed fixes the random draws.
//
// Errors go to stderr: the ledger's behind a payco-failed or
// ledger-unavailable answer, and the key store's behind a store-unavailable
// answer or a save that failed, with the Middleware's other records at
// INFO and above (take-overs, fenced writes, a key reused, a panic). No
// answer names them. -v adds every decision.
//
// Exit status: 0 after a graceful stop, every request in flight answered
// (or asked for before it served: while connecting to the database or
// migrating it), and for -h or -help; 1 when the server cannot start (the database cannot
// be opened or is another program's, the address cannot be listened on; a
// PostgreSQL server that cannot be connected to is told in one line, its
// URL without the password and the cause) or
// fails while serving, or when requests were still in flight at the end of
// the wait (their connections are closed); 2 for a usage error: an unknown
// flag, a flag value that does not parse or is out of range (an empty
// -addr or -db among them), an argument besides the flags; 3 for -crash-after-charge. A second signal ends the
// process by that signal, but for a SIGINT that the process was started
// ignoring, which it cannot die by: that one exits with status 130, as a
// shell tells a process ended by SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/cliflag"
	dsnpkg "github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/reconnect"
	"github.com/idemkit/idem/internal/stopsig"
	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/payments"
	"github.com/idemkit/idem/testserver/pgstore"
	"github.com/idemkit/idem/testserver/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// crashStatus is the exit status of -crash-after-charge.
const crashStatus = 3

// saveTimeout is how long the Middleware may take, after its handler
// returned, to save the answer or release the claim (testserver documents
// 10 s).
const saveTimeout = 10 * time.Second

// readTimeout is the server's ReadTimeout: how long a request, its body
// included, may take to arrive. A keyed request is claimed once its body
// is read.
const readTimeout = 30 * time.Second

// stopWait is what a stop waits for requests in flight beyond the lock
// timeout, which ends a protected handler: a request whose body was still
// arriving (readTimeout), and the save of its answer (saveTimeout).
const stopWait = readTimeout + saveTimeout

// minLockTimeout is the smallest -lock-timeout. The lease runs from the
// claim's token, so it must hold the claim, a committed write (an fsync of
// the SQLite file, or a round trip and a commit on PostgreSQL: a few
// milliseconds on a local disk, tens on a slow one or across a network),
// and the handler's charge, another such write. A shorter lease is spent
// before the handler runs, or cuts its charge off: every request then
// answers 503 (the claim outlasted the lease) or 502, which no client
// retries into a success. 100 ms holds both writes with room to spare.
const minLockTimeout = 100 * time.Millisecond

// minPruneEvery is the shortest -prune-every but 0. Keys are kept a day
// at least: a prune a second deletes, each time, what a second aged past
// -retention; a shorter interval only keeps the store busy deleting
// nothing, and 1ns runs one prune after another.
const minPruneEvery = time.Second

// maxLockTimeout is the largest -lock-timeout: one more and the wait of a
// stop, the lock timeout and stopWait, overflows time.Duration.
const maxLockTimeout = math.MaxInt64 - stopWait

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	// The first SIGINT, SIGTERM or SIGHUP stops the server gracefully; a second one
	// ends the process at once.
	stopsig.Notify(cancel)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	cliflag.Exit("idemserver", err)
}

// backend is where the server keeps its keys and its ledger.
type backend struct {
	store testserver.Store
	payco *payments.PayCo
	close func() error
}

// openBackend opens the database named by dsn: a PostgreSQL URL or a SQLite
// file path. Every choice of backend goes through here.
func openBackend(ctx context.Context, dsn string, opts *pgstore.Options) (*backend, error) {
	if dsnpkg.IsURL(dsn) {
		b, err := openPostgres(ctx, dsn, opts)
		return b, unreachable(err, dsn)
	}
	s, err := sqlitestore.Open(ctx, dsn, nil)
	if err != nil {
		return nil, err
	}
	payco, err := payments.NewPayCo(ctx, s.DB())
	if err != nil {
		s.Close()
		return nil, err
	}
	return &backend{store: s, payco: payco, close: s.Close}, nil
}

// redact returns dsn fit to print: a PostgreSQL URL without its password.
func redact(dsn string) string {
	if !dsnpkg.IsURL(dsn) {
		return dsn
	}
	return dsnpkg.Redacted(dsn, "a PostgreSQL database")
}

// connectError is a connection to the database that failed, told in one
// line, as net's errors are: what failed, connecting to the database at its
// URL without the password, and why: each attempt's error once, as
// pgmigrate.Attempts gives them. pgx's own message takes a line per
// attempt (two for one host under sslmode=prefer) under a prefix that names
// neither the host nor the port. errors.As still finds pgx's error.
type connectError struct {
	dsn string // redacted
	err *pgconn.ConnectError
}

func (e *connectError) Error() string {
	return "connecting to the database at " + e.dsn + ": " + strings.Join(pgmigrate.Attempts(e.err), "; ")
}

func (e *connectError) Unwrap() error { return e.err }

// unreachable returns err, openPostgres's, as a *connectError when a
// connection to the database failed.
func unreachable(err error, dsn string) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil {
		return err
	}
	return &connectError{dsn: redact(dsn), err: ce}
}

// paycoLock is the key of the advisory lock under which a server creates
// PayCo's tables in PostgreSQL: CREATE TABLE IF NOT EXISTS is not safe
// against a concurrent CREATE, and a fleet's servers start together.
const paycoLock = 0x6964656d70617963 // "idempayc"

// openPostgres opens the keys (pgstore, its own pool) and the ledger (its own
// database/sql handle) in the PostgreSQL database dsn names.
func openPostgres(ctx context.Context, dsn string, opts *pgstore.Options) (_ *backend, err error) {
	s, err := pgstore.Open(ctx, dsn, opts)
	if err != nil {
		return nil, timedOut(ctx, err, dsn, opts)
	}
	// Parsed as pgstore.Open parsed it (so it cannot fail), by pgxpool,
	// which takes its own parameters (pool_max_conns, …) out of the URL:
	// the server would refuse them as settings.
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("-db: %w", err)
	}
	// The ledger's sessions run as the store's, with the settings
	// pgstore.Open set in its config, whatever the database's or the
	// role's defaults: the store's statement_timeout (-query-timeout, or
	// the URL's); synchronous_commit on (unless the URL sets it), so that
	// a charge reported made, which a saved answer names, survives a crash
	// of the server; and READ COMMITTED, under which a charge of an order
	// that another server charges under the same PayCo key (the worker it
	// took over, still running) waits for that charge and returns it,
	// where REPEATABLE READ would fail it with a serialization error.
	store := s.Pool().Config().ConnConfig.RuntimeParams
	for _, name := range []string{"statement_timeout", "synchronous_commit", "default_transaction_isolation"} {
		cfg.ConnConfig.RuntimeParams[name] = store[name]
	}
	// A connection that the server closed (a restart, pg_terminate_backend)
	// is pinged, and so dropped, before database/sql hands it out again, as
	// the store's pool does: database/sql pings only those idle for a
	// second, and the charge that got one would fail with 502, which
	// -on-error save would replay for good.
	db := stdlib.OpenDB(*cfg.ConnConfig, stdlib.OptionShouldPing(func(_ context.Context, p stdlib.ShouldPingParams) bool {
		return p.IdleDuration > time.Second || reconnect.Stale(p.Conn.PgConn().Conn())
	}))
	db.SetMaxOpenConns(int(s.Pool().Config().MaxConns))
	defer func() {
		if err != nil {
			db.Close()
			s.Close()
		}
	}()
	var payco *payments.PayCo
	// The lock is held by a transaction on the store's pool while PayCo
	// creates its tables through its own connections: it ends with the
	// transaction, whatever happens. The wait for another server's lock is
	// bounded by ctx and the store's statement_timeout, not by a
	// lock_timeout the database or the role may set to keep DDL from
	// queueing: under it, of servers starting together all but one would
	// fail (as pgstore's migration waits, see pgmigrate). The transaction
	// is idle while PayCo works: an idle_in_transaction_session_timeout
	// shorter than that would end its session, and the lock with it.
	err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', '0', true),
			set_config('idle_in_transaction_session_timeout', '0', true)`); err != nil {
			return fmt.Errorf("locking the ledger's schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(paycoLock)); err != nil {
			return fmt.Errorf("locking the ledger's schema: %w", err)
		}
		var perr error
		payco, perr = payments.NewPayCo(ctx, db)
		return perr
	})
	if err != nil {
		return nil, err
	}
	return &backend{store: s, payco: payco, close: func() error { return errors.Join(db.Close(), s.Close()) }}, nil
}

// timedOut returns err, pgstore.Open's, with what to raise when a statement
// ran out of time: the migration of the keys' schema, which rewrites the
// key table (version 2), or the wait for another server's, ran past
// -migration-timeout (pgstore.ErrMigrationTimeout); the server canceled
// another of its statements (SQLSTATE 57014, as statement_timeout does),
// past -query-timeout or the URL's statement_timeout, which pgstore
// leaves in its place; or pgstore's own deadline, twice -query-timeout,
// ran out first (ctx itself still running): a -query-timeout too short
// for the server to connect and read the schema, which the bare "context
// deadline exceeded" did not say, or a database that does not answer at
// all (a host that drops the connection attempt), which no -query-timeout
// helps.
func timedOut(ctx context.Context, err error, dsn string, opts *pgstore.Options) error {
	if errors.Is(err, pgstore.ErrMigrationTimeout) {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w (idemserver: raise -migration-timeout)", err)
	}
	timeout := pgstore.DefaultQueryTimeout
	if opts != nil && opts.QueryTimeout > 0 {
		timeout = opts.QueryTimeout
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("%w; the database did not answer within twice -query-timeout %v while the server connected, "+
				"read the keys' schema or migrated it: check that it is reachable at that address, or raise -query-timeout", err, timeout)
		}
		return err
	}
	// Open parsed it: this cannot fail.
	if cfg, perr := pgxpool.ParseConfig(dsn); perr == nil {
		if v, set := cfg.ConnConfig.RuntimeParams["statement_timeout"]; set {
			return fmt.Errorf("%w; a statement of the server's start ran past the URL's "+
				"statement_timeout=%s, which stands for -query-timeout's on the server: "+
				"drop statement_timeout from the URL and raise -query-timeout", err, v)
		}
	}
	return fmt.Errorf("%w; a statement of the server's start ran past -query-timeout %v: raise -query-timeout", err, timeout)
}

// dice draws seeded random numbers for the fault switches, safely from
// many goroutines.
type dice struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

// roll returns a function reporting true with probability p, or nil when p
// is zero.
func (d *dice) roll(p float64) func() bool {
	if p <= 0 {
		return nil
	}
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.rnd.Float64() < p
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemserver", flag.ContinueOnError)
	// The flag package prints its error before the usage, and it quotes a
	// value it refuses whole: a -db URL given to another flag, password and
	// all. Parse prints nothing; its error is printed here, each argument
	// that names a database in it as dsnpkg.Quote gives it.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage of idemserver:")
		fs.PrintDefaults()
	}
	var (
		addr        = fs.String("addr", "127.0.0.1:8080", "address to listen on (port 0 picks a free one)")
		db          = fs.String("db", "idemserver.db", "the keys and the PayCo ledger: a SQLite file, or a postgres:// URL")
		lockTimeout = cliflag.Duration(fs, "lock-timeout", testserver.DefaultLockTimeout, fmt.Sprintf("how long (a `duration`, at least %v and below -retention) a claim is honoured before a retry may take it over", minLockTimeout))
		retention   = cliflag.Duration(fs, "retention", testserver.DefaultRetention, "how long (a `duration`, at least 24h) keys are kept")
		pruneEvery  = cliflag.Duration(fs, "prune-every", time.Hour, "how often (a `duration`, at least 1s; 0: never) keys older than -retention are deleted")
		stmtTimeout = cliflag.Duration(fs, "query-timeout", pgstore.DefaultQueryTimeout, fmt.Sprintf("with a postgres:// -db, how long (a `duration`, at most %v) each statement may run, but the schema's migration at start", pgstore.MaxQueryTimeout))
		migTimeout  = cliflag.Duration(fs, "migration-timeout", 0, fmt.Sprintf("with a postgres:// -db, how long (a `duration`, at most %v; 0: %v, or -query-timeout when longer) the keys' schema migration at start, or its wait for another server's, may run", pgstore.MaxQueryTimeout, pgstore.DefaultMigrationTimeout))
		onError     = fs.String("on-error", "release", "what a handler error does to its claim: release (retry runs again) or save (retry replays the error)")
		optional    = fs.Bool("optional-key", false, "let POST requests without an Idempotency-Key through, unprotected")
		noDedup     = fs.Bool("no-dedup", false, "fault: PayCo charges on every call, ignoring the server's key")
		failAfter   = fs.Float64("fail-after-charge", 0, "fault: probability (0 to 1) of answering 500 after PayCo charged")
		crashAfter  = fs.Float64("crash-after-charge", 0, "fault: probability (0 to 1) of exiting (status 3) right after PayCo charged")
		delay       = cliflag.Duration(fs, "delay", 0, "fault: hold each charge's answer this long (a `duration`) after PayCo charged")
		seed        = fs.Uint64("seed", 1, "seed of the fault switches' random draws")
		verbose     = fs.Bool("v", false, "log every idempotency decision to stderr; without it, those at level INFO and above: the store's errors, take-overs, a key reused")
	)
	if err := fs.Parse(args); err != nil {
		fs.SetOutput(stderr)
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return err
		}
		err = errors.New(dsnpkg.Scrub(err.Error(), args...))
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return &cliflag.UsageError{Err: err, Printed: true} // printed, and the usage
	}
	if fs.NArg() > 0 {
		return cliflag.Usagef("unexpected arguments %s", dsnpkg.Quote(fs.Args()...))
	}
	if *addr == "" {
		// net.Listen would take it for every interface, at a port of its
		// choosing: an unset variable in -addr "$ADDR", most likely.
		return cliflag.Usagef("-addr is empty: want host:port, such as 127.0.0.1:8080 (port 0 picks a free one)")
	}
	if *db == "" {
		// An unset variable in -db "$DB", most likely: SQLite would fail
		// on it only once opening, with status 1, as if the file were bad.
		return cliflag.Usagef("-db is empty: want a SQLite file, such as idemserver.db, or a postgres:// URL")
	}
	policy := map[string]testserver.ErrorPolicy{"release": testserver.ReleaseClaim, "save": testserver.SaveError}
	onErr, ok := policy[*onError]
	if !ok {
		return cliflag.Usagef("-on-error %s: want release or save", dsnpkg.Quote(*onError))
	}
	for name, p := range map[string]float64{"-fail-after-charge": *failAfter, "-crash-after-charge": *crashAfter} {
		if !(p >= 0 && p <= 1) { // NaN too
			return cliflag.Usagef("%s %v: want a probability from 0 to 1", name, p)
		}
	}
	if *lockTimeout <= 0 {
		return cliflag.Usagef("-lock-timeout %v: want a positive duration", *lockTimeout)
	}
	if *lockTimeout < minLockTimeout {
		return cliflag.Usagef("-lock-timeout %v: want at least %v, which a claim and a charge (two committed writes) fit in", *lockTimeout, minLockTimeout)
	}
	if *lockTimeout > maxLockTimeout {
		return cliflag.Usagef("-lock-timeout %v: want at most %v (a stop waits this and %v more)", *lockTimeout, maxLockTimeout, stopWait)
	}
	if *stmtTimeout <= 0 || *stmtTimeout > pgstore.MaxQueryTimeout {
		return cliflag.Usagef("-query-timeout %v: want a positive duration of at most %v (PostgreSQL's longest statement_timeout)", *stmtTimeout, pgstore.MaxQueryTimeout)
	}
	if *migTimeout < 0 || *migTimeout > pgstore.MaxQueryTimeout {
		return cliflag.Usagef("-migration-timeout %v: want a duration of at most %v (PostgreSQL's longest statement_timeout), or 0 for the default", *migTimeout, pgstore.MaxQueryTimeout)
	}
	if *delay < 0 {
		return cliflag.Usagef("-delay %v: want a positive duration, or 0 for none", *delay)
	}
	if *pruneEvery < 0 || (*pruneEvery > 0 && *pruneEvery < minPruneEvery) {
		return cliflag.Usagef("-prune-every %v: want at least %v, or 0 to never prune", *pruneEvery, minPruneEvery)
	}
	if *retention < testserver.MinRetention {
		return cliflag.Usagef("-retention %v: keys must be kept at least %v", *retention, testserver.MinRetention)
	}
	if *lockTimeout >= *retention {
		return cliflag.Usagef("-lock-timeout %v: want less than -retention (%v): a prune would delete the claim of a request still running, and its retry would run it again", *lockTimeout, *retention)
	}
	if why := dsnpkg.Refused(*db); why != "" {
		return cliflag.Usagef("-db: %s", why)
	}

	b, err := openBackend(ctx, *db, &pgstore.Options{QueryTimeout: *stmtTimeout, MigrationTimeout: *migTimeout})
	if err != nil {
		if ctx.Err() != nil {
			// SIGINT, SIGTERM or SIGHUP while connecting or migrating, which it cut
			// off: a stop asked for, and done, as once serving (as
			// http.Server's Serve returns ErrServerClosed after Shutdown),
			// not a start that failed.
			fmt.Fprintln(stdout, "idemserver: stopped before serving")
			return nil
		}
		return err
	}
	defer b.close()
	payco := b.payco
	payco.NoDedup = *noDedup

	// The key store's errors, as the ledger's, go to stderr whatever -v
	// says: a store-unavailable answer does not name them. -v adds every
	// decision.
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	mw := &testserver.Middleware{Store: b.store, LockTimeout: *lockTimeout, Retention: *retention, OnError: onErr, Optional: *optional, Logger: logger}
	d := &dice{rnd: rand.New(rand.NewPCG(*seed, 0))}
	app := &payments.App{PayCo: payco, Idempotency: mw, Faults: payments.Faults{Delay: *delay},
		Logger: logger} // the ledger's errors, which answers do not name
	if fail := d.roll(*failAfter); fail != nil {
		app.Faults.FailAfterCharge = func(string) bool { return fail() }
	}
	if crash := d.roll(*crashAfter); crash != nil {
		app.Faults.Charged = func(c payments.Charge) {
			if crash() {
				fmt.Fprintf(stderr, "idemserver: crashing after charging order %s (fault injection)\n", c.OrderID)
				os.Exit(crashStatus)
			}
		}
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: readTimeout, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(stdout, "idemserver: listening on http://%s (db %s, lock timeout %v, on error %s)\n", ln.Addr(), redact(*db), mw.LockTimeout, onErr)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	pruneDone := make(chan struct{})
	pruneCtx, stopPrune := context.WithCancel(ctx)
	go func() {
		defer close(pruneDone)
		prune(pruneCtx, mw, *pruneEvery, logger)
	}()
	defer func() {
		stopPrune()
		<-pruneDone
	}()

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	grace := mw.LockTimeout + stopWait
	fmt.Fprintf(stdout, "idemserver: stopping: waiting up to %v for requests in flight (SIGINT, SIGTERM or SIGHUP again stops at once, "+
		"and the keys of the requests it cuts off stay claimed for up to -lock-timeout, %v, before a retry may run them again)\n", grace, mw.LockTimeout)
	if err := shutdown(srv, grace); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "idemserver: stopped")
	return nil
}

// shutdown stops srv listening and waits up to grace for the requests in
// flight to be answered. It then closes the connections left, cutting off
// their requests, and reports them.
func shutdown(srv *http.Server, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err == nil {
		return nil
	}
	srv.Close()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: requests still in flight after %v; their connections were closed", grace)
	}
	return fmt.Errorf("shutdown: %w", err)
}

// prune deletes expired keys once at start and then every interval until
// ctx ends, and logs how many each prune deleted, when it deleted any, and
// the error of one that failed, at ERROR as the store's other errors. The
// prune at start is what a fleet restarted more often than every interval
// (deploys, a crash loop) gets: with the first one an interval away, it
// pruned nothing.
func prune(ctx context.Context, mw *testserver.Middleware, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		start := time.Now()
		n, err := mw.Prune(ctx)
		if ctx.Err() != nil {
			return
		}
		if n > 0 {
			logger.Info("idemserver: pruned expired keys", "deleted", n, "retention", mw.Retention, "took", time.Since(start).Round(time.Millisecond))
		}
		if err != nil {
			logger.Error("idemserver: prune failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
