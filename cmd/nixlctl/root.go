package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

const rootLong = `nixlctl benchmarks and diagnoses KV-cache transfers between the prefill and
decode (and encoder) workers of disaggregated LLM serving (vLLM, SGLang,
Dynamo, llm-d) over NIXL and UCX.

Every option can come from a flag, an environment variable or a config file,
in that order of precedence:
  flag            --block-size 64
  environment     NIXLCTL_BLOCK_SIZE=64
  config file     nixlctl.yaml in the current directory (or --config PATH,
                  or $NIXLCTL_CONFIG), with top-level keys for every command
                  and sections per command:
                      output: json
                      kv:
                        layout:
                          model: llama-3.1-70b
                          isl: 4096,32768

Exit codes: 0 success, 1 failure (or a failed check), 2 bad input, 130 interrupted
(SIGINT), 143 terminated (SIGTERM).`

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "nixlctl",
		Short:         "Benchmark and diagnose KV-cache transfers in disaggregated LLM serving",
		Long:          rootLong,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Resolve the global options once for every command.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.command = cmd.CommandPath()
			var g globalOptions
			// Not bindLeaf: the command's own bind resolves its
			// aliases, and their notes are printed once.
			if _, err := bind(cmd, &g, false); err != nil {
				return err
			}
			return a.applyGlobals(g)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return errkind.BadInput(err) })
	pf := root.PersistentFlags()
	pf.StringP("output", "o", "", "output format: table, json, csv, markdown or prom (default: table on a terminal, json otherwise)")
	pf.String("log-level", "warn", "log level on stderr: debug, info, warn or error")
	pf.String("config", "", "config file (default: ./nixlctl.yaml if present, or $NIXLCTL_CONFIG)")

	root.AddCommand(newKVCmd(a), newBenchCmd(a), newProbeCmd(a), newReportCmd(a), newGateCmd(a), newLeaseChaosCmd(a), newServeCmd(a), newVersionCmd(a))
	decimalFlags(root)
	refuseUnknownSubcommands(root)
	return root
}

// globalOptions are the persistent flags of the root command.
type globalOptions struct {
	Output   string `mapstructure:"output"`
	LogLevel string `mapstructure:"log-level"`
}

func (a *app) applyGlobals(g globalOptions) error {
	switch {
	case g.Output != "":
		f, err := report.ParseFormat(g.Output)
		if err != nil {
			return errkind.BadInput(err)
		}
		a.format = f
	case a.io.StdoutTTY:
		a.format = report.FormatTable
	default:
		a.format = report.FormatJSON
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.LogLevel)); err != nil {
		return errkind.BadInputf("--log-level %q: want debug, info, warn or error", g.LogLevel)
	}
	if a.stderr == nil {
		a.stderr = &switchWriter{w: a.io.ErrOut}
	}
	a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	return nil
}

// explicitOptions says whether an option was set by the user (flag,
// environment or config file, any spelling) rather than left at its
// default: a flag the chosen mode ignores is an error only then.
type explicitOptions func(flag string) bool

// bind resolves every flag of cmd (its own and inherited) with the
// precedence flag > NIXLCTL_* environment > config file > flag default,
// decodes the result into opts, whose fields carry mapstructure tags named
// after the flags, and tells which options were set. Flag variables
// themselves are never read: viper does not update them from the
// environment or the file. With aliases it resolves the deprecated
// spellings (aliasFlag) too.
func bind(cmd *cobra.Command, opts any, aliases bool) (explicitOptions, error) {
	v := viper.New()
	v.SetEnvPrefix("NIXLCTL")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	flags := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	flags.AddFlagSet(cmd.Flags())
	flags.AddFlagSet(cmd.InheritedFlags())
	if err := v.BindPFlags(flags); err != nil {
		return nil, err
	}
	shared, err := mergeConfigFile(v, cmd, flags)
	if err != nil {
		return nil, errkind.BadInput(err)
	}
	if aliases {
		if err := resolveAliases(v, flags, cmd.ErrOrStderr()); err != nil {
			return nil, err
		}
	}
	// Not weakly typed: a config file's 4.7 or true is no integer, 2 no
	// bool, 60 no duration (strictHook).
	strict := func(c *mapstructure.DecoderConfig) { c.WeaklyTypedInput = false }
	if err := v.Unmarshal(opts, viper.DecodeHook(decodeHook()), strict); err != nil {
		return nil, errkind.BadInput(decodeErrors(err))
	}
	// A top-level config key is a default for every command that has the
	// flag (shared settings), so it does not count as set for this one;
	// a flag, a variable or the command's own section does.
	set := func(name string) bool {
		f := flags.Lookup(name)
		return v.IsSet(name) && (f == nil || f.Changed || os.Getenv(envName(name)) != "" || !shared[name])
	}
	if err := checkDurations(v, flags); err != nil {
		return set, err
	}
	return set, checkFloats(v, flags)
}

// checkDurations refuses a negative value for any duration flag. No
// command has a use for one, and several read it as "no limit" or wait a
// negative time without noticing; checking the resolved values here
// (flag, environment or file) catches every command's before it starts.
func checkDurations(v *viper.Viper, flags *pflag.FlagSet) error {
	var err error
	flags.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Value.Type() != "duration" {
			return
		}
		if d := v.GetDuration(f.Name); d < 0 {
			err = errkind.BadInputf("--%s %v: a duration cannot be negative", f.Name, d)
		}
	})
	return err
}

// checkFloats refuses NaN and infinities for any float flag. Go's parser
// takes them, and no command has a use for one: compared with a bound,
// NaN passes every check (a rate of NaN ran, then the JSON result could
// not be written), and converted to a duration it wraps. Checked on the
// resolved values, like checkDurations, before any command starts.
func checkFloats(v *viper.Viper, flags *pflag.FlagSet) error {
	var err error
	flags.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Value.Type() != "float64" {
			return
		}
		if x := v.GetFloat64(f.Name); math.IsNaN(x) || math.IsInf(x, 0) {
			err = errkind.BadInputf("--%s %v: want a finite number", f.Name, x)
		}
	})
	return err
}

// configPath finds the config file: --config, $NIXLCTL_CONFIG, then
// ./nixlctl.yaml. An explicitly named file must exist.
func configPath(flags *pflag.FlagSet) (string, bool, error) {
	explicit, _ := flags.GetString("config")
	if explicit == "" {
		explicit = os.Getenv("NIXLCTL_CONFIG")
	}
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", false, fmt.Errorf("config file: %w", err)
		}
		return explicit, true, nil
	}
	if _, err := os.Stat("nixlctl.yaml"); err == nil {
		return "nixlctl.yaml", true, nil
	}
	return "", false, nil
}

// mergeConfigFile applies the config file's top-level scalar keys that
// name one of the command's flags, then the keys of the command's own
// section (`kv: layout: ...` for `nixlctl kv layout`), which must all name
// flags: a typo there is an error, not a silent no-op. It returns the keys
// that came from the top level only.
func mergeConfigFile(v *viper.Viper, cmd *cobra.Command, flags *pflag.FlagSet) (map[string]bool, error) {
	path, ok, err := configPath(flags)
	if err != nil || !ok {
		return nil, err
	}
	// Read through userfile, not viper's ReadInConfig: a FIFO or
	// /dev/zero named as the config must be refused, not waited on or
	// read until memory runs out.
	data, err := userfile.ReadFile(path, userfile.MaxSmall)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	file := viper.New()
	typ := strings.TrimPrefix(filepath.Ext(path), ".")
	if typ == "" {
		typ = "yaml"
	}
	if !slices.Contains(viper.SupportedExts, typ) {
		return nil, fmt.Errorf("config file %s: unsupported type %q (want %s)", path, typ, strings.Join(viper.SupportedExts, ", "))
	}
	file.SetConfigType(typ)
	if err := file.ReadConfig(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	all := file.AllSettings()
	eff, shared := map[string]any{}, map[string]bool{}
	var unknownTop []error
	for k, val := range all {
		_, isMap := val.(map[string]any)
		switch {
		case !isMap && flags.Lookup(k) != nil:
			eff[k], shared[k] = val, true
		case !isMap && !anyCommandHasFlag(cmd.Root(), k) && subcommand(cmd.Root(), k) == nil:
			// A top-level key is a default for the commands with that
			// flag; one that no command has (requets: 4) did nothing.
			unknownTop = append(unknownTop, fmt.Errorf("%s: %s is not an option of any nixlctl command", path, k))
		}
	}
	if len(unknownTop) > 0 {
		return nil, errors.Join(unknownTop...)
	}
	// A command's name holds a section: `kv: 3` (or a list) used to be
	// ignored, every key of it silently unused. Checked on the way down
	// from the root to this command, at every level.
	section, level := all, cmd.Root()
	var sectionPath []string
	var unknown []error
	for _, seg := range append(commandSegments(cmd), "") {
		for k, val := range section {
			_, isMap := val.(map[string]any)
			name := strings.Join(append(sectionPath[:len(sectionPath):len(sectionPath)], k), ".")
			switch sub := subcommand(level, k); {
			case !isMap && sub != nil:
				unknown = append(unknown, fmt.Errorf("%s: %s is a section (the options of %q), not a value", path, name, sub.CommandPath()))
			case isMap && sub == nil && level != cmd.Root():
				// Below the top level a section is a subcommand's:
				// a misspelt one, or an option given a section, would
				// be ignored.
				unknown = append(unknown, fmt.Errorf("%s: %s is not a subcommand of %q (an option takes a value, not a section)", path, name, level.CommandPath()))
			}
		}
		if seg == "" {
			break
		}
		next, ok := section[seg].(map[string]any)
		if !ok {
			section = nil
			break
		}
		section, sectionPath, level = next, append(sectionPath, seg), subcommand(level, seg)
	}
	if len(unknown) > 0 {
		return nil, errors.Join(unknown...)
	}
	for k, val := range section {
		if _, isMap := val.(map[string]any); isMap {
			continue // a deeper command's section (checked above)
		}
		if flags.Lookup(k) == nil {
			unknown = append(unknown, fmt.Errorf("%s: %s.%s is not an option of %q", path, strings.Join(sectionPath, "."), k, cmd.CommandPath()))
			continue
		}
		eff[k] = val
		delete(shared, k)
	}
	if len(unknown) > 0 {
		return nil, errors.Join(unknown...)
	}
	return shared, v.MergeConfigMap(eff)
}

// anyCommandHasFlag says whether c or a command below it has the flag
// (its own, persistent or an alias).
func anyCommandHasFlag(c *cobra.Command, name string) bool {
	if c.Flags().Lookup(name) != nil || c.PersistentFlags().Lookup(name) != nil {
		return true
	}
	for _, sub := range c.Commands() {
		if anyCommandHasFlag(sub, name) {
			return true
		}
	}
	return false
}

// subcommand is c's subcommand called name, or nil.
func subcommand(c *cobra.Command, name string) *cobra.Command {
	for _, sub := range c.Commands() {
		if sub.Name() == name {
			return sub
		}
	}
	return nil
}

// commandSegments is the command path below the root: ["kv", "layout"].
func commandSegments(cmd *cobra.Command) []string {
	var segs []string
	for c := cmd; c != nil && c.HasParent(); c = c.Parent() {
		segs = append([]string{c.Name()}, segs...)
	}
	return segs
}
