package errprefix_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/idemkit/idem/internal/errprefix"
)

func TestWrapf(t *testing.T) {
	errClosed := errors.New("keyjar: jar is closed")
	for _, c := range []struct {
		err  error
		want string
	}{
		{errClosed, `keyjar: begin "op": jar is closed`},
		{fs.ErrNotExist, `keyjar: begin "op": file does not exist`},
		{errors.New("pgjar: not ours"), `keyjar: begin "op": pgjar: not ours`},
	} {
		err := errprefix.Wrapf("keyjar", c.err, "begin %q", "op")
		if err.Error() != c.want || !errors.Is(err, c.err) {
			t.Errorf("Wrapf(%q) = %q, Is %v; want %q, matching it", c.err, err, errors.Is(err, c.err), c.want)
		}
	}
}
