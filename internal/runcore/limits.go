package runcore

import (
	"fmt"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
)

// Upper bounds on what a run may ask for. The parsers take any int, and a
// count near the largest one made a slice no allocation can hold (a
// runtime panic after the endpoints started), a goroutine per unit of
// --concurrency, or a run that could only end by being killed. Each is
// far past any real benchmark and refused, naming the flag, before
// anything starts.
const (
	// MaxRequests bounds the measured requests of a run, and its warm-up
	// ones: the driver keeps a record of each (a few hundred bytes).
	MaxRequests = 1_000_000
	// MaxConcurrency bounds a closed loop's requests in flight, each of
	// which is a goroutine here and holds blocks on both engines.
	MaxConcurrency = 4096
	// MaxLocalEngines bounds the engines a handoff run starts on this
	// host, each a process (or, with --inproc, a set of agents) with its
	// own UCX contexts and KV pool.
	MaxLocalEngines = 32
	// MaxEngines bounds --prefills and --decodes wherever the engines
	// run (a rendezvous waits for that many ranks).
	MaxEngines = 1024
	// MaxRunTime bounds a run's schedule: an open loop's expected last
	// arrival and a trace's last. Past it, arrival offsets also come
	// close to what a time.Duration holds (292 years).
	MaxRunTime = 7 * 24 * time.Hour
	// MaxPrefillTime bounds the simulated compute of one request
	// (--prefill-time per token times the longest prompt).
	MaxPrefillTime = 10 * time.Minute
)

// MemRoom is what the host can give a run's buffers (MemAvailable;
// 0: unknown, nothing is refused).
type MemRoom int64

func HostMemRoom() MemRoom { return MemRoom(MemAvailable()) }

// Fits says whether n items of size bytes each fit, without overflow.
func (m MemRoom) Fits(n, size int64) bool {
	return m <= 0 || size <= 0 || n <= 0 || n <= int64(m)/size
}

// Need is "n x size (what) = total; free" for a refusal.
func (m MemRoom) Need(n, size int64, what string) string {
	total := "more than " + report.Bytes(int64(m))
	if size > 0 && n <= (1<<62)/size {
		total = report.Bytes(n * size)
	}
	return fmt.Sprintf("%d x %s (%s) = %s; %s of memory available", n, report.Bytes(size), what, total, report.Bytes(int64(m)))
}
