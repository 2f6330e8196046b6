package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	d := Duration(fs, "wait", time.Minute, "how long")
	if *d != time.Minute {
		t.Fatalf("default %v; want 1m", *d)
	}
	if err := fs.Parse([]string{"-wait", "90s"}); err != nil || *d != 90*time.Second {
		t.Fatalf("-wait 90s: %v, %v; want 1m30s", *d, err)
	}
	// The value is quoted once, by the flag package, as %q quotes it.
	for bad, want := range map[string]string{"5": "missing unit in duration", "5 s": "unknown unit in duration", "-": "invalid duration",
		"1x": "unknown unit in duration", "1\"x\\": "unknown unit in duration", "1\xff": "unknown unit in duration"} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		Duration(fs, "wait", time.Minute, "how long")
		err := fs.Parse([]string{"-wait", bad})
		if want := fmt.Sprintf("invalid value %q for flag -wait: %s", bad, want); err == nil || err.Error() != want {
			t.Errorf("-wait %q: %v; want %s", bad, err, want)
		}
	}
	if got := fs.Lookup("wait").DefValue; got != "1m0s" {
		t.Errorf("DefValue %q; want 1m0s, as flag.Duration prints it", got)
	}
}

func TestUsageError(t *testing.T) {
	err := fmt.Errorf("run: %w", Usagef("-n %d: %w", 0, io.EOF))
	var ue *UsageError
	if !errors.As(err, &ue) || ue.Printed || ue.Error() != "-n 0: EOF" || !errors.Is(err, io.EOF) {
		t.Fatalf("Usagef: %v; want a *UsageError saying -n 0: EOF, not printed, that wraps io.EOF", err)
	}
}
