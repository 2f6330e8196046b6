package idem

import (
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

var processPrefix = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return strings.ReplaceAll(host, "/", "_") + "/" + strconv.Itoa(os.Getpid())
})

var (
	holderPrefix = sync.OnceValues(func() (string, error) {
		id, _, err := newKey(time.Now())
		return processPrefix() + "/" + id + ".", err
	})
	holderCount atomic.Uint64
)

func newHolder() (string, error) {
	prefix, err := holderPrefix()
	if err != nil {
		return "", err
	}
	var buf [128]byte // one allocation, the string, when the prefix fits
	return string(strconv.AppendUint(append(buf[:0], prefix...), holderCount.Add(1), 10)), nil
}

// HolderGone reports whether holder, the lease holder of a Record written
// by a Transport, names a process on this host that no longer exists: a
// holder that cannot be sending anything, whose lease need not be waited
// out. It errs towards false: an unknown format, another host, this
// process, or a process that cannot be checked are taken as alive. (A pid
// reused by an unrelated process also reads as alive: the wait is the safe
// side.)
func HolderGone(holder string) bool {
	host, rest, ok := strings.Cut(holder, "/")
	if !ok {
		return false
	}
	pidText, _, ok := strings.Cut(rest, "/")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	myHost, _, _ := strings.Cut(processPrefix(), "/")
	if host != myHost {
		return false
	}
	return processGone(pid)
}
