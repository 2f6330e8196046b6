package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
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
	for _, bad := range []string{"5", "5 s", "-", "1x"} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		Duration(fs, "wait", time.Minute, "how long")
		err := fs.Parse([]string{"-wait", bad})
		if err == nil || strings.Contains(err.Error(), "parse error") || !strings.Contains(err.Error(), "duration") || strings.Contains(err.Error(), "time:") {
			t.Errorf("-wait %q: %v; want the reason, such as a missing unit", bad, err)
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
