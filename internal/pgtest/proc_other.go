//go:build !unix

package pgtest

import (
	"errors"
	"os"
	"syscall"
)

// The package builds here so that the tests that use it build, and skip:
// the PostgreSQL binaries it looks for are Debian's.

type credential struct{ Uid, Gid uint32 }

func procAttr(*credential) *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

func serverProcAttr(*syscall.SysProcAttr) {}

// kill ends the process pid, whatever sig: no other signal can be sent.
func kill(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// stop and resume are not supported: no signal but a kill can be sent.
func stop(int) error   { return errors.ErrUnsupported }
func resume(int) error { return errors.ErrUnsupported }
