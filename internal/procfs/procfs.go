// Package procfs parses what the kernel reports about memory in /proc:
// a process's /proc/PID/status and the machine's /proc/meminfo. It does no
// I/O beyond ReadMemInfo, so both parsers are fuzzed on arbitrary bytes.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStatus is what we read from /proc/PID/status.
type ProcStatus struct {
	RSS    int64
	VmData int64
}

// ParseProcStatus reads VmRSS and VmData ("VmRSS:	  12345 kB") from the
// contents of /proc/PID/status. Both must be present: a kernel thread or
// a zombie has neither, and sampling one is an error, not a zero.
func ParseProcStatus(b []byte) (ProcStatus, error) {
	var st ProcStatus
	var haveRSS, haveData bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst, haveRSS = &st.RSS, true
		case "VmData":
			dst, haveData = &st.VmData, true
		default:
			continue
		}
		n, err := parseKB(val)
		if err != nil {
			return ProcStatus{}, fmt.Errorf("%s: %w", key, err)
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return ProcStatus{}, err
	}
	if !haveRSS || !haveData {
		return ProcStatus{}, errors.New("no VmRSS/VmData (a zombie or kernel thread?)")
	}
	return st, nil
}

// parseKB parses "  12345 kB" into bytes.
func parseKB(s string) (int64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("malformed value %q (want \"N kB\")", strings.TrimSpace(s))
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 || n > 1<<50 {
		return 0, fmt.Errorf("malformed value %q", f[0])
	}
	return n * 1024, nil
}

// MemInfo is the part of /proc/meminfo that `probe env` reports.
type MemInfo struct {
	TotalBytes     int64 `json:"total_bytes"`
	AvailableBytes int64 `json:"available_bytes"`
	HugePagesTotal int64 `json:"hugepages_total"`
	HugePagesFree  int64 `json:"hugepages_free"`
	HugePagesRsvd  int64 `json:"hugepages_rsvd"`
	HugePageBytes  int64 `json:"hugepage_bytes"`
}

// ParseMemInfo reads /proc/meminfo contents. HugePages_* are counts, the
// others kB. Unknown lines are ignored; malformed known ones are errors.
func ParseMemInfo(b []byte) (MemInfo, error) {
	var m MemInfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var err error
		switch key {
		case "MemTotal":
			m.TotalBytes, err = parseKB(val)
		case "MemAvailable":
			m.AvailableBytes, err = parseKB(val)
		case "Hugepagesize":
			m.HugePageBytes, err = parseKB(val)
		case "HugePages_Total":
			m.HugePagesTotal, err = parseCount(val)
		case "HugePages_Free":
			m.HugePagesFree, err = parseCount(val)
		case "HugePages_Rsvd":
			m.HugePagesRsvd, err = parseCount(val)
		}
		if err != nil {
			return MemInfo{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	return m, sc.Err()
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("malformed count %q", strings.TrimSpace(s))
	}
	return n, nil
}

// ReadMemInfo reads and parses this machine's /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return MemInfo{}, err
	}
	return ParseMemInfo(b)
}
