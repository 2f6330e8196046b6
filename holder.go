package idem

import (
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A lease holder id is "host/pid/random.n": unique per call, and telling
// which process on which host holds the lease. When that process is gone
// (killed, crashed), a restart on the same host need not wait for the
// lease to expire: the holder cannot be sending any more. The random part
// is drawn once per process (a pid is reused, a process id is not) and n
// counts the calls, so a call costs no random draw for its holder.
//
// On Linux host is the host name, "#", the inode of the process's PID
// namespace, "@" and the kernel's boot id: containers that share a host
// name (and a jar file) but not their pids are different hosts, whose
// holders are waited out. The inode alone does not tell machines apart
// (the initial namespace's is the same on every one); the boot id, drawn
// at random by each kernel at boot, does.

var processPrefix = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	host = strings.ReplaceAll(host, "/", "_")
	if ns := pidNamespace(); ns != "" {
		host += "#" + ns
		if boot := bootID(); boot != "" {
			host += "@" + boot
		}
	}
	return host + "/" + strconv.Itoa(os.Getpid())
})

// pidNamespace returns the inode of this process's PID namespace, as
// /proc/self/ns/pid links to it ("pid:[4026531836]"), or "" where there is
// no such link.
func pidNamespace() string {
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	ns, ok := strings.CutPrefix(link, "pid:[")
	if !ok {
		return ""
	}
	ns, ok = strings.CutSuffix(ns, "]")
	if !ok || ns == "" || strings.ContainsAny(ns, "/#") {
		return ""
	}
	return ns
}

// bootID returns the random id that Linux draws at each boot, or "" where
// there is none.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	id := strings.TrimSpace(string(b))
	if strings.ContainsAny(id, "/#@") {
		return ""
	}
	return id
}

var (
	holderPrefix = sync.OnceValues(func() (string, error) {
		id, _, err := newKey(time.Now())
		return processPrefix() + "/" + id + ".", err
	})
	holderCount atomic.Uint64
)

// NewHolder returns a new lease holder id for Jar.Acquire, as the
// Transport takes each call's: one that HolderGone recognises once this
// process is gone, so that a restart on this host takes over a lease the
// process left rather than wait it out. Code that takes a lease itself
// (client.Abandon does) should use it.
func NewHolder() (string, error) {
	prefix, err := holderPrefix()
	if err != nil {
		return "", err
	}
	var buf [128]byte // one allocation, the string, when the prefix fits
	return string(appendHolder(buf[:0], prefix)), nil
}

// appendHolder appends a new holder id of prefix, holderPrefix's.
func appendHolder(dst []byte, prefix string) []byte {
	return strconv.AppendUint(append(dst, prefix...), holderCount.Add(1), 10)
}

// HolderGone reports whether holder, the lease holder of a Record written
// by a Transport (or taken with NewHolder), names a process on this host
// that no longer exists, or (on Linux) exists only as a zombie that its
// parent has not waited for yet: a holder that cannot be sending anything, whose
// lease need not be waited out. It errs towards false: an unknown format, another host (on Linux,
// another PID namespace or another boot too, so a holder written before a
// reboot), this process, or a process that cannot be checked are taken as
// alive. (A pid reused by an unrelated process also reads as alive: the
// wait is the safe side.)
func HolderGone(holder string) bool {
	host, rest, ok := strings.Cut(holder, "/")
	if !ok {
		return false
	}
	pidText, _, ok := strings.Cut(rest, "/")
	if !ok {
		return false
	}
	// Only a pid as NewHolder writes it: Atoi would also take "+7" or 2^32+7,
	// and the kernel reads 32 bits of a pid.
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 || pid > math.MaxInt32 || strconv.Itoa(pid) != pidText || pid == os.Getpid() {
		return false
	}
	myHost, _, _ := strings.Cut(processPrefix(), "/")
	if host != myHost {
		return false
	}
	return processGone(pid)
}
