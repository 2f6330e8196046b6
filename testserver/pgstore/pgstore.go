// Package pgstore is a testserver.Store on PostgreSQL (github.com/jackc/pgx/v5
// and its pool): for many server instances that share one database.
//
// Every method is one statement: a claim is an INSERT … ON CONFLICT DO
// NOTHING on the primary key (scope, key), a takeover an UPDATE that
// compares and sets the claim's fence (locked_at and claim_id), and saving
// or releasing a claim is fenced by status and the fence in its WHERE
// clause. Each statement runs under its
// own deadline (Options.QueryTimeout), on the server and on the client,
// inside the caller's context. Any error, a timeout included, is returned
// as an error: the store never reports a claim it did not make. A Save,
// TakeOver or Release whose context (the caller's, or that deadline) ends
// as the server commits its statement reports the write made, not the
// context's error, which pgx returns for a statement the server applied
// and one it did not alike: the store then reads the entry back, on
// another connection and within QueryTimeout, and reports the write that
// took effect. Open and
// New refuse, with ErrOptions and before they connect, a QueryTimeout
// above MaxQueryTimeout (the longest statement_timeout PostgreSQL takes)
// and a negative QueryTimeout or PruneBatch; a zero one is the default.
//
// The statements run under READ COMMITTED isolation, which Open sets on the
// store's connections whatever the database's, the role's or the DSN's
// default: under REPEATABLE READ or SERIALIZABLE, a claim or a fenced write
// that waited for a concurrent writer of its row would fail with a
// serialization error instead of seeing that writer's row.
//
// Open also sets synchronous_commit to on (unless the DSN sets it), whatever
// the database's or the role's default, so that a claim, and a saved
// answer, is on stable storage, on the primary and on any synchronous
// standby, before the method reports it: a server crash that lost a claim
// whose handler ran would let a retry run the handler again. A DSN that
// sets synchronous_commit=off trades that for speed.
//
// A store from New runs on its caller's pool, whose connections keep their
// own settings: New checks that they run READ COMMITTED and, unless the
// pool's config chooses otherwise, synchronous_commit=on (see New).
//
// Open sets those two, and statement_timeout, as startup parameters, which
// a pooler between it and the server may drop: PgBouncer refuses them unless
// its ignore_startup_parameters lists them, and then drops them. Open then
// reads the session's own, and refuses with ErrPool a
// default_transaction_isolation other than read committed, or a
// synchronous_commit off that the DSN did not choose: set them on the role
// (ALTER ROLE … IN DATABASE … SET), with statement_timeout. A search_path
// the DSN sets and the session does not run with is ErrSchema (from New
// too): set it on the role as well, never in ignore_startup_parameters.
// Under PgBouncer's transaction pooling, add default_query_exec_mode=exec
// to the DSN (for New, set the pool's ConnConfig.DefaultQueryExecMode to
// pgx.QueryExecModeExec), which prepares no statement by name: otherwise
// pgx's statement cache meets statements another client prepared on the
// same server session, or misses its own, and the server refuses the
// statement before running it (SQLSTATE 42P05 or 26000). Claim, TakeOver,
// Save, Release and Prune then run it again at once, on the same
// connection, in pgx's exec mode, and Open and New their statements (the
// migration's whole transaction): each such refusal costs a round trip.
// Set PgBouncer's server_login_retry
// (15 s by default) well below twice QueryTimeout: once a login to a
// restarting server failed, PgBouncer refuses every session for that long,
// and a Save that runs out of its retries meanwhile leaves the key in
// flight, its handler run again after LockTimeout. README's Behind
// PgBouncer has what was checked.
//
// Open and New find the store's table, or create it, in current_schema()
// of the connection that opens the store: the first schema of its
// search_path that exists (the DSN's search_path=…, or the role's or the
// database's setting). A store in a schema of its own is opened with
// search_path=keys in the DSN, or in the pool's RuntimeParams. Every
// statement then names the table with that schema, as a quoted
// identifier, so that the store stays there whatever the search_path of
// the connections the pool makes later (a role's setting changed since, an
// AfterConnect that sets another) and a temporary table of the same name
// (pg_temp is searched first) neither hides its entries nor receives them.
// A search_path that names no schema that exists, or none that the role
// may use (USAGE), is ErrNoSchema.
// Before they create the store's table from scratch, they look for
// it in the other schemas of the search_path: a schema before
// current_schema() that holds it but that the role may not use
// (current_schema() skips a schema without USAGE) is ErrPrivilege, and a
// current_schema() that is the role's own, through "$user", while a later
// schema holds it (a schema named after the role created under
// the default search_path "$user", public) is ErrSchema: either would
// leave the store's saved answers behind for an empty store. The error names both
// schemas and what to do (set search_path to the store's schema, or grant
// USAGE on it), and nothing is created.
//
// The table's primary key, (scope, key), is in the "C" collation: keys
// compare bytewise, whatever the database's default collation. A libc
// collation orders text as the operating system's C library does, and an
// upgrade of it can change that order (glibc 2.28 moved hyphens and
// spaces; keys are the clients' strings, UUIDs among them): the index,
// built in the old order, would then miss keys it holds, and a retry's
// claim of a key that has an entry would succeed, its handler run twice.
// The schema's version 2 makes the columns "C"; Open and New apply it to
// a database at version 1 as any migration, under the lock, in one
// transaction. It rebuilds the primary key's index, the table locked
// against every statement of the store while it runs, and must finish
// within Options.MigrationTimeout (10 minutes by default, its
// statement_timeout); one that runs out of it is ErrMigrationTimeout, its
// transaction rolled back and the database at version 1: open the store
// again with a longer MigrationTimeout for a large table. It needs
// the table's owner (another role gets ErrPrivilege, and the database
// stays at version 1), and it fails with the server's unique_violation
// (a *pgconn.PgError, SQLSTATE 23505), changing nothing, if the old index
// already let a key in twice: which entry to keep is the operator's call.
// A store of an earlier version of this package refuses a database at a
// later version with ErrSchemaTooNew; one that was running keeps working, its
// statements unchanged.
//
// Version 3 adds claim_id, the claim's ID (testserver.Fence.ClaimID),
// without rewriting the table; claims in flight keep the empty ID. A store
// of an earlier version still running fences its writes by locked_at
// alone: until it stops, a claim of a newer one that holds the same token
// is not safe from its releases.
//
// A server that restarts, or ends a session (pg_terminate_backend), closes
// the connections the pool holds. The pool of Open pings a connection before
// it hands it out when it was idle for more than a second, as pgxpool does
// by default, and also when the server sent something on it since its last
// statement, as a server that ends a session does (an error, then the end
// of the stream): a look at the socket, one system call and no round trip.
// A closed connection fails its ping and the pool dials another, so that no
// statement fails on a connection closed before it began. A pool passed to
// New keeps its own ShouldPing: pgxpool's default lets each connection
// idle for less than a second fail one statement after a restart.
//
// A session keeps the default_transaction_read_only it started with: one
// made while the database's or the role's was on refuses every write
// (SQLSTATE 25006) after the setting is reset. When a session refuses a
// write so, the store closes every connection of its pool (those in use
// when they come back) and runs the write once more on a new session
// (Prune does not: its next call does), which starts with the setting as it
// is then.
//
// While the server is down, Claim and Prune fail with the pool's or the
// server's error: a claim that could not be sent made nothing, and fails
// closed at once (the Middleware answers 503, and runs nothing; its caller
// asks again). Save, TakeOver and Release try again: each is fenced by the
// claim's token and ID, so that running it twice does what running it
// once does, and a lost one would keep the key in flight until the lock
// timeout, every retry until then refused with 409, and the handler run
// again after a lost save. When the connection was lost before the method
// had its answer (none could be made, or the one in use closed; not when
// the server refused the session), it runs the statement again on another
// connection, after 50 ms, then twice as long each time up to a second,
// for up to twice QueryTimeout and within its context; then it returns
// the last error. So does Claim once a statement it sent lost its answer.
// An attempt whose answer was lost may have been applied: the next one
// finds the entry as it left it. Save finds it done under the same fence
// with the same answer, and reports it saved; Release finds it gone, and
// reports it released. Claim, and TakeOver, find it in flight under the
// caller's fence (TakeOver's new one), token and ClaimID: no other claim
// holds that random ID (see testserver.Fence), and they report it claimed,
// or won. Under another fence, the entry is another's: Claim returns it,
// not claimed, and TakeOver reports it not won, as it does done or gone
// (its attempt may have taken the entry over before another caller did,
// or not, but nothing is left under the caller's fence either way), and
// the Middleware answers as for another's claim: 409, the saved answer,
// or a claim afresh. A caller's fence with no ClaimID proves nothing
// (the entries claimed before version 3 have none): Claim and TakeOver
// then return an error. A claim that fails after its answer was lost may
// have been made all the same: the Middleware releases it, fenced by its
// token and its ID, and when that fails too the key stays in flight, its
// retries refused with 409 until the lock timeout, when one takes it
// over. A take-over that fails so the Middleware leaves in flight, to be
// taken over again after the lock timeout.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	cutoffpkg "github.com/idemkit/idem/internal/cutoff"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/reconnect"
	"github.com/idemkit/idem/testserver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults for the zero fields of Options.
const (
	DefaultQueryTimeout     = 5 * time.Second
	DefaultPruneBatch       = 1000
	DefaultMigrationTimeout = 10 * time.Minute
)

// MaxQueryTimeout is the longest Options.QueryTimeout: 2^31-1 ms (about
// 24.8 days), the longest statement_timeout PostgreSQL takes: Open and
// New refuse a longer one with ErrOptions.
const MaxQueryTimeout = pgmigrate.MaxQueryTimeout

// claimAttempts bounds Claim's retries when the row it conflicted with
// disappeared (released or pruned) before it could be read. Each retry
// means another writer made progress, so two are the most an honest race
// needs.
const claimAttempts = 10

// Options configure Open and New. A nil *Options means the defaults, and
// every zero field its documented default; a field out of range makes Open
// and New fail with ErrOptions, before they connect.
type Options struct {
	// QueryTimeout bounds each statement the store runs. Open makes it
	// the server's statement_timeout on the store's connections (unless
	// the DSN sets one): the server cancels and rolls back a statement
	// that runs longer, and the method returns its error (SQLSTATE 57014,
	// query_canceled). The store itself waits at most twice as long for an
	// answer, within the caller's context, then gives the connection up
	// and returns an error wrapping context.DeadlineExceeded. The server
	// is the one to give up first so that a write the store reported as
	// failed is not applied later, once the lock it waited for is free; a
	// pool passed to New should set statement_timeout likewise (New checks
	// its isolation and synchronous_commit, not this). Before
	// the statement, the store waits at most twice QueryTimeout, too, for
	// a connection (from a pool that has none free, or a server that does
	// not answer a new one), and returns an error that says no connection
	// came, wrapping context.DeadlineExceeded, when none came. Zero means
	// DefaultQueryTimeout; at most MaxQueryTimeout; never negative.
	QueryTimeout time.Duration

	// PruneBatch is the most rows one DELETE of Prune removes; Prune runs
	// as many as its limit needs, so no statement holds many row locks or
	// runs for long. Zero means DefaultPruneBatch; never negative.
	PruneBatch int

	// MigrationTimeout bounds the upgrade that Open and New run on a
	// database of an older schema version, and their wait for another
	// process's: it is the server's statement_timeout in the migration's
	// transaction, whatever QueryTimeout and the DSN's, and the store
	// waits at most twice as long for each of its statements. Version 2
	// rebuilds the table's primary key, which a large table makes take
	// longer than QueryTimeout; the other statements of Open keep
	// QueryTimeout. A migration that runs out of it is
	// ErrMigrationTimeout, and leaves the database as it was. Zero means
	// DefaultMigrationTimeout, or QueryTimeout when that is longer; at
	// most MaxQueryTimeout; never negative.
	MigrationTimeout time.Duration
}

// Store is a testserver.Store on a PostgreSQL database. It is safe for
// concurrent use by many goroutines, and many processes may share the
// database.
type Store struct {
	pool    *pgxpool.Pool
	owned   bool // Close closes the pool
	timeout time.Duration
	batch   int
	sql     statements
	closed  atomic.Bool
}

var _ testserver.Store = (*Store)(nil)

var (
	// ErrClosed is returned by every method of a Store after Close, Close
	// included, and by a call that Close cut short.
	ErrClosed = errors.New("pgstore: store is closed")

	// ErrPool is returned by New for a nil pool, and for a pool whose
	// connections do not run as the store needs (see New). Nothing is
	// created. It is returned too by Open when a pooler dropped the
	// settings Open sets (see the package documentation); the store's
	// table may then have been created or upgraded.
	ErrPool = errors.New("pgstore: the pool's connections do not suit the store")

	// ErrOptions is returned by Open and New for an Options field out of
	// range: a negative QueryTimeout, MigrationTimeout or PruneBatch, or a
	// QueryTimeout or MigrationTimeout above MaxQueryTimeout. It is wrapped
	// with the field and its value. Nothing is connected to or created.
	ErrOptions = errors.New("pgstore: invalid options")
)

// Open connects to the database dsn names (a postgres:// URL or key=value
// string, as pgxpool.ParseConfig reads it, pool_max_conns included),
// creates or upgrades the schema, and returns a Store that owns its pool.
// It returns ErrOptions for an option out of range, before it connects,
// ErrSchemaTooNew for a schema newer than this package,
// ErrSchema for a current one that lacks a table or an index, or for the
// store's table without the record of its version, or for a DSN's
// search_path that the session does not run with, ErrNoSchema for a
// search_path that names no schema that exists (see the package
// documentation), ErrPool for a session whose isolation or
// synchronous_commit is not what Open sets (a pooler dropped them), and ErrMigrationTimeout for an upgrade, or a wait for
// another process's, that ran out of Options.MigrationTimeout. A schema that is current is only read: a role that may
// not create tables opens it with SELECT on idempotency_keys_schema,
// SELECT, INSERT, UPDATE and DELETE on idempotency_keys, and EXECUTE on
// pg_advisory_xact_lock(bigint), which PUBLIC has by default. Such a role
// is refused with ErrPrivilege where the schema is missing or older, or
// where it may not execute that function; and so is a role that lacks
// one of the four on idempotency_keys, or whose transactions are
// read-only, where every request would get a 503. When no connection
// could be made, its error says that the connection to the database
// failed and why (the server's refusal, or the dial's error), and
// errors.As finds pgx's *pgconn.ConnectError in it, and the server's
// *pgconn.PgError.
func Open(ctx context.Context, dsn string, opts *Options) (*Store, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", pgmigrate.ParseError(err))
	}
	_, chosen := cfg.ConnConfig.RuntimeParams["synchronous_commit"]
	for name, value := range map[string]string{
		"synchronous_commit": "on",
		"statement_timeout":  strconv.FormatInt(max(1, o.QueryTimeout.Milliseconds()), 10),
	} {
		if _, set := cfg.ConnConfig.RuntimeParams[name]; !set {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed" // see the package doc
	cfg.ShouldPing = reconnect.ShouldPing
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s, err := start(ctx, pool, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.owned = true
	cctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	if err := pgmigrate.Opened(cctx, pool, chosen, ErrPool); err != nil {
		s.Close()
		if !errors.Is(err, ErrPool) {
			err = fmt.Errorf("pgstore: %w", err)
		}
		return nil, err
	}
	return s, nil
}

// New returns a Store on pool after creating or upgrading the schema, in
// current_schema() of the pool's connection that does it, or
// ErrOptions (before it takes a connection), ErrSchemaTooNew, ErrSchema,
// ErrNoSchema, ErrPrivilege or ErrMigrationTimeout as Open does. The caller keeps the pool:
// Close leaves it open.
//
// The pool's connections keep their settings, and New reads two of them
// on one connection: it returns ErrPool, creating nothing, unless they run
// READ COMMITTED by default (default_transaction_isolation, the
// PostgreSQL default; see the package documentation) and either
// synchronous_commit is on (or remote_apply) or the pool's config sets it
// in ConnConfig.RuntimeParams (its DSN's synchronous_commit=…), the
// operator's choice as in Open's DSN. Every connection of the pool must
// run with the settings of the one New read: set them in the pool's
// RuntimeParams or its DSN, never with SET on a connection the caller
// gives back to the pool.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Store, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	if _, err := pgmigrate.CheckPool(cctx, pool, ErrPool); err != nil {
		if !errors.Is(err, ErrPool) {
			err = fmt.Errorf("pgstore: %w", err)
		}
		return nil, err
	}
	return start(ctx, pool, o)
}

// withDefaults returns *opts, or the zero Options for nil, with its zero
// fields set to their defaults, or ErrOptions for a field out of range.
func withDefaults(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	l, err := pgmigrate.Limits(o).WithDefaults(pgmigrate.Limits{QueryTimeout: DefaultQueryTimeout, PruneBatch: DefaultPruneBatch,
		MigrationTimeout: DefaultMigrationTimeout}, ErrOptions)
	return Options(l), err
}

// start returns a Store on pool, with o's fields set (see withDefaults),
// once the schema is current (see migrate).
func start(ctx context.Context, pool *pgxpool.Pool, o Options) (*Store, error) {
	s := &Store{pool: pool, timeout: o.QueryTimeout, batch: o.PruneBatch}
	name, err := migrate(ctx, pool, o)
	if err != nil {
		return nil, err
	}
	s.sql = newStatements(name)
	return s, nil
}

// Pool returns the store's connection pool, so that an application can keep
// its own tables in the same database.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool if Open created it, after the statements running
// on it; a call that was yet to take a connection returns ErrClosed. A
// store from New leaves the pool open, and its calls running finish. Close
// returns ErrClosed when the store was already closed, nil otherwise.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	if s.owned {
		s.pool.Close()
	}
	return nil
}

// closedOr returns err or, when there is one and the store is closed,
// ErrClosed: a call that Close cut short fails with whatever pgxpool says
// of a closed pool. A connection that could not be made says so in one
// line, as Open's error does (see pgmigrate.OneLine); a pooler's
// mix-up of pgx's prepared statements says what to do about it (see
// pgmigrate.CacheHint).
func (s *Store) closedOr(err error) error {
	if err != nil && s.closed.Load() {
		return ErrClosed
	}
	return pgmigrate.CacheHint(pgmigrate.OneLine(err))
}

// entryColumns are scanned by scanEntry, in this order.
const entryColumns = `fingerprint, status, response_status, response_header, response_body, locked_at, claim_id, created`

func scanEntry(row pgx.Row, scope, key string, extra ...any) (testserver.Entry, error) {
	e := testserver.Entry{Scope: scope, Key: key}
	var (
		status  *int32
		header  []byte
		body    []byte
		created int64
	)
	dest := append(extra, &e.Fingerprint, &e.Status, &status, &header, &body, &e.Token, &e.ClaimID, &created)
	if err := row.Scan(dest...); err != nil {
		return e, err
	}
	e.Created = time.Unix(0, created)
	if status != nil {
		r := &testserver.Response{Status: int(*status)}
		if len(body) > 0 { // an empty body is nil (see testserver.Response)
			r.Body = body
		}
		if header != nil {
			var err error
			if r.Header, err = hdrjson.Unmarshal(header); err != nil {
				return e, fmt.Errorf("response header of key %q: %w", key, err)
			}
		}
		e.Response = r
	}
	return e, nil
}

// Claim implements testserver.Store. It runs one statement: the insert
// and, when it conflicted, the existing row as of the statement's start.
// Should that row have been committed after the statement began (the
// insert waits for it, the read cannot see it) or deleted meanwhile, the
// statement returns nothing and runs again. The entry returned may thus be
// a moment old, as any read is by the time the caller acts on it: every
// write after it is a compare-and-set on the fence, so a stale entry can
// only make a write fail, never succeed wrongly.
//
// When the connection it sent its statement on is lost before the answer,
// Claim runs the statement again (see the package documentation); one
// that could not be sent fails at once, having made nothing. An attempt
// whose answer was lost may have made the claim: the next finds the entry
// in flight under f, token and ClaimID, and reports it claimed. An entry
// under another fence is another's, and is returned as such; one under f
// when f has no ClaimID, which proves nothing, fails the call.
func (s *Store) Claim(ctx context.Context, scope, key, fingerprint string, f testserver.Fence, now time.Time) (testserver.Entry, bool, error) {
	created := now.UnixNano()
	until := time.Now().Add(2 * s.timeout)
	var unsure error // the first attempt whose answer was lost: it may have made the claim
	for range claimAttempts {
		var (
			e       testserver.Entry
			claimed bool
		)
		// One attempt, while none was lost: a claim that could not be sent
		// made nothing, and fails at once.
		last := time.Now()
		if unsure != nil {
			last = until
		}
		lost, err := s.run(ctx, last, func(ctx context.Context, conn reconnect.Conn, _ bool) error {
			row := conn.QueryRow(ctx, s.sql.claim, scope, key, fingerprint, f.Token, created, f.ClaimID)
			var err error
			e, err = scanEntry(row, scope, key, &claimed)
			return err
		})
		if unsure == nil && lost != nil {
			unsure = lost // and tried again, until until
			continue
		}
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err == nil && !claimed && unsure != nil && e.Fence == f {
			if f.ClaimID == "" || e.Status != testserver.StatusInFlight {
				return testserver.Entry{}, false, fmt.Errorf("pgstore: claim: key %q %s under the caller's fence (token %d, ClaimID %q) "+
					"after an attempt whose answer was lost, which cannot tell whose it is: %w", key, e.Status, f.Token, f.ClaimID, unsure)
			}
			claimed = true // the attempt whose answer was lost made it
		}
		if err != nil {
			return testserver.Entry{}, false, fmt.Errorf("pgstore: claim: %w", err)
		}
		return e, claimed, nil
	}
	return testserver.Entry{}, false, fmt.Errorf("pgstore: claim of key %q: the entry changed under %d attempts", key, claimAttempts)
}

// claimSQL inserts an entry in flight or, when the key has one, returns it.
const claimSQL = `WITH ins AS (
		INSERT INTO {schema}.idempotency_keys (scope, key, fingerprint, status, locked_at, created, claim_id)
		VALUES ($1, $2, $3, 'in_flight', $4, $5, $6)
		ON CONFLICT (scope, key) DO NOTHING
		RETURNING ` + entryColumns + `
	)
	SELECT true, ` + entryColumns + ` FROM ins
	UNION ALL
	SELECT false, ` + entryColumns + ` FROM {schema}.idempotency_keys
	WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT FROM ins)`

// conn takes a connection and the context for one statement on it (see
// reconnect.Acquire and Options.QueryTimeout), or returns ErrClosed.
func (s *Store) conn(ctx context.Context) (_ *pgxpool.Conn, _ context.Context, done func(), _ error) {
	if s.closed.Load() {
		return nil, nil, nil, ErrClosed
	}
	conn, sctx, done, err := reconnect.Acquire(ctx, s.pool, 2*s.timeout)
	return conn, sctx, done, s.closedOr(err)
}

// exec runs one statement and returns how many rows it changed.
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	conn, ctx, done, err := s.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	var tag pgconn.CommandTag
	err = reconnect.Fallback(conn, func(c reconnect.Conn) (err error) {
		tag, err = c.Exec(ctx, query, args...)
		return err
	})
	reconnect.ReadOnly(ctx, s.pool, conn, err) // the next statement runs on a new session
	return tag.RowsAffected(), s.closedOr(err)
}

// run runs statement, which runs twice as it runs once, and runs it again
// while the connection is lost before the answer, until until (see the
// package documentation and reconnect.Run), or returns ErrClosed.
func (s *Store) run(ctx context.Context, until time.Time, statement func(ctx context.Context, conn reconnect.Conn, unsure bool) error) (lost, err error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	lost, err = reconnect.Run(ctx, s.pool, 2*s.timeout, until, true, statement)
	return lost, s.closedOr(err)
}

// settle runs statement, a write fenced by the claim's fence, as run does.
// When its last attempt ended with the context it ran under (the
// caller's, or the store's deadline for the statement), pgx gave the
// connection up and returned the context's error, whether the server had
// applied nothing or had committed the statement already and its answer
// was on its way. Then settle runs check on another connection, under
// ctx without its end and within QueryTimeout, and reports applied, and
// no error, when check says that the write took effect: a caller is not
// told that a write failed that was made (the Middleware would log a saved
// answer as a failed save, counted among its store errors, a claim
// released as one left in flight, and refuse a request whose take-over it
// made). When check cannot tell, or fails, the statement's error stands.
// A statement that the server had yet to apply (one waiting for a lock)
// is cancelled by pgx as it gives its connection up; should it commit
// after check all the same, the write is reported failed and was made, as
// before settle.
func (s *Store) settle(ctx context.Context, until time.Time, statement func(ctx context.Context, conn reconnect.Conn, unsure bool) error,
	check func(ctx context.Context, conn reconnect.Conn) (bool, error)) (lost error, applied bool, err error) {
	ended := false // the last attempt's context ended
	lost, err = s.run(ctx, until, func(sctx context.Context, conn reconnect.Conn, unsure bool) error {
		err := statement(sctx, conn, unsure)
		ended = err != nil && sctx.Err() != nil
		return err
	})
	if err == nil || !ended || s.closed.Load() {
		return lost, false, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	conn, cctx, done, cerr := s.conn(cctx)
	if cerr != nil {
		return lost, false, err
	}
	defer done()
	var ok bool
	if cerr := reconnect.Fallback(conn, func(c reconnect.Conn) (cerr error) {
		ok, cerr = check(cctx, c)
		return cerr
	}); cerr != nil || !ok {
		return lost, false, err
	}
	return lost, true, nil
}

// TakeOver implements testserver.Store. When the connection to the server
// is lost before the answer, it runs its statement again (see the package
// documentation). An attempt whose answer was lost may have taken the
// entry over: the next finds it in flight under new, token and ClaimID,
// and reports it won. When it finds the entry otherwise (under another
// fence, done or gone), it reports it not won, as without a lost answer:
// whether or not that attempt took the entry over, another caller has
// taken it over, saved or released it since, and nothing is left under
// new for the caller to run the operation under. Under new when new has
// no ClaimID, which proves nothing, TakeOver returns an error: that
// attempt may have taken the entry over, or another caller may have. A
// win reported wrongly would run the operation twice.
func (s *Store) TakeOver(ctx context.Context, scope, key string, old, new testserver.Fence) (bool, error) {
	var n int64
	lost, applied, err := s.settle(ctx, time.Now().Add(2*s.timeout), func(ctx context.Context, conn reconnect.Conn, unsure bool) error {
		tag, err := conn.Exec(ctx, s.sql.takeOver, scope, key, old.Token, old.ClaimID, new.Token, new.ClaimID, unsure)
		n = tag.RowsAffected()
		return err
	}, func(ctx context.Context, conn reconnect.Conn) (taken bool, err error) {
		return taken, conn.QueryRow(ctx, s.sql.taken, scope, key, new.Token, new.ClaimID).Scan(&taken)
	})
	if applied {
		n = 1
	}
	if err == nil && n == 0 && lost != nil && new.ClaimID == "" {
		err = fmt.Errorf("key %q no longer in flight under token %d after an attempt whose answer was lost, and the new fence has no ClaimID to tell the attempt's take-over from another's: %w", key, old.Token, lost)
	}
	if err != nil {
		return false, fmt.Errorf("pgstore: take over: %w", err)
	}
	return n == 1, nil
}

// takeOverSQL moves an entry in flight from one fence to another. Its last
// argument is true when an earlier attempt of the same TakeOver may have
// been applied (see saveSQL): an entry in flight under the new fence, its
// ClaimID not empty, is that attempt's work, and is set again as it is.
const takeOverSQL = `UPDATE {schema}.idempotency_keys SET locked_at = $5, claim_id = $6
	WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND (locked_at = $3 AND claim_id = $4 OR
		$7::boolean AND $6 <> '' AND locked_at = $5 AND claim_id = $6)`

// takenSQL tells whether an entry is in flight under a fence whose ClaimID
// is not empty: a TakeOver to that fence took effect (see settle). Without
// a ClaimID it proves nothing.
const takenSQL = `SELECT EXISTS (SELECT FROM {schema}.idempotency_keys
	WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND $4 <> '' AND locked_at = $3 AND claim_id = $4)`

// saveSQL marks an entry done with its answer, fenced by its status and
// fence. Its last argument is true when an earlier attempt of the same Save
// may have been applied (the connection was lost after it was sent): an
// entry done with this fence and this very answer is that attempt's work,
// and is saved again as it is rather than refused as fenced.
const saveSQL = `UPDATE {schema}.idempotency_keys
	SET status = 'done', response_status = $4, response_header = $5, response_body = $6
	WHERE scope = $1 AND key = $2 AND locked_at = $3 AND claim_id = $8 AND (status = 'in_flight' OR $7::boolean AND
		status = 'done' AND response_status = $4 AND response_header = $5 AND response_body = $6)`

// savedSQL tells whether an entry is done under a fence with an answer: a
// Save of that answer under that fence took effect (see settle).
const savedSQL = `SELECT EXISTS (SELECT FROM {schema}.idempotency_keys
	WHERE scope = $1 AND key = $2 AND locked_at = $3 AND claim_id = $7 AND status = 'done' AND
		response_status = $4 AND response_header = $5 AND response_body = $6)`

// Save implements testserver.Store. When the connection to the server is
// lost before the answer (see the package documentation), it runs its
// statement again on another connection, for up to twice
// Options.QueryTimeout and within ctx, and then returns the last error.
func (s *Store) Save(ctx context.Context, scope, key string, f testserver.Fence, resp testserver.Response) error {
	header, err := hdrjson.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("pgstore: save: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{} // NULL is for an entry in flight
	}
	var n int64
	_, applied, err := s.settle(ctx, time.Now().Add(2*s.timeout), func(ctx context.Context, conn reconnect.Conn, unsure bool) error {
		tag, err := conn.Exec(ctx, s.sql.save, scope, key, f.Token, resp.Status, string(header), body, unsure, f.ClaimID)
		n = tag.RowsAffected()
		return err
	}, func(ctx context.Context, conn reconnect.Conn) (saved bool, err error) {
		return saved, conn.QueryRow(ctx, s.sql.saved, scope, key, f.Token, resp.Status, string(header), body, f.ClaimID).Scan(&saved)
	})
	if applied {
		n = 1
	}
	if err != nil {
		return fmt.Errorf("pgstore: save: %w", err)
	}
	if n == 0 {
		return testserver.ErrFenced
	}
	return nil
}

// Release implements testserver.Store. When the connection to the server
// is lost before the answer, it runs its statement again (see the package
// documentation). When the attempt whose answer was lost had been sent and
// the next deletes nothing, a second statement tells why: an entry that is
// gone was released, by that attempt or by the worker that took it over,
// and Release reports it released; one still there is not this call's.
func (s *Store) Release(ctx context.Context, scope, key string, f testserver.Fence) (bool, error) {
	until := time.Now().Add(2 * s.timeout)
	var n int64
	lost, applied, err := s.settle(ctx, until, func(ctx context.Context, conn reconnect.Conn, _ bool) error {
		tag, err := conn.Exec(ctx, s.sql.release, scope, key, f.Token, f.ClaimID)
		n = tag.RowsAffected()
		return err
	}, func(ctx context.Context, conn reconnect.Conn) (gone bool, err error) {
		// Gone: deleted by this call, unless the claim was never made or
		// was taken over and ended meanwhile; either way no claim of f is
		// left in flight, as after an attempt whose answer was lost.
		var there bool
		err = conn.QueryRow(ctx, s.sql.exists, scope, key).Scan(&there)
		return !there, err
	})
	if applied {
		n = 1
	}
	if err == nil && n == 0 && lost != nil {
		var there bool
		_, err = s.run(ctx, until, func(ctx context.Context, conn reconnect.Conn, _ bool) error {
			return conn.QueryRow(ctx, s.sql.exists, scope, key).Scan(&there)
		})
		if !there {
			n = 1
		}
	}
	if err != nil {
		return false, fmt.Errorf("pgstore: release: %w", err)
	}
	return n == 1, nil
}

// releaseSQL deletes an entry in flight under a fence; existsSQL tells
// whether a key has an entry.
const (
	releaseSQL = `DELETE FROM {schema}.idempotency_keys
		WHERE scope = $1 AND key = $2 AND status = 'in_flight' AND locked_at = $3 AND claim_id = $4`
	existsSQL = `SELECT EXISTS (SELECT FROM {schema}.idempotency_keys WHERE scope = $1 AND key = $2)`
)

// Prune implements testserver.Store. It deletes the oldest entries first,
// in statements of at most Options.PruneBatch rows, skipping rows another
// transaction holds locked (they are in use: a later Prune gets them). A
// limit <= 0 deletes nothing. On an error it returns how many it deleted
// before.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("pgstore: prune: %w", ErrClosed)
	}
	// The last nanosecond before before, for "<= cutoff"; none before
	// 1678, where no entry is.
	cutoff, ok := cutoffpkg.Nanos(before)
	if limit <= 0 || !ok {
		return 0, nil
	}
	total := 0
	for total < limit {
		want := min(s.batch, limit-total)
		n, err := s.exec(ctx, s.sql.prune, cutoff, want)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("pgstore: prune: %w", err)
		}
		if int(n) < want {
			break
		}
	}
	return total, nil
}

// pruneSQL deletes a batch of the entries done, or in flight under a token
// at or before the cutoff, created at or before it, oldest first. The batch is
// picked once, in a materialized CTE: as a subquery of the DELETE, the
// planner may run it again for every row it scans (a nested-loop
// semi-join, when the table's statistics take it for one row), and each
// run locks, and picks, rows the last did not, so that one DELETE went
// past its LIMIT.
const pruneSQL = `WITH batch AS MATERIALIZED (
	SELECT scope, key FROM {schema}.idempotency_keys WHERE created <= $1 AND (status = 'done' OR locked_at <= $1)
	ORDER BY created LIMIT $2 FOR UPDATE SKIP LOCKED)
	DELETE FROM {schema}.idempotency_keys WHERE (scope, key) IN (SELECT scope, key FROM batch)`
