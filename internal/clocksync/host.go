package clocksync

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// HostIdentity says which CLOCK_MONOTONIC a process reads. The boot id
// names the running kernel; the PID namespace is what nixlctl has always
// treated as "one host" (a separate one is how tests stage two hosts on one
// machine); the time namespace can shift CLOCK_MONOTONIC without changing
// either, so it decides too.
type HostIdentity struct {
	BootID        string
	PIDNamespace  string
	TimeNamespace string // empty on kernels without time namespaces (< 5.6)
}

// SameClock reports whether two processes read one CLOCK_MONOTONIC: one
// kernel (boot id) and one time namespace, whatever their PID, network or
// mount namespaces. Their offset is then exactly zero. An identity that
// could not be read is never the same as anything.
func SameClock(a, b HostIdentity) bool {
	return a.BootID != "" && a.BootID == b.BootID && a.TimeNamespace == b.TimeNamespace
}

// SameHost reports whether two processes read one clock, so that the offset
// between them is exactly zero. An identity that could not be read is never
// the same as anything: guessing "same" would hide a real offset.
func SameHost(a, b HostIdentity) bool {
	return a.BootID != "" && a.PIDNamespace != "" &&
		a.BootID == b.BootID && a.PIDNamespace == b.PIDNamespace &&
		a.TimeNamespace == b.TimeNamespace
}

// ReadHostIdentity reads this process's identity from /proc.
func ReadHostIdentity() (HostIdentity, error) { return readHostIdentity("/proc") }

func readHostIdentity(proc string) (HostIdentity, error) {
	var h HostIdentity
	bootFile := filepath.Join(proc, "sys/kernel/random/boot_id")
	b, err := os.ReadFile(bootFile)
	if err != nil {
		return HostIdentity{}, fmt.Errorf("clocksync: reading the boot id: %w", err)
	}
	if h.BootID = strings.TrimSpace(string(b)); h.BootID == "" {
		return HostIdentity{}, fmt.Errorf("clocksync: %s is empty", bootFile)
	}
	if h.PIDNamespace, err = os.Readlink(filepath.Join(proc, "self/ns/pid")); err != nil {
		return HostIdentity{}, fmt.Errorf("clocksync: reading the PID namespace: %w", err)
	}
	h.TimeNamespace, err = os.Readlink(filepath.Join(proc, "self/ns/time"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return HostIdentity{}, fmt.Errorf("clocksync: reading the time namespace: %w", err)
	}
	return h, nil
}
