//go:build unix

package stopsig_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/stopsig"
)

// asCommand, set in its environment, makes the test binary a command that
// stops as stopsig makes it (command); its value says what it does once
// stopped: "exit" with status 0, or "wait" for another signal.
const asCommand = "STOPSIG_TEST_AS_COMMAND"

// bound is the longest the test waits for the command: a step that takes
// longer is a failure.
const bound = 30 * time.Second

func TestMain(m *testing.M) {
	if then := os.Getenv(asCommand); then != "" {
		command(then)
	}
	os.Exit(m.Run())
}

// command says it is ready, waits until its context is cancelled and says
// by which signal; then it exits 0, or waits for another signal, as a
// command stopping cleanly.
func command(then string) {
	ctx, cancel := context.WithCancel(context.Background())
	st := stopsig.Notify(cancel)
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("stopped by", st.Signal())
	if then == "wait" {
		select {}
	}
	os.Exit(0)
}

// child is the command, started; lines has what it prints, line by line.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

// start starts the command, after prefix when there is one (nohup), and
// waits until it is ready; then is what it does once stopped.
func start(t *testing.T, then string, prefix ...string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	name, args := self, []string(nil)
	if len(prefix) > 0 {
		name, args = prefix[0], append(prefix[1:], self)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	cmd := exec.CommandContext(ctx, name, args...) // killed when the test ends
	cmd.Env = append(os.Environ(), asCommand+"="+then)
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	c := &child{cmd: cmd, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	c.want(t, "ready")
	return c
}

// want fails the test unless the command's next line is line.
func (c *child) want(t *testing.T, line string) {
	t.Helper()
	select {
	case got := <-c.lines:
		if got != line {
			t.Fatalf("the command printed %q; want %q", got, line)
		}
	case <-time.After(bound):
		t.Fatalf("the command did not print %q within %v", line, bound)
	}
}

func (c *child) signal(t *testing.T, s os.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// TestFirstSignalStopsSecondEnds: the first SIGINT, SIGTERM or SIGHUP
// cancels the command's context, Signal says which, and the command goes
// on to stop cleanly; a second one ends the process at once, by that
// signal (a SIGINT ignored when the process started: with status 130).
func TestFirstSignalStopsSecondEnds(t *testing.T) {
	for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(s.String(), func(t *testing.T) {
			c := start(t, "wait")
			c.signal(t, s)
			c.want(t, "stopped by "+s.String())
			c.signal(t, s)
			err := c.cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("the command ended with %v after a second %v; want it ended by that signal", err, s)
			}
			ws := ee.Sys().(syscall.WaitStatus)
			if s == syscall.SIGINT && signal.Ignored(os.Interrupt) {
				// Started ignored, as this process was: Exit cannot die by it.
				if ws.Signaled() || ws.ExitStatus() != 130 {
					t.Fatalf("the command ended with %v after a second SIGINT, ignored at its start; want exit status 130", err)
				}
				return
			}
			if !ws.Signaled() || ws.Signal() != s {
				t.Fatalf("the command ended with %v after a second %v; want it ended by that signal", err, s)
			}
		})
	}
}

// TestHangUpIgnoredUnderNohup: a command started with SIGHUP ignored
// (nohup) keeps ignoring it, and stops on the SIGTERM that follows.
func TestHangUpIgnoredUnderNohup(t *testing.T) {
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Skip("no nohup command to start the command with SIGHUP ignored")
	}
	c := start(t, "exit", nohup)
	// The kernel drops a signal that its receiver ignores when it is sent:
	// SIGHUP is gone when Signal returns, and the next line is SIGTERM's.
	c.signal(t, syscall.SIGHUP)
	c.signal(t, syscall.SIGTERM)
	c.want(t, "stopped by "+syscall.SIGTERM.String())
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("the command ended with %v; want exit status 0, a clean stop", err)
	}
}
