package report

import (
	"fmt"
	"strconv"
	"strings"
)

// maxSize bounds every size flag: far beyond any machine's memory, far
// inside int64 and exact in a float64.
const maxSize = 1 << 50

// ParseSize reads a byte count: 4096, 64K, 64KiB, 1M, 1.5G (binary units;
// a trailing B or iB is optional).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(t, "IB")
	t = strings.TrimSuffix(t, "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		case 'T':
			mult, t = 1<<40, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	// Compared in float64 before any conversion, so a huge value cannot
	// wrap; written so that NaN fails too.
	if err != nil || !(f >= 0) {
		return 0, fmt.Errorf("%q is not a size (examples: 4096, 64K, 1M, 8G)", s)
	}
	if !(f*float64(mult) <= maxSize) {
		return 0, fmt.Errorf("%q is too large (limit %d bytes, 1 PiB)", s, int64(maxSize))
	}
	v := int64(f * float64(mult))
	if float64(v) != f*float64(mult) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return v, nil
}
