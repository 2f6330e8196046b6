package client_test

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
)

// A resume that finds the operation settled by another run sharing the jar
// (a *client.StateError: done, failed or abandoned, nothing sent) is not an
// order left uncharged: the example's report must not say "not charged".
func TestReportSettledByAnotherRun(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	report("charge:order-1", nil, "", &client.StateError{Op: "charge:order-1", State: idem.StateDone})
	os.Stdout = stdout
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(string(out))
	if strings.Contains(got, "not charged") || !strings.Contains(got, "another run") || !strings.Contains(got, "done") {
		t.Errorf("report printed %q; want it to say another run settled it (done), not that it was not charged", got)
	}
}
