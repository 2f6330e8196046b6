// Package stopsig stops a command on SIGINT, SIGTERM or SIGHUP, as
// idemserver and the lab stop: the first signal cancels the command's
// context, for a clean stop; a second one ends the process at once, by that
// signal. SIGHUP, which a closed terminal and some supervisors send, would
// otherwise end the process at once, cutting off what it was doing; a
// process started with SIGHUP ignored (nohup) keeps ignoring it.
package stopsig

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Stop is a command's stop on SIGINT, SIGTERM or SIGHUP.
type Stop struct {
	// intIgnored: the process was started with SIGINT ignored (a
	// background job of a non-interactive shell), and cannot die by it.
	intIgnored bool

	mu    sync.Mutex
	first os.Signal
}

// Notify calls cancel on the first SIGINT, SIGTERM or SIGHUP, and makes a
// second one end the process at once, by Exit.
func Notify(cancel context.CancelFunc) *Stop {
	// A process started with SIGINT ignored gets it once Notify asks for
	// it, and would ignore it again once Notify no longer does. Read
	// before Notify.
	st := &Stop{intIgnored: signal.Ignored(os.Interrupt)}
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		// Notify would undo nohup's ignore.
		sigs = append(sigs, syscall.SIGHUP)
	}
	c := make(chan os.Signal, 2)
	signal.Notify(c, sigs...)
	go func() {
		s := <-c
		// The default behaviour of the signals is back before the command
		// sees the first, so that a second one ends the process by that
		// signal, whatever it is doing; but for a SIGINT ignored at start,
		// which Reset would ignore again: c keeps it.
		signal.Reset(sigs[1:]...) // SIGTERM, and SIGHUP unless ignored at start
		if !st.intIgnored {
			signal.Reset(os.Interrupt)
		}
		st.mu.Lock()
		st.first = s
		st.mu.Unlock()
		cancel()
		// A SIGINT ignored at start, or a signal that came before the
		// Reset.
		st.Exit(<-c)
	}()
	return st
}

// Signal returns the first SIGINT, SIGTERM or SIGHUP, nil before one came.
func (st *Stop) Signal() os.Signal {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.first
}

// Exit ends the process by s, raised again; or, when it cannot (a SIGINT
// the process was started ignoring), with the status a shell gives a
// process ended by s: 128 and its number, 130 for SIGINT.
func (st *Stop) Exit(s os.Signal) {
	if s != os.Interrupt || !st.intIgnored {
		if p, err := os.FindProcess(os.Getpid()); err == nil && p.Signal(s) == nil {
			// The kernel hands a signal sent to the process to one of its
			// threads, not always this one: an os.Exit at once could end
			// the process before that thread dies by the signal. It takes
			// microseconds; the exit below is for a signal that did not.
			time.Sleep(time.Second)
		}
	}
	n, _ := s.(syscall.Signal)
	os.Exit(128 + int(n))
}
