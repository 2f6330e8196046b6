package pgjar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem"
	cutoffpkg "github.com/idemkit/idem/internal/cutoff"
	"github.com/idemkit/idem/internal/hdrjson"
	"github.com/idemkit/idem/internal/pgmigrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations[i] brings the schema from version i to version i+1. Versions
// are only ever appended: a released migration is never edited. Tables
// are named {schema}.name, in the schema Open found (see pgmigrate.Qualify).
//
// Times are Unix nanoseconds in bigint columns, NULL for the zero time:
// PostgreSQL's timestamps keep only microseconds. op sorts bytewise
// (COLLATE "C"), as Go compares strings.
var migrations = [][]string{
	{ // 1
		`CREATE TABLE {schema}.idem_operations (
			op           text COLLATE "C" PRIMARY KEY,
			key          text    NOT NULL,
			fingerprint  text    NOT NULL,
			state        text    NOT NULL
				CHECK (state IN ('pending', 'done', 'failed', 'reconcile', 'abandoned')),
			method       text    NOT NULL,
			url          text    NOT NULL,
			header       text,             -- JSON object; NULL for a nil header
			body         bytea,            -- NULL for a nil body
			body_size    bigint  NOT NULL,
			created      bigint,
			updated      bigint,
			attempts     bigint  NOT NULL,
			last_status  integer NOT NULL,
			last_error   text    NOT NULL,
			next_attempt bigint,
			note         text    NOT NULL,
			holder       text    NOT NULL,
			lease_until  bigint
		)`,
		indexes["idem_operations_by_created"],
		indexes["idem_operations_by_state"],
	},
	{ // 2: List with a State (client.Pending, idemctl list --status and
		// resume --all) reads the records of that state alone, in List's
		// order, instead of every record from idem_operations_by_created.
		// Not CONCURRENTLY, which cannot run in the migration's
		// transaction: the build holds off writes to the table while it
		// reads it once.
		indexes["idem_operations_by_state_created"],
	},
}

// indexes are the jar's secondary indexes, each with the statement that
// creates it.
var indexes = map[string]string{
	"idem_operations_by_created":       `CREATE INDEX idem_operations_by_created ON {schema}.idem_operations (created NULLS FIRST, op)`,
	"idem_operations_by_state":         `CREATE INDEX idem_operations_by_state ON {schema}.idem_operations (state, updated)`,
	"idem_operations_by_state_created": `CREATE INDEX idem_operations_by_state_created ON {schema}.idem_operations (state, created NULLS FIRST, op)`,
}

// schema is the jar's tables, recorded in idem_operations_schema.
var schema = pgmigrate.Schema{
	Lock:       0x6964656d6a617273, // "idemjars"
	Table:      "idem_operations_schema",
	Migrations: migrations,
	TooNew:     ErrVersion,
	Older:      ErrOldVersion,
	Objects: []string{"idem_operations", "idem_operations_pkey",
		"idem_operations_by_created", "idem_operations_by_state", "idem_operations_by_state_created"},
	Incomplete: ErrSchema,
	Indexes:    indexes,
	NoSchema:   ErrNoSchema,
	Privilege:  ErrPrivilege,
	Writes:     "idem_operations",
	Timeout:    ErrMigrationTimeout,
}

// migrate brings the schema to len(migrations) (see pgmigrate), each
// statement that reads it within o.QueryTimeout and the migration (the wait
// for another's, each migration's statement) within o.MigrationTimeout,
// and returns the name of the schema that holds the jar.
func migrate(ctx context.Context, pool *pgxpool.Pool, o Options) (string, error) {
	name, err := schema.Migrate(ctx, pool, pgmigrate.Timeouts{Query: o.QueryTimeout, Migration: o.MigrationTimeout})
	return name, schemaError("migrate", err)
}

// present checks, creating nothing, within o.QueryTimeout, that the
// database holds the jar's tables at this package's schema version: the
// check of Options.MustExist. It returns ErrNoJar, wrapped, for a database
// without them, ErrOldVersion (which matches ErrNoJar too) for one at an
// older version, ErrVersion for a newer one and ErrSchema for one missing a table
// or an index, or holding the jar's tables without the record of a version,
// and ErrNoSchema for a search path that names no schema that exists. It
// returns the name of the schema that holds the jar.
func present(ctx context.Context, pool *pgxpool.Pool, o Options) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	name, err := schema.Check(ctx, pool, ErrNoJar)
	return name, schemaError("open", err)
}

// schemaError returns err, prefixed with the package and verb unless it is
// one of the package's own errors, or with the package alone and saying
// so when no connection could be made (see pgmigrate.Unreachable).
func schemaError(verb string, err error) error {
	if c := pgmigrate.Unreachable(err); c != nil {
		return fmt.Errorf("pgjar: %w", c)
	}
	if err != nil && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrSchema) && !errors.Is(err, ErrNoJar) &&
		!errors.Is(err, ErrNoSchema) && !errors.Is(err, ErrPrivilege) && !errors.Is(err, ErrMigrationTimeout) {
		return wrapf(pgmigrate.CacheHint(err), "%s", verb)
	}
	return err
}

// statements are the jar's SQL, its table qualified with the schema that
// Open or New found the jar in: a statement that named it unqualified
// would find it through the search path of the connection it runs on,
// which may be another schema's, or a temporary table of the same name.
// They are built once per jar.
type statements struct {
	get, begin, acquire, update, updateRecord, list, listAfter, listAfterZero, byKey, forget, forgetKey, abandonKey, abandonedKey, due, prune string
	listState, listStateAfter, listStateAfterZero                                                                                             string // List with a State
	acquireTx, updateRecordTx                                                                                                                 string // without decodes, in a transaction
}

// newStatements returns the statements on the jar in schema name.
func newStatements(name string) statements {
	q := func(stmt string) string { return pgmigrate.Qualify(stmt, name) }
	return statements{
		get:                q(getSQL),
		begin:              q(beginSQL),
		acquire:            q(acquireSQL + ` AND ` + decodes + ` RETURNING ` + columns),
		acquireTx:          q(acquireSQL + ` RETURNING ` + columns),
		update:             q(updateSQL),
		updateRecord:       q(updateSQL + ` AND ` + decodes + ` RETURNING ` + columns),
		updateRecordTx:     q(updateSQL + ` RETURNING ` + columns),
		list:               q(listSQL),
		listAfter:          q(listAfterSQL),
		listAfterZero:      q(listAfterZeroSQL),
		listState:          q(listStateSQL),
		listStateAfter:     q(listStateAfterSQL),
		listStateAfterZero: q(listStateAfterZeroSQL),
		byKey:              q(byKeySQL),
		forget:             q(forgetSQL),
		forgetKey:          q(forgetKeySQL),
		abandonKey:         q(abandonKeySQL),
		abandonedKey:       q(abandonedKeySQL),
		due:                q(dueSQL),
		prune:              q(pruneSQL),
	}
}

// columns are the columns of idem_operations in the order scanRecord reads
// them.
const columns = `op, key, fingerprint, state, method, url, header, body, body_size,
	created, updated, attempts, last_status, last_error, next_attempt, note, holder, lease_until`

// headerJSON matches JSON as hdrjson.Marshal writes a header (encoding/json's
// output for an http.Header): null, or an object of strings to null or to
// arrays of strings, without white space. Each string of it is one that
// encoding/json reads; one with "\u0000" may begin with the NUL of
// hdrjson's base64 marker, which decodes is false of.
const (
	jsonString = `"(?:[^"\\\x01-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"`
	jsonValues = `(?:null|\[(?:` + jsonString + `(?:,` + jsonString + `)*)?\])`
	jsonMember = jsonString + `:` + jsonValues
	headerJSON = `^(?:null|\{(?:` + jsonMember + `(?:,` + jsonMember + `)*)?\})$`
)

// decodes is the SQL condition, on a row of idem_operations, that
// scanRecord surely decodes it: its header is NULL, or JSON that headerJSON
// matches and that holds no "\u0000". It is false of a header that does
// not decode, and of a few that do (a name or value that begins with a NUL
// byte, or that is not UTF-8, stored in base64; JSON as another program
// writes it). Both patterns are escape strings (E'…'), which read
// backslashes alike whatever standard_conforming_strings says.
var decodes = `(header IS NULL OR strpos(header, E'\\u0000') = 0 AND header ~ E'` +
	strings.ReplaceAll(headerJSON, `\`, `\\`) + `')`

func scanRecord(row pgx.Row) (idem.Record, error) {
	var (
		r                                  idem.Record
		header                             *string
		created, updated, next, leaseUntil *int64
	)
	err := row.Scan(&r.Op, &r.Key, &r.Fingerprint, &r.State, &r.Method, &r.URL, &header, &r.Body, &r.BodySize,
		&created, &updated, &r.Attempts, &r.LastStatus, &r.LastError, &next, &r.Note, &r.Holder, &leaseUntil)
	if err != nil {
		return idem.Record{}, err
	}
	r.Created, r.Updated = fromNanos(created), fromNanos(updated)
	r.NextAttempt, r.LeaseUntil = fromNanos(next), fromNanos(leaseUntil)
	if header != nil {
		if r.Header, err = hdrjson.Unmarshal([]byte(*header)); err != nil {
			// What did decode, for a tool to name it and read past it.
			r.Header, r.Body = nil, nil
			return idem.Record{}, &idem.RecordError{Record: r, Err: fmt.Errorf("header of %q: %w", r.Op, err)}
		}
		if r.Header == nil {
			r.Header = http.Header{}
		}
	}
	return r, nil
}

func fromNanos(n *int64) time.Time {
	if n == nil {
		return time.Time{}
	}
	return time.Unix(0, *n).UTC()
}

// nanos encodes t as Unix nanoseconds, the zero time as NULL. A time that
// Unix nanoseconds cannot hold is an ErrInvalid.
func nanos(field string, t time.Time) (*int64, error) {
	if t.IsZero() {
		return nil, nil
	}
	n := t.UnixNano()
	if !time.Unix(0, n).Equal(t) {
		return nil, fmt.Errorf("%w: %s %v is outside the years 1678 to 2262", ErrInvalid, field, t)
	}
	return &n, nil
}

// cutoff encodes before, a time after the zero time, for "updated IS NULL
// OR updated <= cutoff": the last nanosecond before it, clamped into the
// range of Unix nanoseconds. Before the first of them it is NULL, which no
// updated is at or below, so that only NULL (the zero time) matches; after
// the last, the last, which every updated is at or below.
func cutoff(before time.Time) *int64 {
	n, ok := cutoffpkg.Nanos(before)
	if !ok {
		return nil
	}
	return &n
}
