package main

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/ecbench"
	"github.com/nixlctl/nixlctl/internal/handoff"
	"github.com/nixlctl/nixlctl/internal/leasechaos"
	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/proxybench"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// Bad bench options exit 2 with one line that names the flag, whether
// the value came from a flag, the environment or the config file, and
// whether it failed to parse (an enum) or to validate.
func TestBadOptionsNameTheFlag(t *testing.T) {
	t.Chdir(t.TempDir())
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		stderr string
	}{
		{"validation", nil, []string{"bench", "push", "--isl", "0"}, "error: --isl: must be positive\n"},
		{"enum", nil, []string{"bench", "pull", "--fragmentation", "bogus"}, `error: --fragmentation: unknown fragmentation "bogus" (want contiguous, scattered)` + "\n"},
		{"verify", nil, []string{"bench", "sglang", "--verify", "bogus"}, `error: --verify: unknown verify mode "bogus" (want sparse, full)` + "\n"},
		{"isl distribution", nil, []string{"bench", "pull", "--isl-dist", "zipf"}, `error: --isl-dist: unknown ISL distribution "zipf"`},
		{"nested field", nil, []string{"bench", "pull", "--isl-dist", "uniform", "--isl-min", "9", "--isl-max", "3"}, "error: --isl-max: must be at least the minimum (9)\n"},
		{"memory type", nil, []string{"bench", "pull", "--mem", "hbm"}, `error: --mem: unknown memory type "hbm"`},
		{"two fields", nil, []string{"bench", "pull", "--requests", "0", "--warmup", "-2"}, "error: --requests: must be positive; --warmup: must not be negative (or -1: one pass over the KV pool)\n"},
		{"environment", map[string]string{"NIXLCTL_DRAM_ALLOC": "malloc"}, []string{"bench", "pull"}, `error: --dram-alloc: unknown DRAM allocation "malloc" (want mmap, thp, ucx)`},
		{"config file", nil, []string{"bench", "push", "--config", "bad.yaml"}, "error: --registration-timeout: must be positive\n"},
		{"xfer size", nil, []string{"bench", "xfer", "--start-block-size", "4X"}, `error: --start-block-size: "4X" is not a size`},
		{"xfer op", nil, []string{"bench", "xfer", "--op-type", "COPY"}, `error: --op-type: unknown op "COPY" (want READ or WRITE)` + "\n"},
		{"lease-chaos", nil, []string{"lease-chaos", "--reaper", "tail"}, `error: --reaper: unknown reaper "tail" (want full or head-only)` + "\n"},
		{"lease-chaos --sim traffic", nil, []string{"lease-chaos", "--sim", "--requests", "-1"}, "error: --requests: -1: want 0 (scenarios only) or more\n"},
		{"list element", nil, []string{"bench", "ec", "--grid", "1x8x8,44x80"}, `error: --grid: grid "44x80": want T x H x W`},
		{"tp vLLM refuses", nil, []string{"bench", "pull", "--model", "qwen3-30b-a3b", "--prefill-tp", "8", "--decode-tp", "4"},
			"error: --decode-tp: --prefill-tp 8 > --decode-tp 4 with the 4 KV heads of qwen3-30b-a3b replicated across prefill's ranks: vLLM refuses this (\"num_kv_heads > tp_size with P_TP > D_TP not supported for non-mamba\") (--allow-unsupported-tp runs it anyway)\n"},
		{"push heartbeat keys", nil, []string{"bench", "push", "--push-heartbeat-keys", "router"}, `error: --push-heartbeat-keys: unknown push heartbeat keys "router" (want upstream, fixed)` + "\n"},
		{"registration watchdog", nil, []string{"bench", "push", "--registration-watchdog", "retry"}, `error: --registration-watchdog: unknown registration watchdog action "retry" (want drop, fail)` + "\n"},
		{"pull heartbeat keys", nil, []string{"lease-chaos", "--push-heartbeat-keys", "fixed"}, "error: --push-heartbeat-keys: fixed keys are push mode's (pull heartbeats name prefill's own id)\n"},
		{"xfer validation", nil, []string{"bench", "xfer", "--pipeline-depth", "0"}, "error: --pipeline-depth: must be positive\n"},
	}
	if err := os.WriteFile("bad.yaml", []byte("bench:\n  push:\n    registration-timeout: 0s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.env, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("exit %d, stderr %q (want 2 and %q)", code, stderr, tc.stderr)
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") != 1 {
				t.Errorf("want one line plus the usage hint, got %q", stderr)
			}
		})
	}
}

// Every field of a bench options struct the CLI decodes into is a flag
// of its command (under its mapstructure name) or says it is not one ("-").
func TestOptionsAreFlags(t *testing.T) {
	for _, tc := range []struct {
		opts reflect.Type
		cmd  *cobra.Command
	}{
		{reflect.TypeFor[handoff.HandoffOptions](), newHandoffCmd(&app{}, "push")},
		{reflect.TypeFor[xferbench.XferOptions](), newBenchXferCmd(&app{})},
		{reflect.TypeFor[ecbench.ECOptions](), newBenchECCmd(&app{})},
		{reflect.TypeFor[leasechaos.LeaseChaosOptions](), newLeaseChaosCmd(&app{})},
		{reflect.TypeFor[leasesim.TrafficOptions](), newLeaseChaosCmd(&app{})},
		{reflect.TypeFor[proxybench.Options](), newBenchProxyCmd(&app{})},
	} {
		var missing []string
		var walk func(reflect.Type, string)
		walk = func(t reflect.Type, path string) {
			for i := range t.NumField() {
				f := t.Field(i)
				tag := f.Tag.Get("mapstructure")
				switch {
				case tag == "-":
				case tag == ",squash":
					walk(f.Type, path+f.Name+".")
				case tag == "":
					missing = append(missing, path+f.Name+" (no mapstructure tag)")
				default:
					name, ok := flagOf(tc.opts, path+f.Name)
					if !ok || tc.cmd.Flags().Lookup(name) == nil {
						missing = append(missing, path+f.Name+" (--"+name+")")
					}
				}
			}
		}
		walk(tc.opts, "")
		if diff := cmp.Diff([]string(nil), missing); diff != "" {
			t.Errorf("%s: fields without a flag:\n%s", tc.opts, diff)
		}
	}
}

func TestFlagOf(t *testing.T) {
	typ := reflect.TypeFor[handoffOptions]()
	for path, want := range map[string]string{"ISL.Fixed": "isl", "ISL.Dist": "isl-dist", "RegTimeout": "registration-timeout",
		"HandoffOptions.NoMerge": "no-merge", "Model": "model", "Protocol": "", "Spec": "", "ISL.Nope": "", "Nope": ""} {
		got, ok := flagOf(typ, path)
		if got != want || ok != (want != "") {
			t.Errorf("flagOf(%s) = %q, %v; want %q", path, got, ok, want)
		}
	}
}
