package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Format is an output format.
type Format string

// Output formats.
const (
	FormatTable Format = "table"
	FormatJSON  Format = "json"
	FormatCSV   Format = "csv"
	// FormatMarkdown is the table as GitHub-flavoured Markdown.
	FormatMarkdown Format = "markdown"
	// FormatProm is Prometheus text exposition with vLLM's metric names
	// (see prom.go), for results made of transfers.
	FormatProm Format = "prom"
)

// ParseFormat accepts table, json, csv, markdown (md) and prom.
func ParseFormat(s string) (Format, error) {
	switch f := Format(strings.ToLower(strings.TrimSpace(s))); f {
	case FormatTable, FormatJSON, FormatCSV, FormatMarkdown, FormatProm:
		return f, nil
	case "md":
		return FormatMarkdown, nil
	}
	return "", fmt.Errorf("unknown output format %q (want table, json, csv, markdown or prom)", s)
}

// WriteJSON writes v as indented JSON with a trailing newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Int formats an integer with thousands separators: 327,680.
func Int(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Bytes formats a byte count in binary units: 320 KiB, 1.25 GiB, 999 B.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	i := -1
	for math.Abs(v) >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	return trimFloat(v, 2) + " " + units[i]
}

// GBps formats a rate in decimal GB/s with three significant figures.
func GBps(bytesPerSecond float64) string {
	return sig3(bytesPerSecond/1e9) + " GB/s"
}

// sig3 prints x with about three significant figures, no exponent.
func sig3(x float64) string {
	ax := math.Abs(x)
	switch {
	case ax == 0:
		return "0"
	case ax >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case ax >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case ax >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	case ax >= 0.01:
		return strconv.FormatFloat(x, 'f', 3, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// Float formats x with about three significant figures.
func Float(x float64) string { return sig3(x) }

func trimFloat(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// Seconds formats a duration given in seconds with a unit that keeps about
// three significant figures: 13.1 ms, 1.64 s, 850 µs.
func Seconds(s float64) string {
	return Duration(time.Duration(s * float64(time.Second)))
}

// Duration formats d like Seconds.
func Duration(d time.Duration) string {
	switch ad := d.Abs(); {
	case ad == 0:
		return "0"
	case ad < time.Microsecond:
		return sig3(float64(d)) + " ns"
	case ad < time.Millisecond:
		return sig3(float64(d)/1e3) + " µs"
	case ad < time.Second:
		return sig3(float64(d)/1e6) + " ms"
	}
	return sig3(d.Seconds()) + " s"
}
