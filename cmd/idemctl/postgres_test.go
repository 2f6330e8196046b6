package main

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/refusetest"
	"github.com/idemkit/idem/keyjar/pgjar"
	"github.com/jackc/pgx/v5"
)

// withPassword adds a password to a pgtest URL (trust authentication
// ignores it), to check that idemctl never prints it.
func withPassword(t *testing.T, dsn string) string {
	t.Helper()
	withPW := strings.Replace(dsn, "postgres://postgres@", "postgres://postgres:hunter2@", 1)
	if withPW == dsn {
		t.Fatalf("DSN %q: no user to give a password to", dsn)
	}
	return withPW
}

// jarTables returns the jar's tables that the database holds, "" for none.
func jarTables(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var tables string
	if err := conn.QueryRow(t.Context(), `SELECT concat_ws(' ', to_regclass('idem_operations'),
		to_regclass('idem_operations_schema'))`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	return tables
}

func TestPostgresJarErrors(t *testing.T) {
	// A database without a jar is refused, and left without one.
	empty := pgtest.DB(t)
	code, _, errOut := idemctl("--jar", withPassword(t, empty), "list")
	wantError(t, code, errOut, 1, "holds no key jar")
	if strings.Contains(errOut, "hunter2") || !strings.Contains(errOut, "postgres://postgres:xxxxx@") {
		t.Fatalf("stderr %q; want the database named with its password masked", errOut)
	}
	if tables := jarTables(t, pgtest.Connect(t, empty)); tables != "" {
		t.Fatalf("idemctl created a jar in the database: %s", tables)
	}

	for _, c := range []struct{ jar, want string }{
		{"postgres://postgres:hunter2@" + refusetest.Addr(t) + "/jars?connect_timeout=5", "connection refused"},
		{"postgresql://postgres:hunter2@%zz/jars", "cannot parse"},
	} {
		code, _, errOut := idemctl("--jar", c.jar, "list")
		wantError(t, code, errOut, 1, c.want)
		if strings.Contains(errOut, "hunter2") {
			t.Fatalf("stderr %q shows the password", errOut)
		}
		// pgx tries the address with TLS and then without (sslmode
		// prefer), and lists each attempt's error: the same one twice.
		if n := strings.Count(errOut, c.want); n != 1 {
			t.Errorf("stderr %q says %q %d times; want once", errOut, c.want, n)
		}
	}

	// The server's own refusal, not the TLS attempt before it (sslmode
	// prefer, the default, tries TLS first).
	missing := withPassword(t, empty)
	missing = missing[:strings.LastIndex(missing, "/")+1] + "no_such_db"
	code, _, errOut = idemctl("--jar", missing, "list")
	wantError(t, code, errOut, 1, `database "no_such_db" does not exist (SQLSTATE 3D000)`)
	if strings.Contains(errOut, "tls") || strings.Contains(errOut, "hunter2") {
		t.Fatalf("stderr %q; want the server's refusal alone, the password masked", errOut)
	}

	// Messages that name the jar mask the password too.
	jar := withPassword(t, seedPostgres(t, newServer(t)))
	code, _, errOut = idemctl("--jar", jar, "show", "charge:nope")
	wantError(t, code, errOut, 1, `no operation named "charge:nope" and none with that key in postgres://postgres:xxxxx@`)
}

// TestPostgresJarDroppedBeforeItIsOpened: the jar's tables are dropped
// just before idemctl opens the database (by another operator, as after
// any check that they exist). idemctl says the database holds no jar and
// creates none: a new empty jar would read as "no operations".
func TestPostgresJarDroppedBeforeItIsOpened(t *testing.T) {
	dsn := seedPostgres(t, newServer(t))
	conn := pgtest.Connect(t, dsn)
	real := openPgjar
	t.Cleanup(func() { openPgjar = real })
	dropped := false
	openPgjar = func(ctx context.Context, dsn string, opts *pgjar.Options) (*pgjar.Jar, error) {
		if _, err := conn.Exec(t.Context(), `DROP TABLE idem_operations, idem_operations_schema`); err != nil {
			t.Fatal(err)
		}
		dropped = true
		return real(ctx, dsn, opts)
	}
	code, out, errOut := idemctl("--jar", dsn, "list")
	t.Logf("exit %d, stdout %q, stderr %q", code, out, errOut)
	if !dropped {
		t.Fatal("idemctl did not open the jar")
	}
	if tables := jarTables(t, conn); tables != "" {
		t.Errorf("idemctl created a jar in the database: %s", tables)
	}
	wantError(t, code, errOut, 1, `holds no key jar in schema "public" (no table idem_operations_schema)`)
}

// TestPostgresJarPastTheSearchPath: a jar in public, and a schema named
// after the role created since, which "$user" puts first. idemctl says
// that public holds the jar and to set search_path to it, and not that a
// program creates one. Before, it said that the database held no key jar
// in schema "postgres" and that a program using pgjar creates it.
func TestPostgresJarPastTheSearchPath(t *testing.T) {
	dsn := pgtest.DB(t)
	j, err := pgjar.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA postgres AUTHORIZATION postgres`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idemctl("--jar", dsn, "list")
	wantError(t, code, errOut, 1, `holds no key jar: in schema "postgres", the role's own`)
	if !strings.Contains(errOut, `schema "public" holds the tables; set search_path to "public"`) ||
		strings.Contains(errOut, "creates it") {
		t.Errorf("stderr %q; want it to say that public holds the jar and to set search_path to it, not that a program creates one", errOut)
	}
}

// --lock-timeout bounds each statement: one waiting for a row another
// process holds gives up with a message that says so.
func TestPostgresLockTimeout(t *testing.T) {
	dsn := seedPostgres(t, newServer(t))
	tx, err := pgtest.Connect(t, dsn).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT FROM idem_operations WHERE op = 'charge:reconcile' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idemctl("--jar", dsn, "--lock-timeout", "100ms", "abandon", "charge:reconcile", "--reason", "x")
	wantError(t, code, errOut, 1, "ran out of --lock-timeout (100ms)")
	tx.Rollback(t.Context())
	if r, err := jarState(t, dsn, "charge:reconcile"); err != nil || r.State != "reconcile" {
		t.Fatalf("after the timed-out abandon: %s, %v; want it still to reconcile", r.State, err)
	}

	// A read whose statement runs past --lock-timeout (here behind a lock
	// on the whole table, taken once the jar is open, as a large jar's
	// full list runs long) says that such a read may need a longer one,
	// and which (TestPostgresLockTimeoutHint).
	lockTableOnceOpen(t, dsn)
	for _, args := range [][]string{{"list"}, {"export", "--json"}, {"show", "charge:done"}} {
		code, _, errOut := idemctl(append([]string{"--jar", dsn, "--lock-timeout", "100ms"}, args...)...)
		wantError(t, code, errOut, 1, "ran out of --lock-timeout (100ms)")
		for _, want := range []string{"a large jar", "a longer one", args[0] + " "} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s: stderr %q; want it to say %q", args[0], errOut, want)
			}
		}
	}
}

// TestPostgresClientDeadline: a statement that the server lets run (the URL
// sets statement_timeout=0, which pgjar leaves as it is) is given up by the
// jar itself after twice --lock-timeout, with an error that wraps
// context.DeadlineExceeded. Once the jar is open, as while it opens, the
// line says that it ran out of --lock-timeout, not that a context's
// deadline passed.
func TestPostgresClientDeadline(t *testing.T) {
	dsn := seedPostgres(t, newServer(t))
	opened := lockTableOnceOpen(t, dsn)
	// Long enough for the statements that open the jar, on a loaded
	// machine: the server does not end them either.
	for _, args := range [][]string{{"list"}, {"abandon", "charge:reconcile", "--reason", "x"}} {
		code, _, errOut := idemctl(append([]string{"--jar", dsn + "&statement_timeout=0", "--lock-timeout", "1s"}, args...)...)
		if !*opened {
			t.Fatalf("%s: the jar did not open: %q", args[0], errOut)
		}
		wantError(t, code, errOut, 1, "ran out of --lock-timeout (1s)")
		if strings.Contains(errOut, "context deadline exceeded") {
			t.Errorf("%s: stderr %q; want the hint alone", args[0], errOut)
		}
	}
}

// lockTableOnceOpen makes another connection lock the jar's table in the
// database dsn names, until t ends, once idemctl has opened the jar (as a
// long statement of another process would hold it): every statement of a
// command on it then waits. opened says whether idemctl opened the jar.
func lockTableOnceOpen(t *testing.T, dsn string) (opened *bool) {
	t.Helper()
	locker, err := pgtest.Connect(t, dsn).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Rollback(context.Background()) })
	real := openPgjar
	t.Cleanup(func() { openPgjar = real })
	opened = new(bool)
	openPgjar = func(ctx context.Context, dsn string, opts *pgjar.Options) (*pgjar.Jar, error) {
		j, err := real(ctx, dsn, opts)
		if err == nil {
			*opened = true
			if _, err := locker.Exec(t.Context(), `LOCK TABLE idem_operations IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
		}
		return j, err
	}
	return opened
}

// The URL a worker gives pgjar.Open, pgxpool's parameters included, opens
// its jar in idemctl too.
func TestPostgresPoolParameters(t *testing.T) {
	dsn := seedPostgres(t, newServer(t))
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	code, out, errOut := idemctl("--jar", dsn+sep+"pool_max_conns=2", "list")
	if code != 0 || !strings.Contains(out, "charge:reconcile") {
		t.Fatalf("list with pool_max_conns: exit %d, stdout %q, stderr %q; want the jar listed", code, out, errOut)
	}
}

// TestPostgresJarInASchema: a jar in a schema of its own, whose name needs
// quoting, is operated with the schema as the URL's search_path. A
// search_path that names no schema that exists is refused with a message
// that says so and names the database, its password masked; before,
// idemctl printed pgjar's error without the database, and then said the
// database held no jar but for its table of versions.
func TestPostgresJarInASchema(t *testing.T) {
	dsn := pgtest.DB(t)
	schema := `Idem "x"`
	if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// As libpq, pgx reads a + in the URL's query as itself, not a space.
	inSchema := dsn + "&search_path=" + strings.ReplaceAll(url.QueryEscape(pgx.Identifier{schema}.Sanitize()), "+", "%20")
	j, err := pgjar.Open(t.Context(), inSchema, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, newServer(t), j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemctl("--jar", inSchema, "list")
	if code != 0 || !strings.Contains(out, "charge:reconcile") {
		t.Fatalf("list: exit %d, stdout %q, stderr %q; want the jar listed", code, out, errOut)
	}

	code, _, errOut = idemctl("--jar", withPassword(t, dsn)+"&search_path=nowhere", "list")
	wantError(t, code, errOut, 1, `postgres://postgres:xxxxx@`)
	if want := `: search_path "nowhere" names no schema that exists, or none that this role may use;`; !strings.Contains(errOut, want) ||
		strings.Contains(errOut, "hunter2") || strings.Contains(errOut, "pgjar:") {
		t.Errorf("stderr %q; want idemctl's own words with %q, the password masked", errOut, want)
	}
}

// A key=value connection string is refused with a message that asks for
// the URL and does not print the string, which may hold a password.
// So is a misspelt URL, which would otherwise be taken for a file name.
func TestKeywordValueJar(t *testing.T) {
	for _, jar := range []string{
		"host=127.0.0.1 port=1 dbname=jar user=ops password=hunter2",
		"postgres:/ops:hunter2@127.0.0.1/jar",
		"POSTGRES://ops:hunter2@127.0.0.1/jar",
	} {
		code, _, errOut := idemctl("--jar", jar, "list")
		wantError(t, code, errOut, 2, "postgres://")
		if strings.Contains(errOut, "hunter2") {
			t.Fatalf("stderr %q shows the password", errOut)
		}
	}
}

// TestPostgresDamagedSchema: a jar whose database lost an index, or the
// record of its schema's version, is refused at open with pgjar.ErrSchema.
// idemctl says the schema is damaged, names what is missing, where, and
// what to do, instead of printing pgjar's error as it is, or saying that
// the database holds no jar.
func TestPostgresDamagedSchema(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		// An index alone: no key is lost, and a restore from a backup
		// would lose those written since.
		{`DROP INDEX idem_operations_by_state`, `the key jar's schema lacks an index, nothing written (in schema "public", no idem_operations_by_state ` +
			`(only an index is missing, no row is lost: create it again, as the owner: CREATE INDEX idem_operations_by_state ON "public".idem_operations (state, updated)))`},
		{`DROP TABLE idem_operations_schema`, `the key jar's schema is damaged (in schema "public", no idem_operations_schema, but the database holds idem_operations, `},
	} {
		dsn := seedPostgres(t, newServer(t))
		if _, err := pgtest.Connect(t, dsn).Exec(t.Context(), c.sql); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := idemctl("--jar", withPassword(t, dsn), "list")
		wantError(t, code, errOut, 1, c.want)
		restore := strings.Contains(c.want, "damaged")
		for _, want := range []string{"keys may be lost", "restore", "from a backup"} {
			if strings.Contains(errOut, want) != restore {
				t.Errorf("after %s: stderr %q; want it to say %q: %v", c.sql, errOut, want, restore)
			}
		}
		if strings.Contains(errOut, "hunter2") || strings.Contains(errOut, pgjar.ErrSchema.Error()) {
			t.Errorf("after %s: stderr %q; want the password masked and idemctl's own words", c.sql, errOut)
		}
	}
}

// TestPostgresRoleThatMayOnlyRead: idemctl opens a jar with MustExist,
// which needs SELECT alone, so a role that may only read the jar lists
// it; a command that writes is refused by the server, and the line says
// what the writing commands need, granted to whom, and (prune) that no
// batch was deleted, where it said perhaps one was.
func TestPostgresRoleThatMayOnlyRead(t *testing.T) {
	reader := pgtest.AppRole(t, seedPostgres(t, newServer(t)), `GRANT SELECT ON ALL TABLES IN SCHEMA public`)
	if code, out, errOut := idemctl("--jar", reader, "list"); code != 0 || !strings.Contains(out, "charge:done") {
		t.Fatalf("list as a role that may read the jar: exit %d, stdout %q, stderr %q; want it listed", code, out, errOut)
	}
	const grant = "resume, abandon, forget and prune write it too: they need SELECT, INSERT, UPDATE and DELETE on its table, granted to the URL's user"
	for _, args := range [][]string{{"prune", "--older-than", "1d"}, {"abandon", "charge:reconcile", "--reason", "x"}} {
		code, _, errOut := idemctl(append([]string{"--jar", reader}, args...)...)
		wantError(t, code, errOut, 1, "permission denied for table idem_operations (SQLSTATE 42501)")
		if !strings.Contains(errOut, grant) || strings.Contains(errOut, "perhaps") {
			t.Errorf("%s: stderr %q; want it to say %q, and no perhaps", args[0], errOut, grant)
		}
	}
	if r, err := jarState(t, reader, "charge:reconcile"); err != nil || r.State != "reconcile" {
		t.Fatalf("after the refused abandon: %s, %v; want it still to reconcile", r.State, err)
	}
}

// TestPostgresRoleThatMayNotRead: a role without SELECT on the table of
// versions is refused at open, and the line names the database it was
// refused on, as every other refusal at open does, and what to grant.
func TestPostgresRoleThatMayNotRead(t *testing.T) {
	role := pgtest.AppRole(t, seedPostgres(t, newServer(t)))
	code, _, errOut := idemctl("--jar", role, "list")
	wantError(t, code, errOut, 1, `GRANT SELECT ON "public"."idem_operations_schema"`)
	if !strings.HasPrefix(errOut, "idemctl: "+role+": ") {
		t.Errorf("stderr %q; want it to begin with the database, %q", errOut, role)
	}
}

// TestPostgresJarOfAnOlderVersion: a PostgreSQL jar of schema version 1,
// which idemctl does not upgrade, is said to be a jar of an older schema
// version, with the version it records, not a database without a jar; and
// nothing is changed.
func TestPostgresJarOfAnOlderVersion(t *testing.T) {
	jar := seedPostgres(t, newServer(t))
	conn := pgtest.Connect(t, jar)
	// Version 1 is version 2 without its index.
	if _, err := conn.Exec(t.Context(), `DROP INDEX idem_operations_by_state_created;
		DELETE FROM idem_operations_schema WHERE version = 2`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list"}, {"show", "charge:p1"}, {"abandon", "charge:p1", "--reason", "no charge"}} {
		code, _, errOut := idemctl(append([]string{"--jar", jar}, args...)...)
		wantError(t, code, errOut, 1, `holds a key jar of an older schema version in schema "public" (idem_operations_schema records version 1, not 2), which idemctl does not upgrade`)
		if strings.Contains(errOut, "no key jar") || !strings.Contains(errOut, "the idemctl of that version") {
			t.Errorf("%s of a version 1 jar: %q; want it said a jar of an older version, and what to do", args[0], errOut)
		}
	}
	var versions string
	if err := conn.QueryRow(t.Context(), `SELECT string_agg(version::text, ',' ORDER BY version) FROM idem_operations_schema`).Scan(&versions); err != nil || versions != "1" {
		t.Errorf("the jar's versions after idemctl: %q (%v); want 1", versions, err)
	}
}

// TestSearchPathDroppedByPooler: through a pooler that drops the URL's
// search_path (PgBouncer with search_path among its
// ignore_startup_parameters), idemctl says so and what to do, and does not
// call the jar damaged nor say to restore it from a backup, which would
// lose the keys written since. Before, it said the jar's schema was
// damaged.
func TestSearchPathDroppedByPooler(t *testing.T) {
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	if _, err := admin.Exec(t.Context(), `CREATE SCHEMA jobs`); err != nil {
		t.Fatal(err)
	}
	j, err := pgjar.Open(t.Context(), dsn+"&search_path=jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idemctl("--jar", pgtest.Dropping(t, dsn+"&search_path=jobs", "search_path"), "list")
	wantError(t, code, errOut, 1, "the connection string sets search_path 'jobs', but the session runs with search_path")
	if strings.Contains(errOut, "damaged") || strings.Contains(errOut, "backup") || !strings.Contains(errOut, "ALTER ROLE") {
		t.Errorf("stderr %q; want what to do (ALTER ROLE), not a damaged jar to restore", errOut)
	}
}

// TestSettingsDroppedByPooler: through a pooler that drops the startup
// parameters pgjar sets, onto a role whose synchronous_commit is off,
// idemctl names the database and says what to do, as for every refusal
// at open. Before, it did not name the database.
func TestSettingsDroppedByPooler(t *testing.T) {
	dsn := pgtest.DB(t)
	admin := pgtest.Connect(t, dsn)
	var db string
	if err := admin.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(t.Context(), `ALTER ROLE CURRENT_USER IN DATABASE `+pgx.Identifier{db}.Sanitize()+` SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	j, err := pgjar.Open(t.Context(), dsn, nil) // straight to the server: the DSN's settings win
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	jar := pgtest.Dropping(t, dsn, "default_transaction_isolation", "synchronous_commit", "statement_timeout")
	code, _, errOut := idemctl("--jar", jar, "list")
	wantError(t, code, errOut, 1, `synchronous_commit is "off"`)
	if !strings.HasPrefix(errOut, "idemctl: "+jar+": ") || !strings.Contains(errOut, "ALTER ROLE") {
		t.Errorf("stderr %q; want it to begin with the database and say what to do (ALTER ROLE)", errOut)
	}
}
