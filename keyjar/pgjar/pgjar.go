// Package pgjar is an idem.Jar on PostgreSQL (github.com/jackc/pgx/v5 and
// its pool): for a fleet of workers, on many machines, that must resume each
// other's pending operations. It keeps the semantics of idem.MemoryJar and
// of the SQLite jar in package keyjar, and passes the same conformance
// suite (keyjar/jartest). Like them it is an idem.Deferrer: idem.Transport
// hands it the outcome of a call (done, failed, the lease's release)
// without waiting for a round trip to the database.
//
// A program hands the jar to an idem.Transport, or to package client, which
// leaves it open on Close (client.New takes a file path only: a postgres://
// URL goes to Open):
//
//	jar, err := pgjar.Open(ctx, "postgres://worker@db:5432/app", &pgjar.Options{Logger: logger})
//	if err != nil { ... }
//	defer func() {
//		if err := jar.Close(); err != nil { // idem.ErrDropped: outcomes not written
//			logger.Error("key jar", "err", err)
//		}
//	}()
//	c, err := client.New(ctx, "", &client.Options{Jar: jar, Logger: logger})
//	if err != nil { ... }
//	defer c.Close() // before jar.Close: it waits for the calls' outcomes
//
// client.Options.Logger reaches only the jar file New opens: give a jar of
// your own its Options.Logger, which logs each outcome it drops; Close
// counts them in its error, and their operations stay pending.
//
// Every method is one atomic statement, or a short sequence of them that
// retries when a concurrent writer changed the row in between:
//
//   - Begin is an INSERT … ON CONFLICT (op) DO UPDATE … WHERE the existing
//     record is abandoned: two workers never create two keys for one name.
//   - Acquire is an UPDATE that compares and sets the lease.
//   - Update is an UPDATE fenced by the holder.
//   - Neither writes a record that does not decode: their UPDATE holds
//     that the record is one the jar reads back, and, for the rare record
//     it cannot tell so, runs in a transaction that is rolled back when
//     the record does not decode (an *idem.RecordError).
//   - ForgetKey is a DELETE whose WHERE clause holds the key and the state,
//     and AbandonKey an UPDATE whose WHERE clause holds them and the lease.
//
// The statements run under READ COMMITTED isolation, which Open sets on the
// jar's connections whatever the database's, the role's or the DSN's
// default: under REPEATABLE READ or SERIALIZABLE, a statement that waited
// for a concurrent writer of its record would fail with a serialization
// error instead of seeing that writer's record (its key, its lease).
//
// The jar's connections run with synchronous_commit=on (unless the DSN
// sets it), so that a key Begin created is on stable storage, on the
// primary and on any synchronous standby, before Begin returns. Update
// commits with synchronous_commit=off (unless the DSN sets it): its change
// is visible to every worker when it returns and reaches the disk a moment
// later, without a WAL flush of its own; as the idem.Jar contract allows, a
// crash of the server may lose the last of them, which only leaves an
// operation pending, or its lease held until it expires. An Update to
// StateAbandoned (client.Abandon) commits as Begin does: lost, it would
// leave pending an operation that its caller established did not happen,
// and a resume would send it.
//
// A jar from New runs on its caller's pool, whose connections keep their
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
// too): set it on the role as well, never in ignore_startup_parameters,
// or the jar would be looked for, and created, in another schema. Under
// PgBouncer's transaction pooling, add default_query_exec_mode=exec to the
// DSN (for New, set the pool's ConnConfig.DefaultQueryExecMode to
// pgx.QueryExecModeExec), which prepares no statement by name: otherwise
// pgx's statement cache meets statements another client prepared on the
// same server session, or misses its own, and the server refuses the
// statement before running it (SQLSTATE 42P05 or 26000). The jar's calls
// then run it again at once, on the same connection, in pgx's exec mode,
// the applier sends the batch's changes so, in one transaction, and Open
// and New run their statements so (the migration's whole transaction):
// each such refusal costs a round trip. README's Behind PgBouncer has what
// to set, and what was checked.
//
// Open and New find the jar's tables, or create them, in current_schema()
// of the connection that opens the jar: the first schema of its
// search_path that exists (the DSN's search_path=…, or the role's or the
// database's setting). A jar in a schema of its own is opened with
// search_path=jobs in the DSN, or in the pool's RuntimeParams. Every
// statement then names the tables with that schema, as a quoted
// identifier, so that the jar stays there whatever the search_path of the
// connections the pool makes later (a role's setting changed since, an
// AfterConnect that sets another) and a temporary table of the same name
// (pg_temp is searched first) neither hides its records nor receives them.
// A search_path that names no schema that exists, or none that the role
// may use (USAGE), is ErrNoSchema.
// Before they create the jar's tables from scratch, they look for
// them in the other schemas of the search_path: a schema before
// current_schema() that holds them but that the role may not use
// (current_schema() skips a schema without USAGE) is ErrPrivilege, and a
// current_schema() that is the role's own, through "$user", while a later
// schema holds them (a schema named after the role created under
// the default search_path "$user", public) is ErrSchema: either would
// leave the jar's keys behind for an empty jar. The error names both
// schemas and what to do (set search_path to the jar's schema, or grant
// USAGE on it), and nothing is created. With Options.MustExist, which
// creates nothing, they look so too when current_schema() holds no jar:
// the error is then ErrNoJar and that ErrPrivilege or ErrSchema, with the
// same words.
//
// Open and New without Options.MustExist upgrade a jar of an older schema
// version, under the advisory lock that serialises migrations, in one
// transaction. Version 2 adds idem_operations_by_state_created, the index
// on (state, created, op) that List with a State reads (the walk of the
// pending operations: client.Pending, idemctl list --status and resume
// --all); its build reads the table once and holds off writes to it
// meanwhile. A program built with an earlier version of this package then
// refuses the jar with ErrVersion, and one with MustExist refuses a jar
// not yet upgraded with ErrOldVersion, which matches ErrNoJar. The
// migration, and the wait for another process's, runs within
// Options.MigrationTimeout (10 minutes by default), not QueryTimeout; one
// that runs out of it is ErrMigrationTimeout, its transaction rolled back
// and the jar left as it was.
//
// Defer queues such a change for the jar's applier, a goroutine that Open
// or New starts and Close ends: it sends what is queued, up to 64 changes,
// in one round trip, each as Update's fenced UPDATE, in the order they were
// deferred. The jar's own methods wait for the changes deferred on the
// operation they read or write, so a process reads back what it deferred;
// other processes see a deferred change once the applier has sent it,
// usually within a round trip. A change the applier cannot apply (its lease
// was lost, a database error) is dropped: the record stays as it was.
//
// Each statement runs under its own deadline (Options.QueryTimeout) inside
// the caller's context, on the server and on the client, and any error, a
// timeout included, is returned as an error: the jar never reports a lease
// or a key it did not get. As with any remote write, an error other than
// the server's own refusal leaves the outcome unknown: a write whose
// answer was lost may have been applied.
//
// A server that restarts, or ends a session (pg_terminate_backend), closes
// the connections the pool holds. The pool of Open pings a connection
// before it hands it out when it was idle for more than a second, as
// pgxpool does by default, and also when the server sent something on it
// since its last statement, as a server that ends a session does (an
// error, then the end of the stream): a look at the socket, one system
// call and no round trip.
// A closed connection fails its ping and the pool dials another, so that no
// statement fails on a connection closed before it began. A pool passed to
// New keeps its own ShouldPing: pgxpool's default lets each connection
// idle for less than a second fail one statement after a restart.
//
// A session keeps the default_transaction_read_only it started with: one
// made while the database's or the role's was on refuses every write
// (SQLSTATE 25006) after the setting is reset. When a session refuses a
// write so, the jar closes every connection of its pool (those in use when
// they come back) and runs the write once more on a new session, which
// starts with the setting as it is then: the first write after such a
// window succeeds, and one during it fails with the server's error.
//
// When the connection to the server is lost before the applier has its
// answer (none could be made, or the one in use closed: the server
// restarted, or ended the session; not when the server refused the
// session), it sends the batch again on another connection, after 50 ms and
// then twice as long each time up to a second, for up to twice
// QueryTimeout since the loss began; a server down for longer costs each
// later batch one attempt, until one gets through. A batch whose answer
// was lost may have been applied: it is sent again only with the changes
// that applying twice applies once, those fenced by a holder that release
// the lease (a second run is fenced off) or add no attempts, as every
// change idem.Transport defers does. The others are dropped, logged and
// counted as dropped on an error (see Defer).
//
// Begin, Acquire and Update run their statements again in the same way,
// for up to twice QueryTimeout from the call and within its context. A
// statement that was sent may have been applied, and the next attempt
// finds what it did: Begin's INSERT finds a record as the call wrote it
// (its key, fingerprint, creation time, holder and lease), and reports it
// created; Acquire finds the lease its own, and takes it again. Update
// sends its change again only when applying it twice applies it once, as
// the applier does, and otherwise returns the error; an Update whose
// release was applied, which fences off the next attempt, finds the
// record as its change left it, and returns it.
//
// Get, List and ByKey, which only read, run their statements again in the
// same way, and so do Forget, ForgetKey and AbandonKey, whose UPDATE sent
// again after a lost answer finds the record as the lost one left it and
// reports it abandoned. A DELETE sent again after a
// lost answer finds nothing when the lost one deleted the record: the call
// then reports the record deleted, as it is, and since it cannot tell that
// from a record that was never there, it reports idem.ErrNotFound only
// when no answer was lost. Prune runs each of its statements again for up
// to twice QueryTimeout from that statement. Without a limit, a batch sent
// again after a lost answer deletes what is left, and the count Prune
// returns misses the rows of the lost batch; with a limit, which the
// resend could overrun, Prune sends a batch again only when none of it was
// sent, and otherwise returns the error.
package pgjar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dropped"
	"github.com/idemkit/idem/internal/dsn"
	"github.com/idemkit/idem/internal/errprefix"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/internal/reconnect"
	"github.com/idemkit/idem/internal/secrethdr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults for the zero fields of Options.
const (
	DefaultQueryTimeout     = 5 * time.Second
	DefaultPruneBatch       = 1000
	DefaultMigrationTimeout = 10 * time.Minute
)

// MaxOpLen is the longest operation name, in bytes, that the jar stores:
// the name is the key of a B-tree index, whose entries PostgreSQL limits
// to about 2.7 kB.
const MaxOpLen = 2048

// raceAttempts bounds the retries of a method whose second statement found
// the row changed by a concurrent writer since its first. Each retry means
// another writer made progress.
const raceAttempts = 10

// Errors returned by Open, New and the Jar's methods, besides idem.ErrNotFound,
// idem.ErrLeased and idem.ErrLeaseLost, which the methods return as the
// idem.Jar contract says. Each is wrapped with details: test with errors.Is.
// A stored record that does not decode (its header is not the JSON the jar
// writes) is an *idem.RecordError, wrapped (test with errors.As), which
// matches none of them: Begin, Get, Acquire, Update, List and ByKey return
// it, and ForgetKey when it deletes nothing; Acquire and Update then change
// nothing.
var (
	// ErrClosed is returned by every method of a Jar after Close, Close
	// included, whatever its other arguments (an invalid record included),
	// and by a call that Close cut short.
	ErrClosed = errors.New("pgjar: jar is closed")

	// ErrVersion is returned by Open and New for a database whose jar
	// schema was written by a newer version of this package. The schema
	// it is in (in schema "jobs") and its version follow it.
	ErrVersion = errors.New("pgjar: database has a newer jar schema version")

	// ErrSchema is returned by Open and New for a database that records
	// the jar's current schema version but lacks one of its tables or
	// indexes, named after it with the schema looked in (in schema
	// "jobs", no idem_operations). Neither re-creates it: a table dropped
	// took its keys with it, and an operation whose key was lost would be
	// sent again under a new one. Restore it (from a backup, or as the
	// migration in schema.go creates it) knowing what was lost. An index
	// alone loses no row: the error then says so and gives the statement
	// that creates it again (a backup would lose what was written since).
	// It is
	// returned too, naming what remains, for a database whose
	// idem_operations_schema was dropped or emptied but that holds the
	// jar's table or one of its indexes, with Options.MustExist or
	// without: neither creates, alters or drops anything there.
	// It is returned too, naming both schemas, when the search_path
	// leads to the role's own schema ("$user") past the jar in a later
	// one (see the package documentation).
	ErrSchema = errors.New("pgjar: database lacks part of the jar's schema")

	// ErrNoJar is returned by Open and New with Options.MustExist for a
	// database that holds no jar (no table idem_operations_schema, nor
	// idem_operations), or a jar at an older schema version, which
	// MustExist does not upgrade (ErrOldVersion, which matches ErrNoJar).
	// The schema looked in follows it (in
	// schema "jobs", current_schema() of the connection that opened it:
	// a jar in another schema of the search_path is not found), then what
	// is missing, in parentheses. Nothing is created. When the
	// search_path leads past a jar in another of its schemas (see the
	// package documentation), the error matches ErrPrivilege or ErrSchema
	// too, and says instead which schemas, why and what to do.
	ErrNoJar = errors.New("pgjar: database holds no key jar")

	// ErrOldVersion is returned by Open and New with Options.MustExist for
	// a database whose jar is at an older schema version (1, before the
	// index List with a State reads), which MustExist does not upgrade:
	// an Open without it does. It matches ErrNoJar too (errors.Is), which
	// Open returned for it before it was told apart, and is followed, as
	// ErrNoJar is, by the schema looked in and the version it records (in
	// schema "jobs" (idem_operations_schema records version 1, not 2)).
	// Nothing is changed.
	ErrOldVersion error = oldVersion{}

	// ErrNoSchema is returned by Open and New, with Options.MustExist or
	// without, when current_schema() is null on the connection that opens
	// the jar: no schema of its search_path exists, so there is none to
	// find the jar in or to create it in. The search_path follows it.
	// Nothing is created.
	ErrNoSchema = errors.New("pgjar: no schema to hold the jar")

	// ErrPrivilege is returned by Open and New, without
	// Options.MustExist, when the role they connect as may not create the
	// jar's tables (or upgrade them, for a database at an older schema
	// version): the statement failed with SQLSTATE 42501,
	// insufficient_privilege. The schema, what to do and the server's
	// error (a *pgconn.PgError) follow it. Open the jar once as a role
	// that may create tables in that schema, such as its owner; a jar that
	// exists at this package's version needs only the privileges that
	// Open lists. It is returned too, naming the function, when the role
	// may not execute pg_advisory_xact_lock(bigint) (EXECUTE revoked from
	// PUBLIC), the lock the migration takes even when the schema is
	// current; and, saying what to do, when no call could write the jar:
	// the connection's transactions are read-only (a hot standby,
	// default_transaction_read_only), or the role lacks one of SELECT,
	// INSERT, UPDATE and DELETE on idem_operations. Nothing is created.
	// It is returned too when a schema of the search_path before
	// current_schema() holds the jar and the role may not use it: GRANT
	// USAGE on it.
	ErrPrivilege = errors.New("pgjar: this role may not create or write the jar's tables")

	// ErrMigrationTimeout is returned by Open and New, without
	// Options.MustExist, when the upgrade of a jar of an older schema
	// version, or the wait for another process's, ran out of
	// Options.MigrationTimeout (or the caller's context ended first): the
	// server canceled the statement (SQLSTATE 57014), or the jar stopped
	// waiting for its answer. What was being done (which version, which
	// statement), the schema and the version the jar is at follow it,
	// then what to do and the error, which errors.As finds as a
	// *pgconn.PgError or errors.Is as context.DeadlineExceeded. The
	// migration's transaction rolled back: nothing was lost, and the jar
	// is as it was. Open it again once the lock that kept it waiting is
	// gone, or with a longer MigrationTimeout for a large table.
	ErrMigrationTimeout = errors.New("pgjar: the jar's migration ran out of time")

	// ErrPool is returned by New for a nil pool, and for a pool whose
	// connections do not run as the jar needs (see New). Nothing is
	// created. It is returned too by Open when a pooler dropped the
	// settings Open sets (see the package documentation); the jar's
	// tables may then have been created or upgraded.
	ErrPool = errors.New("pgjar: the pool's connections do not suit the jar")

	// ErrInvalid is returned by Begin for a record without Op or Key, with
	// a State that is not valid, or with an Op longer than MaxOpLen, by
	// Update for a Change with an invalid State, by Begin, Acquire and
	// Update for a time that cannot be stored (outside the years 1678 to
	// 2262), a string that PostgreSQL's text cannot hold (one with a NUL
	// byte or bytes that are not UTF-8) or a LastStatus outside the 32 bits
	// of its integer column, and by Defer for the change Update would
	// refuse. Nothing is written.
	ErrInvalid = errors.New("pgjar: invalid record")

	// ErrOptions is returned by Open and New for an Options field out of
	// range: a negative QueryTimeout, MigrationTimeout or PruneBatch, or
	// a QueryTimeout or MigrationTimeout above 2^31-1 milliseconds (about
	// 24.8 days, the longest statement_timeout PostgreSQL takes). It is
	// wrapped with the field and its value. Nothing is connected to or
	// created.
	ErrOptions = errors.New("pgjar: invalid options")
)

// oldVersion is ErrOldVersion's type. Its Is makes it ErrNoJar too, as
// keyjar's ErrOldVersion is its ErrReadOnly: one error of its own, which a
// caller that asks for the more general one still matches, with "pgjar: "
// said once in its message.
type oldVersion struct{}

func (oldVersion) Error() string { return "pgjar: database holds a key jar of an older schema version" }

func (oldVersion) Is(target error) bool { return target == ErrNoJar }

// wrapf returns err after "pgjar: " and what format says happened, with
// "pgjar: " said once (errprefix.Wrapf).
func wrapf(err error, format string, args ...any) error {
	return errprefix.Wrapf("pgjar", err, format, args...)
}

// Options configure Open and New. A nil *Options means the defaults, and
// every zero field its documented default; a field out of range makes Open
// and New fail with ErrOptions.
type Options struct {
	// QueryTimeout bounds each statement the jar runs but a migration's
	// (see MigrationTimeout). Open makes it the server's
	// statement_timeout on the jar's connections (unless the DSN sets
	// one): the server cancels and rolls back a statement that runs
	// longer, and the method returns its error (SQLSTATE 57014,
	// query_canceled). The jar itself waits at most twice as long for an
	// answer, within the caller's context, then gives the connection up
	// and returns an error wrapping context.DeadlineExceeded. The server
	// is the one to give up first so that a statement the jar reported as
	// failed is not applied later, once the lock it waited for is free.
	// New leaves the statement_timeout of its caller's pool as it is: set
	// it to QueryTimeout in the pool's RuntimeParams (or its DSN), or the
	// jar may be the first to give up on a statement the server applies.
	// Before the statement, the jar waits at most twice QueryTimeout, too,
	// for a connection (from a pool that has none free, or a server that
	// does not answer a new one), and returns an error that says no
	// connection came, wrapping context.DeadlineExceeded, when none came.
	// Zero means DefaultQueryTimeout; at most 2^31-1 ms (about 24.8 days).
	QueryTimeout time.Duration

	// MigrationTimeout bounds the upgrade that Open and New run on a jar
	// of an older schema version (without MustExist), and their wait for
	// another process's: it is the server's statement_timeout in the
	// migration's transaction, whatever QueryTimeout and the DSN's, and
	// the jar waits at most twice as long for each of its statements. A
	// migration reads the whole table (version 2 builds an index on it),
	// which a large jar makes take longer than QueryTimeout; the other
	// statements of Open keep QueryTimeout. A migration that runs out of
	// it is ErrMigrationTimeout, and leaves the jar as it was. Zero means
	// DefaultMigrationTimeout, or QueryTimeout when that is longer; at
	// most 2^31-1 ms (about 24.8 days).
	MigrationTimeout time.Duration

	// PruneBatch is the most records one DELETE of Prune removes; Prune runs
	// as many as it needs, so no statement holds many row locks or runs for
	// long. Zero means DefaultPruneBatch.
	PruneBatch int

	// MustExist makes Open and New open only a jar that exists at this
	// package's schema version, in the schema they would create it in
	// (current_schema()): they create no table, record no version
	// and run no migration, and need only SELECT on
	// idem_operations_schema to check it. A database without the jar, or
	// with a jar of an older schema version, is refused with ErrNoJar
	// (ErrOldVersion: open it once without MustExist to upgrade it); a newer one with
	// ErrVersion and one missing a table, an index or the record of its
	// version with ErrSchema, as without it. A program that only inspects
	// or resumes operations (as idemctl does) sets it, so that a DSN
	// naming the wrong database fails instead of showing a new, empty jar.
	// False means Open and New create or upgrade the schema.
	MustExist bool

	// Logger receives one record (Warn) for each change taken by Defer
	// that the jar drops on an error (a database error, a statement
	// timeout, a server out of reach for longer than the applier sends
	// again), with the operation's name (op) and the error (err, the
	// passwords it quotes masked): the record stays as it was, at worst
	// pending, which a resume settles with the server's replay, and
	// nothing else reports it. A change fenced off (another holder took
	// the lease) is not a failure and is not logged. The jar's applier
	// calls it: a slow handler delays the deferred changes. Nil means
	// silent.
	Logger *slog.Logger
}

// Jar is an idem.Jar and an idem.Deferrer in a PostgreSQL database, with
// the operator methods List, Forget, ForgetKey, AbandonKey and Prune. It is safe for
// concurrent use, and many processes may share the database. Close it to
// apply the changes deferred last (see Defer).
type Jar struct {
	pool         *pgxpool.Pool
	owned        bool // Close closes the pool
	timeout      time.Duration
	batch        int
	updateCommit string // synchronous_commit for Update's transactions
	sql          statements
	closed       atomic.Bool
	logger       *slog.Logger  // Options.Logger: deferred changes dropped
	drops        dropped.Count // the deferred changes dropped, for Close

	// The deferred changes (see Defer). queueMu guards sends on queue
	// against Close, which closes it; the applier receives from it and
	// closes applied when it exits.
	queueMu sync.RWMutex
	queue   chan deferred
	applied chan struct{}
	// deferQueued counts the changes queued, deferDone those applied (or
	// dropped). pending counts, per op, the changes queued and not yet
	// applied; the applier closes progress after each batch and replaces it.
	// pendingMu guards pending, progress and the moves of deferDone.
	deferQueued, deferDone atomic.Uint64
	pendingMu              sync.Mutex
	pending                map[string]int
	progress               chan struct{}

	beforeApply atomic.Pointer[func(n int)] // tests: called before each batch is sent
	outage      reconnect.Outage            // the applier's: see deliver
}

var (
	_ idem.Jar      = (*Jar)(nil)
	_ idem.Deferrer = (*Jar)(nil)
)

// Open connects to the database dsn names (a postgres:// URL or key=value
// string, as pgxpool.ParseConfig reads it, pool_max_conns included),
// creates or upgrades the jar's schema (tables idem_operations and
// idem_operations_schema) unless Options.MustExist is set, and returns a
// Jar that owns its pool. It returns ErrOptions for an option out of
// range, before it connects, ErrVersion for a schema newer than this
// package, ErrSchema for a current one that lacks a table or an index, or
// for the jar's table without the record of its version, or for a DSN's
// search_path that the session does not run with, ErrNoSchema
// for a search_path that names no schema that exists (see the package
// documentation), and ErrPool for a session whose isolation or
// synchronous_commit is not what Open sets (a pooler dropped them). A schema that is current is only read: a role that may
// not create tables opens it with SELECT on idem_operations_schema and
// SELECT, INSERT, UPDATE and DELETE on idem_operations, and, unless
// MustExist is set, EXECUTE on pg_advisory_xact_lock(bigint), which PUBLIC
// has by default. Such a role is refused with ErrPrivilege where the
// schema is missing or older (with MustExist, ErrNoJar), or where it may
// not execute that function; and so is, without MustExist, a role that
// lacks one of the four on idem_operations, or whose transactions are
// read-only, where every call would fail. When no connection could be
// made, its error says that the connection to the database failed and
// why (the server's refusal, or the dial's error), and errors.As finds
// pgx's *pgconn.ConnectError in it, and the server's *pgconn.PgError.
func Open(ctx context.Context, dsn string, opts *Options) (*Jar, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgjar: %w", pgmigrate.ParseError(err))
	}
	updateCommit := "off"
	v, chosen := cfg.ConnConfig.RuntimeParams["synchronous_commit"]
	if chosen {
		updateCommit = v // the operator's choice, for every write
	}
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
		return nil, fmt.Errorf("pgjar: %w", err)
	}
	j, err := start(ctx, pool, o, updateCommit, true)
	if err != nil {
		pool.Close()
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	if err := pgmigrate.Opened(cctx, pool, chosen, ErrPool); err != nil {
		j.Close()
		if !errors.Is(err, ErrPool) {
			err = fmt.Errorf("pgjar: %w", err)
		}
		return nil, err
	}
	return j, nil
}

// New returns a Jar on pool, a pool its caller keeps (Close leaves it
// open), after creating or upgrading the schema as Open does, under the
// same lock (or, with Options.MustExist, checking it), in current_schema()
// of the pool's connection that does it, or ErrVersion, ErrSchema,
// ErrNoJar, ErrNoSchema, ErrPrivilege or ErrOptions. A service that runs a pool for its database
// keeps its jar there without a second one.
//
// The pool's connections keep their settings, and New reads two of them
// on one connection: it returns ErrPool, creating nothing, unless they run
// READ COMMITTED by default (default_transaction_isolation, the
// PostgreSQL default; see the package documentation) and either
// synchronous_commit is on (or remote_apply) or the pool's config sets it
// in ConnConfig.RuntimeParams (its DSN's synchronous_commit=…). A value
// set there is the operator's choice, as in Open's DSN: every write
// commits with it, Update's included; otherwise Update commits with
// synchronous_commit=off, as with Open. Every connection of the pool must
// run with the settings of the one New read: set them in the pool's
// RuntimeParams or its DSN, never with SET on a connection the caller
// gives back to the pool.
//
// Of Options, PruneBatch and MigrationTimeout apply as with Open (the
// migration's transaction sets its own statement_timeout), and
// QueryTimeout bounds the jar's waits for the pool and for each answer,
// but is not made the server's statement_timeout (see QueryTimeout). The pool's size,
// ShouldPing (see the package documentation) and every other setting are
// the caller's: the jar takes one connection for each statement, its
// applier one while it sends a batch, and the caller's own use of the pool
// may keep the jar waiting, up to twice QueryTimeout, for a connection.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Jar, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	updateCommit, err := pgmigrate.CheckPool(cctx, pool, ErrPool)
	switch {
	case err != nil && !errors.Is(err, ErrPool):
		return nil, fmt.Errorf("pgjar: %w", err)
	case err != nil:
		return nil, err
	case updateCommit == "":
		updateCommit = "off"
	}
	return start(ctx, pool, o, updateCommit, false)
}

// withDefaults returns *opts, or the zero Options for nil, with its zero
// fields set to their defaults, or ErrOptions for a field out of range.
func withDefaults(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	l, err := pgmigrate.Limits{QueryTimeout: o.QueryTimeout, PruneBatch: o.PruneBatch, MigrationTimeout: o.MigrationTimeout}.WithDefaults(
		pgmigrate.Limits{QueryTimeout: DefaultQueryTimeout, PruneBatch: DefaultPruneBatch, MigrationTimeout: DefaultMigrationTimeout}, ErrOptions)
	o.QueryTimeout, o.PruneBatch, o.MigrationTimeout = l.QueryTimeout, l.PruneBatch, l.MigrationTimeout
	return o, err
}

// start returns a Jar on pool, whose Update commits with updateCommit and
// whose Close closes pool when owned is true, once the schema is current
// (see migrate; with o.MustExist, present), and starts its applier.
func start(ctx context.Context, pool *pgxpool.Pool, o Options, updateCommit string, owned bool) (*Jar, error) {
	check := migrate
	if o.MustExist {
		check = present // a jar that exists, and nothing created
	}
	name, err := check(ctx, pool, o)
	if err != nil {
		return nil, err
	}
	j := &Jar{pool: pool, owned: owned, timeout: o.QueryTimeout, batch: o.PruneBatch, updateCommit: updateCommit, logger: o.Logger,
		sql:   newStatements(name),
		queue: make(chan deferred, deferQueue), applied: make(chan struct{}),
		pending: make(map[string]int), progress: make(chan struct{})}
	go j.applyLoop()
	return j, nil
}

// Close applies the changes deferred before it (see Defer), waiting for the
// database at most Options.QueryTimeout twice per 64 of them (and as long
// again for a connection, when the pool has none free, and as long again
// in all to send them again after a lost connection), and closes the pool
// if Open created it, after the statements running on it: a jar from New
// leaves its caller's pool open. Every method called after it, Close
// included, returns ErrClosed, and so does a call that was yet to take a
// connection. When deferred changes were dropped on an error since the jar
// was opened, those Close applied included, Close returns an error
// matching idem.ErrDropped that counts them, after closing the jar.
//
// Close does not wait for the calls of an idem.Transport over the jar: one
// still running when it closes records nothing more, its outcome included
// (an answer that came still reaches its caller). Its operation stays
// pending, leased until the lease ends, and a resume gets the server's
// replay. Close the jar once the calls through it have returned, as
// package client's Close does.
func (j *Jar) Close() error {
	j.queueMu.Lock()
	if j.closed.Swap(true) {
		j.queueMu.Unlock()
		return ErrClosed
	}
	close(j.queue)
	j.queueMu.Unlock()
	<-j.applied
	if j.owned {
		j.pool.Close()
	}
	if err := j.drops.Err(); err != nil {
		return wrapf(err, "close")
	}
	return nil
}

// check reports whether the jar is open and ctx alive.
func (j *Jar) check(ctx context.Context) error {
	if j.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// closedOr returns err or, when the jar is closed and err is a failure
// rather than the answer that there is no row, ErrClosed: a call that
// Close cut short fails with whatever pgxpool says of a closed pool. A
// connection that could not be made says so in one line, as Open's error
// does (see pgmigrate.OneLine); a pooler's mix-up of pgx's prepared
// statements says what to do about it (see pgmigrate.CacheHint).
func (j *Jar) closedOr(err error) error {
	if err != nil && !errors.Is(err, pgx.ErrNoRows) && j.closed.Load() {
		return ErrClosed
	}
	return pgmigrate.CacheHint(pgmigrate.OneLine(err))
}

// conn takes a connection and the context for one statement on it (see
// reconnect.Acquire and Options.QueryTimeout).
func (j *Jar) conn(ctx context.Context) (_ *pgxpool.Conn, _ context.Context, done func(), _ error) {
	return reconnect.Acquire(ctx, j.pool, 2*j.timeout)
}

// retryUntil returns when the retries of a call, or of a statement, that
// starts now end (see the package documentation).
func (j *Jar) retryUntil() time.Time { return time.Now().Add(2 * j.timeout) }

// run checks that the jar is open and ctx alive, and runs statement on a
// connection from the pool. It runs it again while the connection is lost
// before the answer, until until (the zero time for one attempt), and when
// the statement was sent only if resend is true: see reconnect.Run, which
// says what lost is.
func (j *Jar) run(ctx context.Context, until time.Time, resend bool, statement func(ctx context.Context, conn reconnect.Conn) error) (lost, err error) {
	if err := j.check(ctx); err != nil {
		return nil, err
	}
	lost, err = reconnect.Run(ctx, j.pool, 2*j.timeout, until, resend, func(ctx context.Context, conn reconnect.Conn, _ bool) error {
		return statement(ctx, conn)
	})
	return lost, j.closedOr(err)
}

// record runs one statement that returns at most one record, as run does.
func (j *Jar) record(ctx context.Context, until time.Time, resend bool, query string, args ...any) (rec idem.Record, lost, err error) {
	lost, err = j.run(ctx, until, resend, func(ctx context.Context, conn reconnect.Conn) error {
		var err error
		rec, err = scanRecord(conn.QueryRow(ctx, query, args...))
		return err
	})
	return rec, lost, err
}

// recordTx runs a statement as record does, in a transaction that it
// commits once the record the statement returns decodes, and rolls back
// otherwise (an *idem.RecordError): the jar changes no record it refuses
// to read, as keyjar's transactions change none. BEGIN and COMMIT cost
// two round trips more, so Acquire and Update first run their UPDATE
// alone, under decodes, which the server checks: it commits in one round
// trip a record that surely decodes (every header of UTF-8 names and
// values the jar writes), and writes nothing otherwise; Acquire and Update
// then read the record (a RecordError ends them there) and run their
// UPDATE again here.
// A COMMIT whose answer was lost is an UPDATE whose answer was lost: it
// may have been applied, and it is run again only when resend is true.
func (j *Jar) recordTx(ctx context.Context, until time.Time, resend bool, query string, args ...any) (rec idem.Record, lost, err error) {
	lost, err = j.run(ctx, until, resend, func(ctx context.Context, conn reconnect.Conn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			rec, err = scanRecord(tx.QueryRow(ctx, query, conn.Args(args...)...))
			return err
		})
	})
	return rec, lost, err
}

// exec runs one statement, as run does, and returns how many rows it
// changed.
func (j *Jar) exec(ctx context.Context, until time.Time, resend bool, query string, args ...any) (n int64, lost, err error) {
	lost, err = j.run(ctx, until, resend, func(ctx context.Context, conn reconnect.Conn) error {
		tag, err := conn.Exec(ctx, query, args...)
		n = tag.RowsAffected()
		return err
	})
	return n, lost, err
}

// get returns op's record, pgx.ErrNoRows when there is none, reading it
// again while the connection is lost, until until (see record).
func (j *Jar) get(ctx context.Context, until time.Time, op string) (idem.Record, error) {
	rec, _, err := j.record(ctx, until, true, j.sql.get, op)
	return rec, err
}

// getSQL reads one record.
const getSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations WHERE op = $1`

// Begin implements idem.Jar: it returns op's record, creating it from r
// (created=true) when the jar holds none or holds one in StateAbandoned. A
// created record is on stable storage before Begin returns. Headers that
// idem.SecretHeader names are kept by name alone, without their values
// (see idem.Record.Withheld); an empty State means StatePending.
// When the connection to the server is lost, Begin runs its statements
// again (see the package documentation).
//
// Begin returns ErrInvalid for a record without Op or Key, with an Op
// longer than MaxOpLen, an invalid State, a time that cannot be stored, a
// string that PostgreSQL's text cannot hold or a LastStatus outside 32 bits.
func (j *Jar) Begin(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	if j.closed.Load() {
		return idem.Record{}, false, wrapf(ErrClosed, "begin %q", r.Op)
	}
	if r.Op == "" || r.Key == "" {
		return idem.Record{}, false, wrapf(fmt.Errorf("%w: empty Op or Key", ErrInvalid), "begin %q", r.Op)
	}
	if len(r.Op) > MaxOpLen {
		return idem.Record{}, false, wrapf(fmt.Errorf("%w: Op is %d bytes long; the limit is %d", ErrInvalid, len(r.Op), MaxOpLen), "begin %.40q…", r.Op)
	}
	if err := storable("Op", r.Op, "Key", r.Key, "Fingerprint", r.Fingerprint, "Method", r.Method, "URL", r.URL,
		"LastError", r.LastError, "Note", r.Note, "Holder", r.Holder); err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	if r.State == "" {
		r.State = idem.StatePending
	}
	if !r.State.Valid() {
		return idem.Record{}, false, wrapf(fmt.Errorf("%w: state %q", ErrInvalid, r.State), "begin %q", r.Op)
	}
	if err := storableStatus(r.LastStatus); err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	var times [4]*int64
	for i, t := range []struct {
		field string
		t     time.Time
	}{{"Created", r.Created}, {"Updated", r.Updated}, {"NextAttempt", r.NextAttempt}, {"LeaseUntil", r.LeaseUntil}} {
		var err error
		if times[i], err = nanos(t.field, t.t); err != nil {
			return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
		}
	}
	header, err := hdrjson.Marshal(secrethdr.Withhold(r.Header))
	if err != nil {
		return idem.Record{}, false, wrapf(fmt.Errorf("%w: header: %v", ErrInvalid, err), "begin %q", r.Op)
	}
	if err := j.settle(ctx, r.Op); err != nil {
		return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
	}
	until := j.retryUntil()
	unsure := false // an INSERT was sent and its answer lost
	for range raceAttempts {
		// One statement claims the name: a new row, or the replacement of an
		// abandoned one. It returns nothing when another record holds it.
		// Sent again after a lost answer, it finds the record it wrote.
		rec, lost, err := j.record(ctx, until, true, j.sql.begin,
			r.Op, r.Key, r.Fingerprint, string(r.State), r.Method, r.URL, string(header), r.Body, r.BodySize,
			times[0], times[1], r.Attempts, r.LastStatus, r.LastError, times[2], r.Note, r.Holder, times[3])
		unsure = unsure || lost != nil
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
		}
		// A second statement reads the record that holds the name, as
		// committed now (the first one's snapshot may predate it).
		rec, err = j.get(ctx, until, r.Op)
		if err == nil && rec.State != idem.StateAbandoned {
			// A record as this call wrote it is its own, created by an
			// attempt whose answer was lost.
			return rec, unsure && began(rec, r), nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return idem.Record{}, false, wrapf(err, "begin %q", r.Op)
		}
		// Forgotten or abandoned in between: claim it again.
	}
	return idem.Record{}, false, fmt.Errorf("pgjar: begin %q: the record changed under %d attempts", r.Op, raceAttempts)
}

// beginSQL is Begin's claim of a name.
const beginSQL = `INSERT INTO {schema}.idem_operations (op, key, fingerprint, state, method, url, header, body, body_size,
		created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
	ON CONFLICT (op) DO UPDATE SET key = excluded.key, fingerprint = excluded.fingerprint,
		state = excluded.state, method = excluded.method, url = excluded.url,
		header = excluded.header, body = excluded.body, body_size = excluded.body_size,
		created = excluded.created, updated = excluded.updated, attempts = excluded.attempts,
		last_status = excluded.last_status, last_error = excluded.last_error,
		next_attempt = excluded.next_attempt, note = excluded.note, holder = excluded.holder,
		lease_until = excluded.lease_until
	WHERE idem_operations.state = 'abandoned'
	RETURNING ` + columns

// began reports whether rec is as Begin wrote r: its key, fingerprint,
// creation time, holder and lease. A caller's holder and creation time,
// to the nanosecond, are its own (see idem.NewHolder).
func began(rec, r idem.Record) bool {
	return rec.Key == r.Key && rec.Fingerprint == r.Fingerprint && rec.Holder == r.Holder &&
		rec.Created.Equal(r.Created) && rec.LeaseUntil.Equal(r.LeaseUntil)
}

// Get implements idem.Jar. It returns idem.ErrNotFound for an unknown op.
func (j *Jar) Get(ctx context.Context, op string) (idem.Record, error) {
	if storable("op", op) != nil && !j.closed.Load() {
		return idem.Record{}, wrapf(idem.ErrNotFound, "get %q", op) // Begin refuses such a name
	}
	if err := j.settle(ctx, op); err != nil {
		return idem.Record{}, wrapf(err, "get %q", op)
	}
	rec, err := j.get(ctx, j.retryUntil(), op)
	if errors.Is(err, pgx.ErrNoRows) {
		err = idem.ErrNotFound
	}
	if err != nil {
		return idem.Record{}, wrapf(err, "get %q", op)
	}
	return rec, nil
}

// Acquire implements idem.Jar: it takes op's lease for holder until now+ttl
// when the lease is free, held by holder or expired at now. Otherwise it
// returns the record and idem.ErrLeased. It returns idem.ErrNotFound for an
// unknown op, ErrInvalid when now or now+ttl cannot be stored, and an
// *idem.RecordError, changing nothing, for a record that does not decode.
// When the connection to the server is lost, Acquire runs its statements
// again (see the package documentation).
func (j *Jar) Acquire(ctx context.Context, op, holder string, now time.Time, ttl time.Duration) (idem.Record, error) {
	if j.closed.Load() {
		return idem.Record{}, wrapf(ErrClosed, "acquire %q", op)
	}
	if err := storable("op", op, "holder", holder); err != nil {
		return idem.Record{}, wrapf(err, "acquire %q", op)
	}
	at, err := nanos("now", now)
	if err == nil && at == nil {
		err = fmt.Errorf("%w: zero now", ErrInvalid)
	}
	if err != nil {
		return idem.Record{}, wrapf(err, "acquire %q", op)
	}
	until, err := nanos("lease end", now.Add(ttl))
	if err == nil {
		err = j.settle(ctx, op)
	}
	if err != nil {
		return idem.Record{}, wrapf(err, "acquire %q", op)
	}
	var rec idem.Record
	retryUntil := j.retryUntil()
	write, stmt := j.record, j.sql.acquire
	for range raceAttempts {
		// Sent again after a lost answer, it finds the lease its own, and
		// takes it again.
		rec, _, err = write(ctx, retryUntil, true, stmt, op, holder, *at, until)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return idem.Record{}, wrapf(err, "acquire %q", op)
		}
		rec, err = j.get(ctx, retryUntil, op)
		if errors.Is(err, pgx.ErrNoRows) {
			err = idem.ErrNotFound
		}
		if err != nil {
			return idem.Record{}, wrapf(err, "acquire %q", op)
		}
		if !rec.CanLease(holder, now) {
			return rec, wrapf(idem.ErrLeased, "acquire %q", op)
		}
		// Released between the two statements, or a record that decodes
		// is false of: try again, in a transaction (see recordTx).
		write, stmt = j.recordTx, j.sql.acquireTx
	}
	// Every UPDATE found the lease held by another, and every read found it
	// released since: the lease is busy, and ErrLeased is true of the last
	// UPDATE's moment.
	return rec, wrapf(idem.ErrLeased, "acquire %q", op)
}

// acquireSQL takes a lease that is free, held by the holder or expired.
// Its statements add a condition (decodes) and RETURNING.
const acquireSQL = `UPDATE {schema}.idem_operations SET holder = $2, lease_until = $4
	WHERE op = $1 AND (holder = '' OR holder = $2 OR lease_until IS NULL OR lease_until <= $3)`

// Update implements idem.Jar: it applies c to op, as idem.Change.Apply
// does. When holder is not "" and op's lease is no longer held by holder,
// nothing changes and Update returns the current record and
// idem.ErrLeaseLost. It returns idem.ErrNotFound for an unknown op, and
// ErrInvalid for an invalid c.State, a time that cannot be stored, a
// string that text cannot hold or a LastStatus outside 32 bits, and an
// *idem.RecordError, changing nothing, for a record that does not decode.
// It does not wait for the change to reach stable storage, but for a
// change to StateAbandoned, which it commits as Begin commits a key (see
// the package documentation). When the connection to the server is lost,
// Update runs its statements again, its change only when that is safe
// (see the package documentation).
func (j *Jar) Update(ctx context.Context, op, holder string, c idem.Change) (idem.Record, error) {
	args, err := j.changeArgs(op, holder, c)
	if err == nil {
		err = j.settle(ctx, op)
	}
	if err != nil {
		return idem.Record{}, wrapf(err, "update %q", op)
	}
	if c.State == idem.StateAbandoned {
		args[len(args)-1] = "" // the session's synchronous_commit, Begin's
	}
	var last idem.Record
	until := j.retryUntil()
	unsure := false // an UPDATE was sent and its answer lost
	write, stmt := j.record, j.sql.updateRecord
	for range raceAttempts {
		rec, lost, err := write(ctx, until, replayable(holder, c), stmt, args...)
		unsure = unsure || lost != nil
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return idem.Record{}, wrapf(err, "update %q", op)
		}
		rec, err = j.get(ctx, until, op)
		if errors.Is(err, pgx.ErrNoRows) {
			err = idem.ErrNotFound
		}
		if err != nil {
			return idem.Record{}, wrapf(err, "update %q", op)
		}
		if holder != "" && rec.Holder != holder {
			if unsure && c.Release && applied(rec, c) {
				// The attempt whose answer was lost released the lease,
				// which fenced off the next.
				return rec, nil
			}
			return rec, wrapf(idem.ErrLeaseLost, "update %q", op)
		}
		// The lease came back to holder, or the record was created, between
		// the two statements, or it is one that decodes is false of: try
		// again, in a transaction (see recordTx).
		last = rec
		write, stmt = j.recordTx, j.sql.updateRecordTx
	}
	if holder != "" {
		// Every UPDATE found the lease held by another: ErrLeaseLost is true
		// of the last one's moment.
		return last, wrapf(idem.ErrLeaseLost, "update %q", op)
	}
	return idem.Record{}, fmt.Errorf("pgjar: update %q: the record changed under %d attempts", op, raceAttempts)
}

// applied reports whether rec is as c left it, its attempts aside: every
// field that c sets holds c's value.
func applied(rec idem.Record, c idem.Change) bool {
	want := rec
	c.Apply(&want)
	return want.Updated.Equal(rec.Updated) && want.State == rec.State && want.LastStatus == rec.LastStatus &&
		want.LastError == rec.LastError && want.NextAttempt.Equal(rec.NextAttempt) && want.Note == rec.Note &&
		want.Holder == rec.Holder && want.LeaseUntil.Equal(rec.LeaseUntil)
}

// updateSQL is the fenced UPDATE of Update and of the changes Defer queues.
// Its arguments are changeArgs'; it commits with synchronous_commit set to
// Jar.updateCommit, or to the session's setting when its last argument is
// "" (set_config's is_local: to the end of recordTx's transaction too).
// Update's statements add a condition (decodes) and RETURNING.
const updateSQL = `UPDATE {schema}.idem_operations SET
		updated = $3,
		state = CASE WHEN $4::text = '' THEN state ELSE $4::text END,
		attempts = attempts + $5,
		last_status = $6,
		last_error = $7,
		next_attempt = $8,
		note = CASE WHEN $9::text = '' THEN note ELSE $9::text END,
		holder = CASE WHEN $10::boolean THEN '' ELSE holder END,
		lease_until = CASE WHEN $10::boolean THEN NULL ELSE lease_until END
	FROM (SELECT CASE WHEN $11::text <> '' THEN set_config('synchronous_commit', $11::text, true) END) AS commit_mode
	WHERE op = $1 AND ($2::text = '' OR holder = $2::text)`

// changeArgs checks c and returns the arguments of updateSQL, which applies
// it as idem.Change.Apply does. It returns ErrClosed after Close, and
// ErrInvalid for an invalid c.State, a time that cannot be stored, a
// string that text cannot hold or a LastStatus outside 32 bits.
func (j *Jar) changeArgs(op, holder string, c idem.Change) ([]any, error) {
	if j.closed.Load() {
		return nil, ErrClosed
	}
	if err := storable("op", op, "holder", holder, "LastError", c.LastError, "Note", c.Note); err != nil {
		return nil, err
	}
	if c.State != "" && !c.State.Valid() {
		return nil, fmt.Errorf("%w: state %q", ErrInvalid, c.State)
	}
	if err := storableStatus(c.LastStatus); err != nil {
		return nil, err
	}
	now, err := nanos("Now", c.Now)
	if err != nil {
		return nil, err
	}
	next, err := nanos("NextAttempt", c.NextAttempt)
	if err != nil {
		return nil, err
	}
	return []any{op, holder, now, string(c.State), int64(c.Attempts), c.LastStatus, c.LastError, next, c.Note,
		c.Release, j.updateCommit}, nil
}

// storable returns ErrInvalid for the first of the named strings (name,
// value pairs) that a text column cannot hold: PostgreSQL refuses a NUL
// byte and bytes that are not UTF-8. The error quotes the string with the
// passwords in it masked (a URL's, a connection string's, an error quoting one).
func storable(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if v := fields[i+1]; !pgtext.Holds(v) {
			return fmt.Errorf("%w: %s %q holds a NUL byte or bytes that are not UTF-8", ErrInvalid, fields[i], dsn.MaskPasswords(v))
		}
	}
	return nil
}

// storableStatus returns ErrInvalid for a LastStatus that the integer
// column cannot hold. The driver would refuse it before sending, and for a
// deferred change that failure would lose the other changes of its batch.
func storableStatus(status int) error {
	if status < math.MinInt32 || status > math.MaxInt32 {
		return fmt.Errorf("%w: LastStatus %d is out of range", ErrInvalid, status)
	}
	return nil
}

// List returns the records that pass f, oldest Created first (the zero
// time first), then by Op, bytewise: none for a State that text cannot
// hold, which no record is in. A page after f.After reads from the index
// on (created, op), or with a State from the one on (state, created, op),
// where the cursor lies, and stops at f.Limit: its cost is the page's, not
// the table's, and a State filter reads the records of that state alone;
// a cursor at the zero time also reads those created at the zero time
// before it. A cursor whose
// Op text cannot hold (a NUL byte, bytes that are not UTF-8), which no
// record has, is ErrInvalid.
func (j *Jar) List(ctx context.Context, f idem.Filter) ([]idem.Record, error) {
	if err := j.check(ctx); err != nil {
		return nil, wrapf(err, "list") // closed, whatever f holds
	}
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("%w: list: Filter.State %q is no state", ErrInvalid, f.State)
	}
	if err := storable("After.Op", f.After.Op); err != nil {
		return nil, wrapf(err, "list")
	}
	if err := j.settle(ctx, ""); err != nil {
		return nil, wrapf(err, "list")
	}
	query, args, none := j.listQuery(f)
	if none {
		return nil, nil
	}
	return j.records(ctx, "list", query, args...)
}

// listQuery returns List's statement for f and its arguments, or none when
// no record can be after f.After: one past the last time the jar stores.
func (j *Jar) listQuery(f idem.Filter) (query string, args []any, none bool) {
	var limit *int64
	if f.Limit > 0 {
		l := int64(f.Limit)
		limit = &l
	}
	args = []any{string(f.State), limit}
	list, listAfter, listAfterZero := j.sql.list, j.sql.listAfter, j.sql.listAfterZero
	if f.State != "" {
		list, listAfter, listAfterZero = j.sql.listState, j.sql.listStateAfter, j.sql.listStateAfterZero
	}
	after := f.After
	switch {
	case after.IsZero() || after.Created.Before(time.Time{}):
		return list, args, false
	case after.Created.IsZero():
		return listAfterZero, append(args, after.Op), false
	case after.Created.After(time.Unix(0, math.MaxInt64)):
		return "", nil, true // past every time the jar stores
	case after.Created.Before(time.Unix(0, math.MinInt64)):
		// Before every time the jar stores but the zero time's.
		return listAfter, append(args, int64(math.MinInt64), ""), false
	}
	return listAfter, append(args, after.Created.UnixNano(), after.Op), false
}

// The statements of List: every record in one state, or all; those after
// a position ($3 nanoseconds, $4 name); and those after a position at the
// zero time ($3 name), which is NULL and sorts first. $2 is the limit.
// Each has a twin for a State, "state = $1", which List runs when f.State
// is set, so that it reads idem_operations_by_state_created: a statement
// prepared once (pgx caches them) may be run on a generic plan, made for
// every $1, on which the condition of the first three, true of every
// record when $1 is empty, can use no index on state, and a walk of the
// few pending records among many done ones would read them all.
const (
	listSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE $1::text = '' OR state = $1::text
	ORDER BY created NULLS FIRST, op LIMIT $2`
	listAfterSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE (created, op) > ($3::bigint, $4::text) AND ($1::text = '' OR state = $1::text)
	ORDER BY created NULLS FIRST, op LIMIT $2`
	listAfterZeroSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE (created IS NOT NULL OR op > $3::text) AND ($1::text = '' OR state = $1::text)
	ORDER BY created NULLS FIRST, op LIMIT $2`

	listStateSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE state = $1::text
	ORDER BY created NULLS FIRST, op LIMIT $2`
	listStateAfterSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE state = $1::text AND (created, op) > ($3::bigint, $4::text)
	ORDER BY created NULLS FIRST, op LIMIT $2`
	listStateAfterZeroSQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE state = $1::text AND (created IS NOT NULL OR op > $3::text)
	ORDER BY created NULLS FIRST, op LIMIT $2`
)

// ByKey returns the records whose Key is key, oldest Created first, then
// by Op: usually one, more when a caller sent the same Idempotency-Key
// under several names. No index leads from keys to records, so it reads
// the whole table, on the server's side; it is for tools such as idemctl,
// which look up the key a server logged, not for a request's path.
func (j *Jar) ByKey(ctx context.Context, key string) ([]idem.Record, error) {
	if storable("key", key) != nil && !j.closed.Load() {
		return nil, nil // Begin refuses such a key
	}
	if err := j.settle(ctx, ""); err != nil {
		return nil, wrapf(err, "by key")
	}
	return j.records(ctx, "by key", j.sql.byKey, key)
}

// byKeySQL reads the records of one key, oldest first.
const byKeySQL = `SELECT ` + columns + ` FROM {schema}.idem_operations
	WHERE key = $1 ORDER BY created NULLS FIRST, op`

// records runs one query of whole records, under one statement's deadline,
// and again while the connection is lost (see run).
func (j *Jar) records(ctx context.Context, verb, query string, args ...any) ([]idem.Record, error) {
	var out []idem.Record
	_, err := j.run(ctx, j.retryUntil(), true, func(ctx context.Context, conn reconnect.Conn) error {
		out = nil
		rows, err := conn.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, wrapf(err, "%s", verb)
	}
	return out, nil
}

// Forget deletes op, whatever its state. It returns idem.ErrNotFound for an
// unknown op, unless the connection was lost before the answer to a DELETE
// that was sent: it then reports op deleted (see the package
// documentation).
func (j *Jar) Forget(ctx context.Context, op string) error {
	if storable("op", op) != nil && !j.closed.Load() {
		return wrapf(idem.ErrNotFound, "forget %q", op) // Begin refuses such a name
	}
	err := j.settle(ctx, op)
	var (
		n    int64
		lost error
	)
	if err == nil {
		n, lost, err = j.exec(ctx, j.retryUntil(), true, j.sql.forget, op)
	}
	if err == nil && n == 0 && lost == nil {
		// Sent again after a lost answer, the DELETE finds nothing when the
		// lost one deleted op.
		err = idem.ErrNotFound
	}
	if err != nil {
		return wrapf(err, "forget %q", op)
	}
	return nil
}

// forgetSQL deletes one record.
const forgetSQL = `DELETE FROM {schema}.idem_operations WHERE op = $1`

// ForgetKey deletes op only if its record has key and is not pending, in
// one DELETE whose WHERE clause holds both conditions, so that a record
// Begin put in place of an abandoned one, under a new key, is kept
// (client.KeyForgetter). It returns idem.ErrNotFound for an unknown op and
// idem.ErrNotForgotten, deleting nothing, for a record with another key or
// in StatePending. Like Forget, it first waits for the changes deferred on
// op before it was called (see Defer), and reports op deleted when it finds
// none after a DELETE whose answer was lost.
func (j *Jar) ForgetKey(ctx context.Context, op, key string) error {
	if storable("op", op) != nil && !j.closed.Load() {
		return wrapf(idem.ErrNotFound, "forget key %q", op) // Begin refuses such a name
	}
	if err := j.settle(ctx, op); err != nil {
		return wrapf(err, "forget key %q", op)
	}
	keyOK := storable("key", key) == nil // no record has a key that text cannot hold
	until := j.retryUntil()
	unsure := false // a DELETE was sent and its answer lost
	for range raceAttempts {
		if keyOK {
			n, lost, err := j.exec(ctx, until, true, j.sql.forgetKey, op, key)
			unsure = unsure || lost != nil
			if err != nil {
				return wrapf(err, "forget key %q", op)
			}
			if n == 1 {
				return nil
			}
		}
		// A second statement tells why nothing was deleted, reading no
		// header: a record that does not decode (idem.RecordError) is not
		// forgotten as any other.
		got, err := j.keyState(ctx, until, op)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && unsure:
			return nil // the DELETE whose answer was lost deleted it
		case errors.Is(err, pgx.ErrNoRows):
			err = idem.ErrNotFound
		case err == nil && (got.key != key || got.state == string(idem.StatePending)):
			err = idem.ErrNotForgotten
		}
		if err != nil {
			return wrapf(err, "forget key %q", op)
		}
		// It left StatePending under key between the two statements: try
		// again.
	}
	return fmt.Errorf("pgjar: forget key %q: the record changed under %d attempts", op, raceAttempts)
}

// AbandonKey moves op to idem.StateAbandoned, with note as its Note and now
// as its Updated, its lease released and its next attempt cleared, only if
// its record has key, is pending or reconcile, and its lease is free,
// expired at now or held by holder; in one UPDATE that reads no other
// column, so that it abandons a record that does not decode
// (idem.RecordError), which Acquire and Update, reading it whole, refuse.
// The record keeps its other fields. It is for a tool (idemctl) that
// established that the operation did not happen and is not running; holder
// is "" but for a lease whose process is gone (idem.HolderGone). It
// commits as Begin commits a key. It returns ErrInvalid for an empty note,
// one that text cannot hold, or a now that is zero or cannot be stored,
// idem.ErrNotFound for an unknown op and idem.ErrNotAbandoned, changing
// nothing, when the record's key, state or lease keep it. Like ForgetKey,
// it first waits for the changes deferred on op, and reports op abandoned
// when it finds it so, with note and now, after an UPDATE whose answer was
// lost.
func (j *Jar) AbandonKey(ctx context.Context, op, key, holder, note string, now time.Time) error {
	if j.closed.Load() {
		return wrapf(ErrClosed, "abandon key %q", op)
	}
	at, err := nanos("now", now)
	if err == nil && (at == nil || note == "") {
		err = fmt.Errorf("%w: a zero now or an empty note", ErrInvalid)
	}
	if err == nil {
		err = storable("note", note)
	}
	if err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	if storable("op", op, "key", key, "holder", holder) != nil {
		// Begin refuses such a name and key, and Acquire such a holder.
		return wrapf(idem.ErrNotAbandoned, "abandon key %q", op)
	}
	if err := j.settle(ctx, op); err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	until := j.retryUntil()
	n, lost, err := j.exec(ctx, until, true, j.sql.abandonKey, op, key, holder, note, *at)
	if err == nil && n == 0 {
		// A second statement tells why nothing changed, reading no header.
		var got keyState
		got, err = j.keyState(ctx, until, op)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = idem.ErrNotFound
		case err != nil:
		case lost != nil && got.key == key && got.state == string(idem.StateAbandoned) && got.note == note && got.updated != nil && *got.updated == *at:
			// The UPDATE whose answer was lost abandoned it.
		default:
			err = idem.ErrNotAbandoned
		}
	}
	if err != nil {
		return wrapf(err, "abandon key %q", op)
	}
	return nil
}

// keyState is what abandonedKeySQL reads of a record: enough to tell why
// AbandonKey or ForgetKey changed nothing, and no header, so that it reads
// a record that does not decode.
type keyState struct {
	key, state, note string
	updated          *int64
}

// keyState reads op's keyState, or pgx.ErrNoRows for an unknown op.
func (j *Jar) keyState(ctx context.Context, until time.Time, op string) (ks keyState, err error) {
	_, err = j.run(ctx, until, true, func(ctx context.Context, conn reconnect.Conn) error {
		return conn.QueryRow(ctx, j.sql.abandonedKey, op).Scan(&ks.key, &ks.state, &ks.note, &ks.updated)
	})
	return ks, err
}

// abandonKeySQL is AbandonKey's UPDATE: $1 op, $2 key, $3 holder, $4 note,
// $5 now. The lease's condition is idem.Record.CanLease's. abandonedKeySQL
// reads what tells why it changed nothing (see keyState).
const (
	abandonKeySQL = `UPDATE {schema}.idem_operations SET state = 'abandoned', note = $4, updated = $5,
		next_attempt = NULL, holder = '', lease_until = NULL
	WHERE op = $1 AND key = $2 AND state IN ('pending', 'reconcile')
		AND (holder = '' OR holder = $3 OR lease_until IS NULL OR lease_until <= $5)`
	abandonedKeySQL = `SELECT key, state, note, updated FROM {schema}.idem_operations WHERE op = $1`
)

// forgetKeySQL deletes one record of a key that is not pending.
const forgetKeySQL = `DELETE FROM {schema}.idem_operations WHERE op = $1 AND key = $2 AND state <> 'pending'`

// prunable is the SQL test for idem.Prunable and "updated before" the time
// $1 is the cutoff of.
const prunable = `state IN ('done', 'failed', 'abandoned') AND (updated IS NULL OR updated <= $1)`

// dueSQL counts the records Prune may delete; pruneSQL deletes a batch of
// them, least recently updated first. The batch is picked once, in a
// materialized CTE: as a subquery of the DELETE, the planner may run it
// again for every row it scans (a nested-loop semi-join, when the table's
// statistics take it for one row), and each run locks, and picks, rows the
// last did not, so that one DELETE went past its LIMIT.
const (
	dueSQL   = `SELECT count(*) FROM {schema}.idem_operations WHERE ` + prunable
	pruneSQL = `WITH batch AS MATERIALIZED (
		SELECT op FROM {schema}.idem_operations WHERE ` + prunable + `
		ORDER BY updated NULLS FIRST LIMIT $2 FOR UPDATE SKIP LOCKED)
		DELETE FROM {schema}.idem_operations WHERE op IN (SELECT op FROM batch)`
)

// Prune deletes at most limit records whose state is idem.Prunable and that
// were last updated before before, and returns how many it deleted. limit
// <= 0 means no limit. It deletes the least recently updated first, in
// statements of at most Options.PruneBatch records, skipping records that
// another transaction holds locked (a later Prune gets them). On an error it
// returns how many it deleted before.
//
// When the connection is lost before the answer to a statement, Prune runs
// it again (see the package documentation). Without a limit, it sends a
// batch again even after a lost answer, and the resend deletes what is
// left: the count it returns then misses the rows of the lost batch. With a
// limit, which the resend could overrun, it returns the error of a batch
// whose answer was lost.
func (j *Jar) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	err := j.check(ctx)
	if err == nil {
		err = j.settle(ctx, "")
	}
	if err != nil {
		return 0, wrapf(err, "prune")
	}
	if !before.After(time.Time{}) {
		return 0, nil // nothing is older than the zero time
	}
	cut := cutoff(before)
	resend := limit <= 0 // a lost batch is sent again only without a limit
	if limit <= 0 {
		// Bound the batches by what is due now.
		var due int64
		_, err := j.run(ctx, j.retryUntil(), true, func(ctx context.Context, conn reconnect.Conn) error {
			return conn.QueryRow(ctx, j.sql.due, cut).Scan(&due)
		})
		if err != nil {
			return 0, wrapf(err, "prune")
		}
		limit = int(due)
	}
	total := 0
	for total < limit {
		want := min(j.batch, limit-total)
		n, _, err := j.exec(ctx, j.retryUntil(), resend, j.sql.prune, cut, want)
		total += int(n)
		if err != nil {
			return total, wrapf(err, "prune")
		}
		if int(n) < want {
			break
		}
	}
	return total, nil
}
