package idem_test

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"unsafe"
)

// zombieChild returns the pid of a child process killed and not yet
// waited for: a zombie until the test ends, when it is reaped.
func zombieChild(t *testing.T) int {
	child := exec.Command(os.Args[0], "-test.run=^$")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pid := child.Process.Pid
	t.Cleanup(func() { child.Wait() })
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Block until it has exited, and leave it unreaped: waitid with
	// WNOWAIT, which os/exec does not offer.
	const pPID, wNoWait = 1, 0x01000000
	var info [128]byte // a siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNoWait, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			t.Fatal(errno)
		}
		return pid
	}
}
