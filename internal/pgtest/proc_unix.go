//go:build unix

package pgtest

import "syscall"

// credential is who the cluster's programs run as, when this process runs
// as root.
type credential = syscall.Credential

func procAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

// serverProcAttr gives the server its own process group, which keeps a
// terminal's ^C away from it, and, where the system can, SIGQUIT when this
// process dies without stopping it.
func serverProcAttr(a *syscall.SysProcAttr) {
	a.Setpgid = true
	setPdeathsig(a)
}

func kill(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }

// stop and resume stop the process pid and let it run again.
func stop(pid int) error   { return syscall.Kill(pid, syscall.SIGSTOP) }
func resume(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }
