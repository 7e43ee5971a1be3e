package runcore

import (
	"fmt"
	"time"

	"github.com/nixlctl/nixlctl/internal/procfs"
	"github.com/nixlctl/nixlctl/internal/report"
)

// Duration is a time.Duration written as Go writes it ("30s"), as results
// always had it.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a Go duration ("30s", "1m0s").
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// MemAvailable is MemAvailable from /proc/meminfo in bytes (0: unknown).
func MemAvailable() int64 {
	m, err := procfs.ReadMemInfo()
	if err != nil {
		return 0
	}
	return m.AvailableBytes
}

// ByteSize is a byte count that parses sizes with binary units ("64K",
// "1M"; report.ParseSize); empty is 0.
type ByteSize int

// String writes the largest binary unit that divides the size ("4K",
// "64M"), so it parses back; 0 is empty.
func (b ByteSize) String() string {
	if b == 0 {
		return ""
	}
	for _, u := range []struct {
		suffix string
		n      ByteSize
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if b%u.n == 0 {
			return fmt.Sprintf("%d%s", b/u.n, u.suffix)
		}
	}
	return fmt.Sprint(int(b))
}

// UnmarshalText reads a size (4096, 64K, 1.5M).
func (b *ByteSize) UnmarshalText(t []byte) error {
	if len(t) == 0 {
		*b = 0
		return nil
	}
	v, err := report.ParseSize(string(t))
	if err != nil {
		return err
	}
	if int64(int(v)) != v {
		return fmt.Errorf("%q is too large", t)
	}
	*b = ByteSize(v)
	return nil
}
