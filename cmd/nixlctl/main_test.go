package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

func TestMain(m *testing.M) {
	testscript.Main(withCUDA{m}, map[string]func(){"nixlctl": func() { os.Exit(Main()) }})
}

// withCUDA chooses the CUDA driver (the fake one on machines without a
// GPU) before the tests run, and only then: Run is not called when this
// binary runs as a script's nixlctl, which inherits the choice.
type withCUDA struct{ m *testing.M }

func (w withCUDA) Run() int {
	if _, err := cudatest.Setup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return w.m.Run()
}

// TestScripts runs the whole-CLI scenarios in testdata/script/*.txtar.
// [cuda] holds where a CUDA driver (real or the tests' fake) is usable,
// [cuda2] where it shows two GPUs.
func TestScripts(t *testing.T) {
	t.Parallel()
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(e *testscript.Env) error {
			if lib := os.Getenv(cuda.EnvLib); lib != "" {
				e.Setenv(cuda.EnvLib, lib)
			}
			// A carried test binary (scripts/gpu-check.sh) finds libzmq
			// and UCX, and the machine's CUDA driver, only on this path.
			if p := os.Getenv("LD_LIBRARY_PATH"); p != "" {
				e.Setenv("LD_LIBRARY_PATH", p)
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitport": waitPort,
			"waitfile": waitFile,
			"jsonkeys": jsonKeys,
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "cuda":
				ok, _ := cuda.Available()
				return ok, nil
			case "cuda2":
				return cuda.DeviceCount() >= 2, nil
			case "nixl":
				// --backend auto picks NIXL where it is installed.
				b, err := nixl.Resolve("auto")
				return err == nil && b.Name == "nixl", nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
	})
}

// scriptWait bounds waitport and waitfile: generous, because the
// scripts' nixlctl is built with the race detector and CI machines are
// busy; a healthy run passes in well under a second.
const scriptWait = 2 * time.Minute

// waitPort is the scripts' "waitport HOST:PORT": it returns once a TCP
// connection to the address succeeds, so that a script starts its driver
// after the endpoint listens instead of after a guessed sleep.
func waitPort(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitport HOST:PORT")
	}
	scriptWaitFor(ts, "nothing listens on "+args[0], func() bool {
		c, err := net.DialTimeout("tcp", args[0], time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// scriptWaitFor polls done every 50 ms until it holds, failing the
// script with what after scriptWait (waitFor in multihost_test.go does
// the same for a *testing.T, which a script command does not have).
func scriptWaitFor(ts *testscript.TestScript, what string, done func() bool) {
	for end := time.Now().Add(scriptWait); !done(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			ts.Fatalf("%s after %v", what, scriptWait)
		}
	}
}

// waitFile is the scripts' "waitfile FILE PATTERN": it returns once FILE
// (relative to the work directory) holds a match of the regular
// expression PATTERN, such as the first record of a run that is
// measuring, so a fault is injected mid-run rather than mid-setup.
func waitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitfile FILE PATTERN")
	}
	re, err := regexp.Compile(args[1])
	ts.Check(err)
	scriptWaitFor(ts, fmt.Sprintf("%s holds no match of %q", args[0], args[1]), func() bool {
		b, err := os.ReadFile(ts.MkAbs(args[0]))
		return err == nil && re.Match(b)
	})
}

// jsonKeys is the scripts' "jsonkeys FILE LIST": it fails when the JSON in
// FILE lacks any of the paths LIST names, one per line ("summary.requests";
// "[]" for an array's elements), so a result that loses a field fails
// whatever its values.
func jsonKeys(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: jsonkeys FILE LIST")
	}
	var v any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &v); err != nil {
		ts.Fatalf("%s: %v", args[0], err)
	}
	have := map[string]bool{}
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := k
				if path != "" {
					p = path + "." + k
				}
				have[p] = true
				walk(x, p)
			}
		case []any:
			for _, x := range v {
				walk(x, path+"[]")
			}
		}
	}
	walk(v, "")
	var missing []string
	for _, want := range strings.Fields(ts.ReadFile(args[1])) {
		if !have[want] {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		ts.Fatalf("%s lacks %d fields of %s: %s", args[0], len(missing), args[1], strings.Join(missing, " "))
	}
}

// runCLI runs nixlctl in-process with buffers for its streams.
func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	code = run(context.Background(), &ioStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, args)
	return code, out.String(), errOut.String()
}

func TestExitCodes(t *testing.T) {
	t.Chdir(t.TempDir())
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"kv", "layout", "--model", "llama-3.1-8b"}, exitOK, ""},
		{[]string{"kv", "layout", "--model", "nope"}, exitUsage, `unknown model "nope"; presets: deepseek-r1`},
		{[]string{"kv", "layout", "--isl", "0"}, exitUsage, "tokens must be between 1"},
		{[]string{"kv", "layout", "--isl", "12x"}, exitUsage, `"12x" is not a whole number`},
		{[]string{"kv", "layout", "--tp", "3"}, exitUsage, "tp 3 does not divide num_attention_heads 32"},
		{[]string{"kv", "layout", "--kv-dtype", "fp4"}, exitUsage, "--kv-dtype: unknown dtype"},
		{[]string{"kv", "layout", "--layout", "paged"}, exitUsage, "--layout: unknown layout"},
		{[]string{"kv", "layout", "--block-size", "0"}, exitUsage, "--block-size must be > 0"},
		{[]string{"kv", "layout", "--prefill-tp", "2"}, exitUsage, "--prefill-tp and --decode-tp go together"},
		{[]string{"kv", "layout", "--prefill-tp", "2", "--decode-tp", "3"}, exitUsage, "tp 3 does not divide"},
		{[]string{"kv", "layout", "--model", "x", "--model-config", "y"}, exitUsage, "not both"},
		{[]string{"kv", "layout", "--model-config", "missing.json"}, exitUsage, "--model-config: open missing.json"},
		{[]string{"kv", "layout", "--no-such-flag"}, exitUsage, "unknown flag: --no-such-flag"},
		{[]string{"kv", "layout", "-o", "xml"}, exitUsage, `unknown output format "xml"`},
		{[]string{"kv", "layout", "--log-level", "loud"}, exitUsage, "--log-level"},
		{[]string{"nosuch"}, exitUsage, "unknown command"},
		{[]string{"probe", "ucx-leak", "--env", "UCX_TLS"}, exitUsage, `--env "UCX_TLS": want KEY=VALUE`},
		{[]string{"probe", "ucx-leak", "--env", "=x"}, exitUsage, "is not a variable name"},
		{[]string{"probe", "ucx-leak", "--interval", "0"}, exitUsage, "--interval must be > 0"},
		{[]string{"probe", "ucx-leak", "--interval", "-2s"}, exitUsage, "--interval must be > 0"},
		{[]string{"probe", "ucx-leak", "--duration", "1s", "--interval", "5s"}, exitUsage, "longer than --duration"},
		{[]string{"probe", "ucx-leak", "--churn-max", "lots"}, exitUsage, "--churn-max"},
		{[]string{"probe", "ucx-leak", "--model", "nope"}, exitUsage, `unknown model "nope"`},
		{[]string{"probe", "ucx-leak", "--isl", "100000000"}, exitUsage, "--isl must be between"},
		{[]string{"probe", "ucx-leak", "--model", "llama-3.1-405b", "--isl", "131072"}, exitUsage, "pool per side"},
		{[]string{"probe", "env", "--requests", "-1"}, exitUsage, "--requests must be between 0 and 10000"},
		{[]string{"probe", "env", "--backend", "rdma"}, exitUsage, `--backend "rdma": want auto, ucx or nixl`},
		{[]string{"probe", "env", "--requests", "0", "-o", "json"}, exitOK, ""},
	}
	for _, tc := range tests {
		code, _, stderr := runCLI(t, nil, tc.args...)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr)
		}
		if tc.stderr != "" && !strings.Contains(stderr, tc.stderr) {
			t.Errorf("%v: stderr %q does not contain %q", tc.args, stderr, tc.stderr)
		}
		if tc.code == exitUsage && strings.Count(strings.TrimSpace(stderr), "\n") > 1 {
			t.Errorf("%v: usage errors should be one line plus a hint, got %q", tc.args, stderr)
		}
		if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
			t.Errorf("%v: panicked: %s", tc.args, stderr)
		}
	}
}

// Precedence: flag > NIXLCTL_* environment > config file > default.
func TestOptionPrecedence(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	get := func(env map[string]string, args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(t, env, append([]string{"kv", "layout", "-o", "csv"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		head, row := strings.Split(lines[0], ","), strings.Split(lines[1], ",")
		for i, h := range head {
			if h == "block_size" {
				return row[i]
			}
		}
		t.Fatal("no block_size column")
		return ""
	}
	if got := get(nil); got != "16" {
		t.Errorf("default: %s", got)
	}
	writeFile(t, "nixlctl.yaml", "block-size: 32\nkv:\n  layout:\n    isl: 1024\n")
	if got := get(nil); got != "32" {
		t.Errorf("config file top-level key: %s", got)
	}
	writeFile(t, "nixlctl.yaml", "block-size: 32\nkv:\n  layout:\n    block-size: 48\n")
	if got := get(nil); got != "48" {
		t.Errorf("command section beats top level: %s", got)
	}
	if got := get(map[string]string{"NIXLCTL_BLOCK_SIZE": "64"}); got != "64" {
		t.Errorf("env beats file: %s", got)
	}
	if got := get(map[string]string{"NIXLCTL_BLOCK_SIZE": "64"}, "--block-size", "128"); got != "128" {
		t.Errorf("flag beats env: %s", got)
	}
	writeFile(t, "nixlctl.yaml", "kv:\n  layout:\n    blocksize: 48\n")
	code, _, errOut := runCLI(t, nil, "kv", "layout")
	if code != exitUsage || !strings.Contains(errOut, "kv.layout.blocksize is not an option") {
		t.Errorf("typo in config section: exit %d, %q", code, errOut)
	}
}
