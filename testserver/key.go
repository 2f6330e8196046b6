package testserver

import (
	"errors"
	"fmt"

	"github.com/idemkit/idem/internal/keyhdr"
)

// MaxKeyLen is the longest Idempotency-Key ParseKey accepts, in characters.
const MaxKeyLen = keyhdr.MaxLen

// ErrInvalidKey is matched (errors.Is) by every error ParseKey returns.
var ErrInvalidKey = errors.New("testserver: invalid Idempotency-Key")

// KeyError is the error ParseKey returns: the header value and why it was
// refused. It matches ErrInvalidKey.
type KeyError struct {
	Value  string // the header value as received
	Reason string // what is wrong with it, for a person to act on
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("testserver: invalid Idempotency-Key %q: %s", e.Value, e.Reason)
}

// Unwrap returns ErrInvalidKey.
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// ParseKey validates one Idempotency-Key header value and returns the key.
//
// Two forms are accepted. The IETF draft's Structured Field string form,
// "abc" in double quotes, where \" and \\ are the only escapes; and the
// bare form, abc, taken as it is (a value that starts with a double quote is
// always read as the quoted form). The key itself must be 1 to MaxKeyLen
// printable ASCII characters (0x20 to 0x7E) and must not begin or end with a
// space, which HTTP would strip. A bare key must not hold a comma: a proxy
// may join two header lines into one with a comma between them (RFC 9110
// §5.3), so "a, b" is read as two keys; a key with a comma is sent quoted.
// Every error is a *KeyError.
//
// idem.Transport refuses a caller's key that ParseKey would refuse before
// anything is stored or sent.
func ParseKey(v string) (string, error) {
	key, err := keyhdr.Parse(v)
	if err != nil {
		return "", &KeyError{Value: v, Reason: err.Error()}
	}
	return key, nil
}
