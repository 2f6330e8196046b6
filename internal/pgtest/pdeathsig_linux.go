package pgtest

import "syscall"

// setPdeathsig has the server get SIGQUIT, PostgreSQL's immediate
// shutdown, when the thread that started it exits (see startServer).
func setPdeathsig(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGQUIT }
