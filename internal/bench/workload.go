package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
)

// ISL says how long prompts are.
type ISL struct {
	Dist  string  `json:"dist"`  // fixed, uniform, normal, trace
	Fixed int     `json:"fixed"` // fixed
	Min   int     `json:"min"`   // uniform; clipping bounds for normal
	Max   int     `json:"max"`
	Mean  float64 `json:"mean"` // normal
	Std   float64 `json:"std"`  // normal
}

// TraceEntry is one request of a JSON-lines trace: when it arrives
// (seconds from the start) and its prompt length.
type TraceEntry struct {
	Arrival float64 `json:"arrival"`
	ISL     int     `json:"isl"`
}

// ReadTrace parses a JSON-lines trace ({"arrival": s, "isl": n} per line;
// blank lines and lines starting with # are skipped).
func ReadTrace(r io.Reader) ([]TraceEntry, error) {
	var out []TraceEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		var e TraceEntry
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if e.ISL <= 0 || e.Arrival < 0 || math.IsNaN(e.Arrival) || math.IsInf(e.Arrival, 0) {
			return nil, fmt.Errorf("trace line %d: need isl > 0 and arrival >= 0, got %+v", line, e)
		}
		if n := len(out); n > 0 && e.Arrival < out[n-1].Arrival {
			return nil, fmt.Errorf("trace line %d: arrivals must not go back in time", line)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace has no requests")
	}
	return out, nil
}

// Validate checks the distribution's parameters.
func (d ISL) Validate() error {
	switch d.Dist {
	case "fixed":
		if d.Fixed <= 0 {
			return fmt.Errorf("--isl must be > 0")
		}
	case "uniform":
		if d.Min <= 0 || d.Max < d.Min {
			return fmt.Errorf("uniform ISL needs 0 < --isl-min <= --isl-max")
		}
	case "normal":
		if d.Mean <= 0 || d.Std < 0 || d.Min <= 0 || d.Max < d.Min {
			return fmt.Errorf("normal ISL needs --isl-mean > 0, --isl-std >= 0 and 0 < --isl-min <= --isl-max")
		}
	case "trace":
	default:
		return fmt.Errorf("ISL distribution %q: want fixed, uniform, normal or trace", d.Dist)
	}
	return nil
}

// Draw samples one prompt length.
func (d ISL) Draw(rng *rand.Rand) int {
	switch d.Dist {
	case "uniform":
		return d.Min + rng.IntN(d.Max-d.Min+1)
	case "normal":
		v := int(math.Round(rng.NormFloat64()*d.Std + d.Mean))
		return min(max(v, d.Min), d.Max)
	}
	return d.Fixed
}

// Arrivals generates Poisson arrival offsets at rate per second.
func Arrivals(n int, rate float64, rng *rand.Rand) []time.Duration {
	out := make([]time.Duration, n)
	t := 0.0
	for i := range out {
		t += rng.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// recordBackend says in a result which transfer backend ran, and which
// UCX when it is nixlctl's own layer over it.
func recordBackend(m *report.Meta, name, version string) {
	m.Env.Backend, m.Env.BackendVersion = name, version
	if name == "ucx" {
		m.Env.UCX = version
	}
}
