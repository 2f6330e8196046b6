//go:build unix && !linux

package pgtest

import "syscall"

// setPdeathsig does nothing here: a server whose test process died
// without stopping it runs on until it is stopped by hand.
func setPdeathsig(*syscall.SysProcAttr) {}
