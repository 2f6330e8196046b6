//go:build unix

package idem

import (
	"errors"
	"syscall"
)

// processGone reports whether no process with pid exists, or only its
// zombie: signal 0 checks existence without sending anything.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) || zombie(pid)
}
