package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A deprecated spelling resolves like its canonical flag from every
// source, with one note on stderr; the canonical spelling is silent, and
// both spellings at one level are refused. kv layout's --tokens/--isl
// stands for every alias: they share aliasFlag and resolveAliases.
func TestFlagAliases(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		env    map[string]string
		args   []string
		code   int
		tokens string // the tokens column of the result
		note   string // "" means stderr must be empty
	}{
		{"canonical flag", "", nil, []string{"--isl", "1k"}, exitOK, "1024", ""},
		{"alias flag", "", nil, []string{"--tokens", "1k"}, exitOK, "1024", "nixlctl: --tokens is deprecated, use --isl\n"},
		{"alias env", "", map[string]string{"NIXLCTL_TOKENS": "2k"}, nil, exitOK, "2048", "nixlctl: NIXLCTL_TOKENS is deprecated, use NIXLCTL_ISL\n"},
		{"alias file", "tokens: 3k\n", nil, nil, exitOK, "3072", "nixlctl: config key tokens is deprecated, use isl\n"},
		{"alias file section", "kv:\n  layout:\n    tokens: 3k\n", nil, nil, exitOK, "3072", "nixlctl: config key tokens is deprecated, use isl\n"},
		{"canonical flag beats alias env", "", map[string]string{"NIXLCTL_TOKENS": "2k"}, []string{"--isl", "1k"}, exitOK, "1024", "NIXLCTL_TOKENS is deprecated"},
		{"alias flag beats canonical env", "", map[string]string{"NIXLCTL_ISL": "2k"}, []string{"--tokens", "1k"}, exitOK, "1024", "--tokens is deprecated"},
		{"alias env beats canonical file", "isl: 3k\n", map[string]string{"NIXLCTL_TOKENS": "2k"}, nil, exitOK, "2048", "NIXLCTL_TOKENS is deprecated"},
		{"both flags", "", nil, []string{"--isl", "1k", "--tokens", "2k"}, exitUsage, "", "error: --tokens and --isl are the same option: give one"},
		{"both env", "", map[string]string{"NIXLCTL_ISL": "1k", "NIXLCTL_TOKENS": "2k"}, nil, exitUsage, "", "error: NIXLCTL_TOKENS and NIXLCTL_ISL are the same option"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			if tc.file != "" {
				writeFile(t, "nixlctl.yaml", tc.file)
			}
			code, out, errOut := runCLI(t, tc.env, append([]string{"kv", "layout", "-o", "csv"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errOut)
			}
			if tc.note == "" && errOut != "" || !strings.Contains(errOut, tc.note) {
				t.Errorf("stderr %q, want %q", errOut, tc.note)
			}
			if code != exitOK {
				if out != "" {
					t.Errorf("stdout %q on bad input", out)
				}
				return
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			head, row := strings.Split(lines[0], ","), strings.Split(lines[1], ",")
			for i, h := range head {
				if h == "tokens" && row[i] != tc.tokens {
					t.Errorf("tokens %s, want %s", row[i], tc.tokens)
				}
			}
		})
	}
}

// Every alias names a flag of its own command and is hidden from --help.
func TestAliasFlagsWellFormed(t *testing.T) {
	root := newRootCmd(&app{io: &ioStreams{}})
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			canon := f.Annotations[aliasAnnotation]
			if len(canon) == 0 {
				return
			}
			n++
			if !f.Hidden {
				t.Errorf("%s --%s: alias not hidden", c.CommandPath(), f.Name)
			}
			if c.LocalFlags().Lookup(canon[0]) == nil {
				t.Errorf("%s --%s: alias of missing --%s", c.CommandPath(), f.Name, canon[0])
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if n == 0 {
		t.Fatal("no aliases found")
	}
}

// A flag the mode ignores is refused when the user set it for this
// command: by flag, variable or the command's config section; a
// top-level config key is a default shared by every command with the
// flag, and a default is never an error. An unknown --backend stops every run
// that gets past the check.
func TestIgnoredFlagSources(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		env     map[string]string
		args    []string
		refused bool
	}{
		{"default", "", nil, nil, false},
		{"flag", "", nil, []string{"--chunk-tokens", "64"}, true},
		{"env", "", map[string]string{"NIXLCTL_CHUNK_TOKENS": "64"}, nil, true},
		{"command section", "bench:\n  pull:\n    chunk-tokens: 64\n", nil, nil, true},
		{"top-level key", "chunk-tokens: 64\n", nil, nil, false},
		{"top-level key, then the section", "chunk-tokens: 64\nbench:\n  pull:\n    chunk-tokens: 32\n", nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			if tc.file != "" {
				writeFile(t, "nixlctl.yaml", tc.file)
			}
			args := append([]string{"bench", "pull", "--inproc", "--requests", "1000000", "--backend", "nope"}, tc.args...)
			code, _, errOut := runCLI(t, tc.env, args...)
			if code != exitUsage {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if got := strings.Contains(errOut, "--chunk-tokens: bench pull does not use it"); got != tc.refused {
				t.Errorf("refused %v, want %v: %s", got, tc.refused, errOut)
			}
		})
	}
}
