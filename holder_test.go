package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// A restart after kill -9 does not wait out the dead process's lease; a
// live holder's lease is waited out.
func TestLeaseOfDeadProcessIsTakenOver(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("process liveness is not checked on windows: leases are waited out")
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := child.ProcessState.Pid()
	zombiePID := zombieChild(t)
	host := idem.HolderHost()
	name, _, _ := strings.Cut(host, "#")
	// The host part as it reads on every machine with this host name whose
	// process runs in a PID namespace of the same inode: the initial one's
	// is a constant of the kernel (skipped where there is no namespace).
	var nameNS string
	if link, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		nameNS = name + "#" + strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
	}

	for _, tt := range []struct {
		name   string
		holder string
		sent   bool
	}{
		{"dead process on this host", fmt.Sprintf("%s/%d/x", host, deadPID), true},
		// Killed, and not yet waited for by its parent (Linux only): it
		// runs no more, though signal 0 still finds it.
		{"zombie process on this host", map[bool]string{true: fmt.Sprintf("%s/%d/x", host, zombiePID)}[zombiePID != 0], true},
		{"this process, another call", fmt.Sprintf("%s/%d/x", host, os.Getpid()), false},
		{"another host", fmt.Sprintf("elsewhere/%d/x", deadPID), false},
		{"this host name, another PID namespace", fmt.Sprintf("%s#1/%d/x", name, deadPID), false},
		// A holder without a namespace, on a host whose ids have one: a
		// process of another PID namespace, or of an older version, whose
		// pid means nothing here (skipped where ids have no namespace).
		{"this host name, no PID namespace", map[bool]string{true: fmt.Sprintf("%s/%d/x", name, deadPID)}[name != host], false},
		// Another machine with this host name, whose process runs in the
		// initial PID namespace as this one may: its pids are not ours.
		{"this host name and PID namespace inode, another machine", map[bool]string{true: fmt.Sprintf("%s/%d/x", nameNS, deadPID)}[nameNS != ""], false},
		{"unknown format", "worker-7", false},
		// Not a pid as a Transport writes one, though the kernel, which
		// reads 32 bits of it, would check the dead process's.
		{"pid beyond 32 bits", fmt.Sprintf("%s/%d/x", host, int64(deadPID)+1<<32), false},
		{"pid with a sign", fmt.Sprintf("%s/+%d/x", host, deadPID), false},
	} {
		if tt.holder == "" {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			tr, rec, jar := newTransport(t, status(201))
			tr.Policy.MaxElapsed = time.Millisecond // no time to wait out a lease
			ctx := idem.WithOperation(context.Background(), "op")
			now := time.Now()
			if _, _, err := jar.Begin(ctx, idem.Record{Op: "op", Key: "k1", Fingerprint: fingerprintOf(t, `{}`), Header: jsonHeader(), State: idem.StatePending,
				Created: now, Updated: now, Attempts: 1, LastStatus: 503, Holder: tt.holder, LeaseUntil: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			_, err := post(t, ctx, tr, `{}`)
			if tt.sent {
				if err != nil || rec.attempts() != 1 || rec.keys[0] != "k1" {
					t.Fatalf("got %v after %d sends; want the dead holder's lease taken and k1 sent at once", err, rec.attempts())
				}
				if r, _ := jar.Get(ctx, "op"); r.State != idem.StateDone || r.Attempts != 2 {
					t.Fatalf("record %+v; want done after 2 attempts", r)
				}
				return
			}
			if !errors.Is(err, idem.ErrLeased) || rec.attempts() != 0 {
				t.Fatalf("got %v after %d sends; want ErrLeased and nothing sent", err, rec.attempts())
			}
		})
	}
}
