//go:build unix

package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestCommandStopsOnSignal runs the command as a process (the test binary
// as the lab, roleCommand) and signals it once it has started its first
// row: it stops that row (its server and proxy
// closed, its temporary directory removed) and ends by the signal, as
// idemserver's second signal does, so that a shell reports 130 for
// SIGINT. Started with SIGINT ignored, as a non-interactive shell starts a
// background job, it cannot die by SIGINT and exits with status 130. A
// terminal's Ctrl-C signals the whole process group, the client processes
// of idem + client restarts with the lab, and may reach a client process
// first: the client process goes on, and the lab stops the same way.
func TestCommandStopsOnSignal(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		ignoreINT  bool // started with SIGINT ignored
		group      bool // the restarts row, its process group signalled once a client process went on past the signal
		sig        syscall.Signal
		wantSignal syscall.Signal // the signal that ends the process, or 0
		wantCode   int            // its exit status, when no signal ends it
	}{
		{"SIGINT", false, false, syscall.SIGINT, syscall.SIGINT, 0},
		{"SIGTERM", false, false, syscall.SIGTERM, syscall.SIGTERM, 0},
		{"SIGINT, SIGINT ignored at start", true, false, syscall.SIGINT, 0, 130},
		{"SIGINT to the process group", false, true, syscall.SIGINT, syscall.SIGINT, 0},
		{"SIGTERM to the process group", false, true, syscall.SIGTERM, syscall.SIGTERM, 0},
		// A terminal closed: SIGHUP to the process group.
		{"SIGHUP", false, false, syscall.SIGHUP, syscall.SIGHUP, 0},
		{"SIGHUP to the process group", false, true, syscall.SIGHUP, syscall.SIGHUP, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			// Orders enough that the row is still running when the
			// signal comes.
			args := []string{"-rows", rowIdem, "-n", "99999"}
			if tc.group {
				args[1] = rowRestarts
			}
			cmd := exec.Command(bin, args...)
			if tc.ignoreINT {
				// The shell ignores SIGINT, and the lab it becomes (exec)
				// inherits the ignore.
				cmd = exec.Command("sh", append([]string{"-c", `trap '' INT; exec "$0" "$@"`, bin}, args...)...)
			}
			cmd.Env = append(os.Environ(), childEnv+"="+roleCommand, "TMPDIR="+tmp)
			var running *os.File // a line once a client process went on past the signal (see signalOnFirstLine)
			if tc.group {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				// File descriptor 3 of the lab, and of the client processes
				// it starts, which inherit it: at its end, once they all
				// ended, the read below ends too.
				running = r
				defer r.Close()
				defer w.Close()
				cmd.ExtraFiles = []*os.File{w}
				cmd.Env = append(cmd.Env, clientSignalEnv+"="+strconv.Itoa(int(tc.sig)))
				// A group of its own, as a shell gives a job: the signal
				// reaches the lab and its client processes, not go test.
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			}
			var out bytes.Buffer
			cmd.Stdout = &out
			stderr, err := cmd.StderrPipe()
			if err == nil {
				err = cmd.Start()
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill() // when the test fails before it ends
			errs := bufio.NewReader(stderr)
			want := "lab [1/1] " + args[1] + ": starting\n"
			if line, err := errs.ReadString('\n'); err != nil || line != want {
				t.Fatalf("first line of stderr: %q, %v; want %q", line, err, want)
			}
			signal := cmd.Process.Signal
			if tc.group {
				defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the client processes too
				cmd.ExtraFiles[0].Close()                             // the test's copy: the lab's and its client processes' hold the pipe
				if _, err := bufio.NewReader(running).ReadString('\n'); err != nil {
					rest, _ := io.ReadAll(errs)
					cmd.Wait()
					t.Fatalf("a client process sent %v did not go on: the lab ended, %v, stderr %q", tc.sig, cmd.ProcessState, rest)
				}
				signal = func(s os.Signal) error { return syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal)) }
			}
			if err := signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			rest, _ := io.ReadAll(errs)
			cmd.Wait()
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case !ok:
				t.Fatalf("after %v: %v; want a wait status", tc.sig, cmd.ProcessState)
			case tc.wantSignal != 0 && (!ws.Signaled() || ws.Signal() != tc.wantSignal):
				t.Fatalf("after %v: %v, stderr %q; want killed by %v", tc.sig, cmd.ProcessState, rest, tc.wantSignal)
			case tc.wantSignal == 0 && (!ws.Exited() || ws.ExitStatus() != tc.wantCode):
				t.Fatalf("after %v: %v, stderr %q; want exit status %d", tc.sig, cmd.ProcessState, rest, tc.wantCode)
			}
			// A stop asked for is no error to report; the table of a row
			// cut off would be wrong.
			if len(rest) > 0 || out.Len() > 0 {
				t.Errorf("after %v: stdout %q, stderr %q after the first line; want nothing", tc.sig, out.String(), rest)
			}
			if left, err := os.ReadDir(tmp); err != nil || len(left) > 0 {
				t.Errorf("after %v: %v left in TMPDIR (%v); want the row's temporary directory removed", tc.sig, left, err)
			}
		})
	}
}

// TestClientsEndWithTheLab runs the command on idem + client restarts and
// kills the lab with SIGKILL once a client process runs: as a second
// signal ends it, or a crash. Its client processes end too, soon, though
// no write to the lab's pipe ends them (they ignore SIGPIPE here, as one
// that waits has nothing to write): every process that inherited file
// descriptor 3 from the lab closed it.
func TestClientsEndWithTheLab(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// Orders enough that the row is still running when the lab dies.
	cmd := exec.Command(bin, "-rows", rowRestarts, "-n", "99999")
	cmd.Env = append(os.Environ(), childEnv+"="+roleCommand, clientOrphanEnv+"=1", "TMPDIR="+t.TempDir())
	// File descriptor 3 of the lab and of the client processes it starts,
	// which inherit it: once they all ended, the read below gets EOF.
	cmd.ExtraFiles = []*os.File{w}
	// A group of its own, as a shell gives a job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second // for a client process that held the lab's stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	defer syscall.Kill(-pgid, syscall.SIGKILL) // what is left when the test fails
	w.Close()                                  // the test's copy
	running := bufio.NewReader(r)
	if _, err := running.ReadString('\n'); err != nil {
		cmd.Wait()
		t.Fatalf("no client process ran: the lab ended, %v, stderr %q", cmd.ProcessState, stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	const within = 10 * time.Second
	if err := r.SetReadDeadline(time.Now().Add(within)); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(running); err != nil { // nil at EOF
		t.Fatalf("client processes still running %v after their lab was killed (%v, %q read)", within, err, rest)
	}
}
