package handoff

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/nixlctl/nixlctl/internal/enum"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// ISLDist is the distribution prompt lengths are drawn from.
type ISLDist string

// ISL distributions.
const (
	ISLFixed   ISLDist = "fixed"
	ISLUniform ISLDist = "uniform"
	ISLNormal  ISLDist = "normal"
	// ISLTrace takes prompt lengths (and arrivals) from a trace.
	ISLTrace ISLDist = "trace"
)

// ISLDists lists the valid distributions.
var ISLDists = []ISLDist{ISLFixed, ISLUniform, ISLNormal, ISLTrace}

func (d ISLDist) String() string { return string(d) }

// UnmarshalText accepts the ISLDists.
func (d *ISLDist) UnmarshalText(b []byte) error {
	return enum.Parse(d, "ISL distribution", b, ISLDists)
}

// ISL says how long prompts are. The mapstructure tags are the flags of
// the commands that take one (squashed into their options).
type ISL struct {
	Dist  ISLDist `json:"dist" mapstructure:"isl-dist"`
	Fixed int     `json:"fixed" mapstructure:"isl"`     // fixed
	Min   int     `json:"min" mapstructure:"isl-min"`   // uniform; clipping bounds for normal
	Max   int     `json:"max" mapstructure:"isl-max"`   //
	Mean  float64 `json:"mean" mapstructure:"isl-mean"` // normal
	Std   float64 `json:"std" mapstructure:"isl-std"`   // normal
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
		// An ISL of 2e9 sized pools past any memory, and an arrival of
		// 1e15 s wrapped as a Duration and fired at once.
		if e.ISL > kv.MaxTokens {
			return nil, fmt.Errorf("trace line %d: isl %d: at most %d tokens", line, e.ISL, kv.MaxTokens)
		}
		if e.Arrival > runcore.MaxRunTime.Seconds() {
			return nil, fmt.Errorf("trace line %d: arrival %g s: at most %g s (%v)", line, e.Arrival, runcore.MaxRunTime.Seconds(), runcore.MaxRunTime)
		}
		if len(out) == runcore.MaxRequests {
			return nil, fmt.Errorf("trace line %d: more than %d requests", line, runcore.MaxRequests)
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

// Validate checks the parameters the distribution uses, as field errors
// (errkind.FieldError) joined.
func (d ISL) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) { errs = append(errs, errkind.Field(field, format, a...)) }
	switch d.Dist {
	case ISLFixed:
		if d.Fixed <= 0 {
			bad("Fixed", "must be positive")
		} else if d.Fixed > kv.MaxTokens {
			bad("Fixed", "tokens must be between 1 and %d (got %d)", kv.MaxTokens, d.Fixed)
		}
	case ISLUniform, ISLNormal:
		if d.Min <= 0 {
			bad("Min", "must be positive")
		}
		if d.Max < d.Min {
			bad("Max", "must be at least the minimum (%d)", d.Min)
		} else if d.Max > kv.MaxTokens {
			bad("Max", "tokens must be between 1 and %d (got %d)", kv.MaxTokens, d.Max)
		}
		if d.Dist == ISLNormal {
			if d.Mean <= 0 {
				bad("Mean", "must be positive")
			} else if d.Mean > kv.MaxTokens {
				bad("Mean", "tokens must be between 1 and %d (got %g)", kv.MaxTokens, d.Mean)
			}
			if d.Std < 0 {
				bad("Std", "must not be negative")
			}
		}
	case ISLTrace:
	default:
		bad("Dist", "unknown ISL distribution %q (want fixed, uniform, normal or trace)", d.Dist)
	}
	return errors.Join(errs...)
}

// Draw samples one prompt length.
func (d ISL) Draw(rng *rand.Rand) int {
	switch d.Dist {
	case ISLUniform:
		return d.Min + rng.IntN(d.Max-d.Min+1)
	case ISLNormal:
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
