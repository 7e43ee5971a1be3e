package nixl

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Self is this process's identity, for agent metadata.
var Self = sync.OnceValue(func() Process {
	p := Process{PID: uint32(os.Getpid())}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		p.Host = strings.TrimSpace(string(b))
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		p.PIDNS = ns
	}
	p.StartTime, _ = StartTime(os.Getpid())
	return p
})

// SameHost reports whether p runs on this host in this pid namespace, so
// that its liveness can be checked by pid.
func SameHost(p Process) bool {
	s := Self()
	return p.Host != "" && p.Host == s.Host && p.PIDNS == s.PIDNS && p.PID != 0
}

// StartTime reads a process's start time (clock ticks since boot), which
// tells a live process from a later one that reused its pid.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses: the
	// fields we want follow the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 overall
}

// pfExiting is the kernel's PF_EXITING task flag (field 9 of
// /proc/PID/stat): set when a process starts to exit, before its memory is
// torn down.
const pfExiting = 0x4

// Alive reports whether the process p (on this host) still runs: the pid
// exists, is neither exiting nor a zombie, and started when p did.
// "Exiting" matters: a transport that maps the peer's memory (CMA) fails
// as soon as that memory is gone, which is before the process is a zombie.
func Alive(p Process) bool {
	if err := syscall.Kill(int(p.PID), 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return false
		}
		if len(f) > 6 {
			if flags, err := strconv.ParseUint(f[6], 10, 64); err == nil && flags&pfExiting != 0 {
				return false
			}
		}
	}
	st, err := StartTime(int(p.PID))
	return err == nil && (p.StartTime == 0 || st == p.StartTime)
}
