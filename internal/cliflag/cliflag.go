// Package cliflag holds what the commands share to read their command
// line: the flag.Value types, and UsageError, the error of a mistake in it.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// UsageError is a mistake in the command line: a command exits with
// status 2 on it, as the flag package's ExitOnError does, and with 1 on
// any other error: Exit does both, or a command prints it its own way.
type UsageError struct {
	Err     error
	Printed bool // the flag package printed Err already, with the usage
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError of fmt.Errorf(format, a...).
func Usagef(format string, a ...any) error { return &UsageError{Err: fmt.Errorf(format, a...)} }

// Exit ends a command whose run returned err, neither nil nor
// flag.ErrHelp: it prints "name: err" to stderr, unless the flag package
// printed err already, and exits with status 2 for a *UsageError and 1
// for any other error, as the go tools do.
func Exit(name string, err error) {
	var ue *UsageError
	usage := errors.As(err, &ue)
	if !usage || !ue.Printed {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	if usage {
		os.Exit(2)
	}
	os.Exit(1)
}

// DurationVar defines a time.Duration flag, as flag.FlagSet.DurationVar
// does, whose bad value is refused with the reason: `invalid value "5" for
// flag -lock-timeout: missing unit in duration`, where the flag package
// says only "parse error". The reason does not quote the value again: the
// flag package's %q is the one quoting of it that dsn.Scrub finds, to
// mask a database's password given to the flag by mistake. flag.PrintDefaults calls its value
// "value" unless the usage names it in back quotes, "a `duration`".
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*duration)(p), name, usage)
}

// Duration is DurationVar returning the variable, as flag.FlagSet.Duration.
func Duration(fs *flag.FlagSet, name string, value time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	DurationVar(fs, p, name, value, usage)
	return p
}

type duration time.Duration

// timeQuoted is a string quoted by the time package in its error, with the
// space before it.
var timeQuoted = regexp.MustCompile(` "(?:[^"\\]|\\.)*"`)

func (d *duration) String() string { return (*time.Duration)(d).String() }

func (d *duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		// "time: missing unit in duration "5"": the package prefix says
		// nothing to someone typing a flag, and the value is quoted by
		// the flag package already; the time package's own quoting
		// escapes other bytes.
		return errors.New(timeQuoted.ReplaceAllString(strings.TrimPrefix(err.Error(), "time: "), ""))
	}
	*d = duration(v)
	return nil
}

// Get implements flag.Getter.
func (d *duration) Get() any { return time.Duration(*d) }
