package idem

import (
	"os"
	"strconv"
	"strings"
)

// zombie reports whether pid is a process that has exited but that its
// parent has not yet waited for: signal 0 still finds it, yet it runs no
// code and holds no file, so it cannot be sending anything. A supervisor
// that kills a program and runs idemctl resume before it reaps the child
// meets one. It is a zombie when every thread of it is (a main thread
// that exited while others run reads Z too, and is alive), and only when
// /proc is this process's PID namespace's: in another's, the same number
// names another process.
func zombie(pid int) bool {
	if self, err := os.Readlink("/proc/self"); err != nil || self != strconv.Itoa(os.Getpid()) {
		return false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			return false
		}
		// "tid (comm) S …": comm may hold spaces and parentheses; the
		// state follows the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'Z' && stat[i+2] != 'X') {
			return false
		}
	}
	return true
}
