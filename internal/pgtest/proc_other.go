//go:build !unix

package pgtest

import (
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
