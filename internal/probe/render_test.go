package probe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/report"
)

// fakeLeakResult is a made-up result (no process ran) for the renderers.
func fakeLeakResult() *LeakResult {
	res := &LeakResult{Meta: report.Meta{Schema: report.Schema, Command: "probe ucx-leak", Warnings: []string{"a warning"}},
		Thresholds: DefaultThresholds, Notes: []string{"a note"}}
	res.Config = LeakConfig{Backends: []string{"ucx", "nixl"}, Matrix: []EnvAxis{{Key: HookModeVar, Values: []string{"default", "none"}}},
		LibraryDefaults: map[string]string{HookModeVar: "bistro"}, DurationS: 60, IntervalS: 1, Model: "llama-3.2-1b", Tokens: 1024,
		BlockSize: 16, DescriptorsPerRequest: 2048, BytesPerRequest: 32 << 20, PoolBytes: 64 << 20, Rate: 10, Churn: DefaultChurn, UCXLibrary: "1.13.1"}
	leak := ConfigResult{Backend: "ucx", Env: map[string]string{}, Label: HookModeVar + "=default", Verdict: Leak, Reason: "RSS grows steadily",
		SlopeMBPerMin: 412.5, R2: 0.998, GrowthMB: 343.1, VmDataGrowthMB: 350.2, MapsGrowth: 12, FDsGrowth: 0,
		Transport: "rma: rc_mlx5/mlx5_0:1 (zero-copy)", Sender: PeerStats{Requests: 600}, Samples: series(61, 1, 300, 412.5, 0, 1)}
	stable := ConfigResult{Backend: "ucx", Env: map[string]string{HookModeVar: "none"}, Label: HookModeVar + "=none", Verdict: Stable, Reason: "flat",
		SlopeMBPerMin: 0.12, R2: 0.05, GrowthMB: 0.1, MapsGrowth: -1, Transport: "rma: rc_mlx5/mlx5_0:1 (zero-copy)", Sender: PeerStats{Requests: 598},
		Samples: series(61, 1, 300, 0, 0.2, 2)}
	skipped := ConfigResult{Backend: "nixl", Env: map[string]string{}, Label: "(every configuration)", Verdict: Skipped, Reason: "backend nixl is not built into this nixlctl", Samples: []Sample{}}
	res.Configs = []ConfigResult{leak, stable, skipped}
	res.Recommendation = recommend(res.Configs)
	return res
}

func TestWriteLeak(t *testing.T) {
	res := fakeLeakResult()
	var tb, cb, jb bytes.Buffer
	if err := res.Render(&tb, report.FormatTable); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "leak_table.txt", tb.Bytes())
	if err := res.Render(&cb, report.FormatCSV); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "leak.csv", cb.Bytes())
	if err := res.Render(&jb, report.FormatJSON); err != nil {
		t.Fatal(err)
	}
	// The JSON keys scripts rely on.
	var back struct {
		Configs []struct {
			Env     map[string]string `json:"env"`
			Verdict string            `json:"verdict"`
			Slope   float64           `json:"slope_mb_per_min"`
			R2      float64           `json:"r2"`
			Samples []map[string]float64
		} `json:"configs"`
		Recommendation string `json:"recommendation"`
		Schema         string `json:"schema"`
		Warnings       []string
	}
	if err := json.Unmarshal(jb.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Configs) != 3 || back.Configs[1].Env[HookModeVar] != "none" || back.Configs[0].Verdict != Leak ||
		back.Configs[0].Slope != 412.5 || len(back.Configs[0].Samples) != 61 || back.Recommendation == "" || back.Schema != report.Schema {
		t.Errorf("JSON: %+v", back)
	}
	for _, k := range []string{"t", "rss", "vmdata", "maps", "fds"} {
		if _, ok := back.Configs[0].Samples[0][k]; !ok {
			t.Errorf("sample has no %q", k)
		}
	}
}

func TestRecommend(t *testing.T) {
	res := fakeLeakResult()
	if r := res.Recommendation; !strings.Contains(r, "Leaked: ucx UCX_MEM_MMAP_HOOK_MODE=default") ||
		!strings.Contains(r, "Stable: ucx UCX_MEM_MMAP_HOOK_MODE=none") || !strings.Contains(r, "library defaults leaked") {
		t.Errorf("recommendation: %s", r)
	}
	if r := recommend([]ConfigResult{{Verdict: Stable, Backend: "ucx", Label: "x"}}); !strings.Contains(r, "No leak here") {
		t.Errorf("all stable: %s", r)
	}
	if r := recommend([]ConfigResult{{Verdict: Skipped}}); !strings.Contains(r, "No configuration ran") {
		t.Errorf("nothing ran: %s", r)
	}
}
