package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/htmlreport"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

type gateOptions struct {
	Baselines     []string `mapstructure:"baseline"`
	Results       []string `mapstructure:"result"`
	MaxRegression string   `mapstructure:"max-regression"`
	Metrics       []string `mapstructure:"metric"`
	Repeat        int      `mapstructure:"repeat"`
	NoiseCeiling  string   `mapstructure:"noise-ceiling"`
	HTML          string   `mapstructure:"html"`
	Binary        string   `mapstructure:"binary"`
	BaseBinary    string   `mapstructure:"baseline-binary"`
	JudgeShared   bool     `mapstructure:"judge-shared"`
	Reruns        int      `mapstructure:"reruns"`
}

const gateLong = `Compare a result with a baseline and fail on a regression, for CI.

By default the gate compares the efficiency ratios (bench xfer: efficiency per
sweep point; bench pull|push|sglang: efficiency_vs_memcpy and, when measured,
efficiency_vs_xfer and span_efficiency_vs_xfer): each is measured against a reference taken in the same run
on the same machine, so it carries across machines and noisy neighbours.
Absolute numbers only when named: --metric bandwidth_gbps, --metric
handoff_latency_ms.p99, --metric latency_us.p99 (a key selects it at every sweep
point; "key[WRITE 4 KiB x 1]" one point).

Each metric's verdict: pass (within --max-regression either way), regression
(worse by more than allowed), improvement (better by more), or noise: a change
beyond the allowance that the runs do not confirm. With three runs or more on
both sides (a baseline and results made with --repeat, or several --result
files) that is a one-sided exact Mann-Whitney U test on the runs' values
("worse" needs p <= 0.05); otherwise the latency histograms behind the metric
(a Mann-Whitney U test on the buckets: "slower" or "faster" needs p < 0.01 and
Cliff's |delta| >= 0.147), or, with three runs or more, a baseline within the
runs' range. A change beyond --noise-ceiling (default 50%, or twice --max-regression) is never
called noise: the tests compare typical requests or a few runs, and a run that
froze for most of its time has typical requests too. Only regressions fail.
docs/ci-gates.md gives the false-alarm rate
and power measured on this project's hosts, and scripts/gate-error-rates.sh
measures them on yours.

Runs: --result FILE|DIR (repeatable) takes the median of those results, a
result made with --repeat N counting as its N runs (--baseline too: several
are pooled, so runs made in turns with two builds can be judged later); without --result,
--repeat N runs the command recorded in the baseline (its "args", --repeat
included) N times with this nixlctl and takes the median.

A/B: --baseline-binary OLD with --repeat N also runs the baseline's command N
times with OLD, alternating with this build's runs (old, new, new, old, ...),
and judges against those runs instead of the saved baseline's numbers. Both
sides then meet the same state of the host; a baseline saved on another day
meets only its own. --binary NEW runs this side with another nixlctl (default:
this one), so one gate can compare two builds. docs/ci-gates.md gives the
error rates of both ways on a noisy host.

A neighbour: a run whose result says other processes took a quarter of a CPU
or more on average while it measured (host_others_cpu) moved with their load,
either way, by up to 10x on a 2-core host. Such runs are listed, and set aside
when three or more runs of their side were not moved (--judge-shared judges
them all); with --repeat the gate also runs such a run again, up to --reruns
extra runs a side (default: as many as --repeat).

The Markdown summary goes to stdout (-o markdown or table) and is appended to
$GITHUB_STEP_SUMMARY when that is set. Exit codes: 0 pass, 1 regression,
2 usage error (bad flags, unreadable or mismatched files).`

func newGateCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gate --baseline FILE (--result FILE... | --repeat N)",
		Short: "Fail CI on a performance regression against a baseline",
		Long:  gateLong,
		Example: `  nixlctl gate --baseline ci/baseline-push/ --result run/
  nixlctl gate --baseline base.json --result a.json --result b.json --result c.json --max-regression 3%
  nixlctl gate --baseline base.json --repeat 3 --metric efficiency --metric latency_us.p99
  nixlctl gate --baseline base/ --repeat 5 --baseline-binary ./main/nixlctl --binary ./pr/nixlctl`,
		Args: cobra.NoArgs,
		RunE: bound(a.runGate),
	}
	f := cmd.Flags()
	f.StringArray("baseline", nil, "the baseline result (file or --save directory); repeatable: the runs of several are pooled, as --result's are")
	f.StringArray("result", nil, "a result to judge (repeatable: the median is judged)")
	f.String("max-regression", "5%", "allowed change in the worse direction: a percentage (5%) or a fraction below 1 (0.05)")
	f.StringArray("metric", nil, "gate on this metric key instead of the efficiency ratios (repeatable)")
	f.Int("repeat", 0, "without --result: run the baseline's command this many times")
	f.String("noise-ceiling", "", "the largest change the noise tests may explain away; beyond it a change is a regression or an improvement by its size alone (default 50%, or twice --max-regression where that is more)")
	f.String("baseline-binary", "", "with --repeat: also re-run the baseline's command with this nixlctl, interleaved with the runs, and judge against those runs (A/B on the same host state)")
	f.String("binary", "", "with --repeat: the nixlctl that makes the runs (default: this one)")
	f.Bool("judge-shared", false, "judge every run, also those a neighbour moved (other processes took a quarter of a CPU or more on average while they measured); by default they are set aside when three or more runs of their side were not")
	f.Int("reruns", -1, "with --repeat: at most this many extra runs a side, each replacing a run a neighbour moved; -1: as many as --repeat, 0: none")
	f.String("html", "", "also write the judgement as one self-contained HTML page (each metric's runs as points) to this .html file")
	return cmd
}

// parseFraction reads "5%" or "0.05". A bare number of 1 or more is
// refused: "5" read as a fraction allowed a 500% regression, and whoever
// wrote it almost certainly meant 5%.
func parseFraction(flag, s string) (float64, error) {
	num, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	num = strings.TrimSpace(num)
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("--%s %q: want a percentage like 5%% or a fraction like 0.05", flag, s)
	}
	if pct {
		return v / 100, nil
	}
	if v >= 1 {
		return 0, fmt.Errorf("--%s %q: a number without %% is a fraction and must be below 1; write %s%% for %s percent", flag, s, num, num)
	}
	return v, nil
}

func (a *app) runGate(ctx context.Context, o gateOptions) error {
	maxReg, ceiling, err := a.checkGate(o)
	if err != nil {
		return err
	}
	in, err := loadGateInputs(o)
	if err != nil {
		return err
	}
	if err := a.rerunGate(ctx, o, in); err != nil {
		return err
	}
	g, err := report.Gate(in.base.Result, in.runs, report.GateOptions{MaxRegression: maxReg, Metrics: o.Metrics, NoiseCeiling: ceiling, BaselineRuns: in.baseRuns, JudgeMoved: o.JudgeShared})
	if err != nil {
		return errkind.BadInput(err)
	}
	if o.BaseBinary != "" {
		g.BaselineReruns = len(in.baseRuns)
	}
	for _, a := range in.altered {
		g.Refuse(a)
	}
	if o.HTML != "" {
		labels := runLabels(o.Results)
		for i := 0; i < o.Repeat; i++ {
			labels = append(labels, fmt.Sprintf("run %d", i+1))
		}
		page := htmlreport.BuildGate(g, "baseline "+strings.Join(runLabels(o.Baselines), ", "), in.base.Result, labels, in.runs, version)
		if err := writePage("html", o.HTML, page); err != nil {
			return err
		}
	}
	a.appendStepSummary(g)
	// -o prom is refused before the runs (checkGate), and by the report
	// too.
	if err := report.Write(a.io.Out, a.format, g); err != nil {
		return err
	}
	if len(g.Refused) > 0 {
		return errkind.CheckFailedf("gate refused: %s", strings.Join(g.Refused, "; "))
	}
	if !g.Passed {
		n := 0
		for _, r := range g.Rows {
			if r.Verdict == report.Regression {
				n++
			}
		}
		return errkind.CheckFailedf("%d metric(s) regressed beyond %s", n, o.MaxRegression)
	}
	return nil
}

// checkGate validates the gate's flags, before any --repeat run spends
// minutes, and returns its allowance and noise ceiling.
func (a *app) checkGate(o gateOptions) (maxReg, ceiling float64, err error) {
	if a.format == report.FormatProm {
		return 0, 0, errkind.BadInput(report.FormatError("gate", a.format))
	}
	if len(o.Baselines) == 0 {
		return 0, 0, errkind.BadInputf("--baseline is required")
	}
	if maxReg, err = parseFraction("max-regression", o.MaxRegression); err != nil {
		return 0, 0, errkind.BadInput(err)
	}
	ceiling = max(report.DefaultNoiseCeiling, 2*maxReg)
	if o.NoiseCeiling != "" {
		if ceiling, err = parseFraction("noise-ceiling", o.NoiseCeiling); err != nil {
			return 0, 0, errkind.BadInput(err)
		}
	}
	if ceiling <= maxReg {
		return 0, 0, errkind.BadInputf("--noise-ceiling %s must be above --max-regression %s (a change between the two is what the noise tests judge)", o.NoiseCeiling, o.MaxRegression)
	}
	switch {
	case len(o.Results) > 0 && o.Repeat > 0:
		return 0, 0, errkind.BadInputf("use --result or --repeat, not both")
	case len(o.Results) == 0 && o.Repeat <= 0:
		return 0, 0, errkind.BadInputf("give --result FILE (repeatable) or --repeat N")
	}
	if (o.Binary != "" || o.BaseBinary != "") && o.Repeat <= 0 {
		return 0, 0, errkind.BadInputf("--binary and --baseline-binary choose what --repeat runs: give --repeat N")
	}
	if o.BaseBinary != "" && len(o.Baselines) > 1 {
		return 0, 0, errkind.BadInputf("--baseline-binary makes the baseline's runs: give one --baseline (whose command it re-runs), not %d", len(o.Baselines))
	}
	for _, b := range [][2]string{{"binary", o.Binary}, {"baseline-binary", o.BaseBinary}} {
		if b[1] != "" {
			if err := checkExecutable(b[0], b[1]); err != nil {
				return 0, 0, err
			}
		}
	}
	if o.HTML != "" {
		if err := checkHTMLFile("html", o.HTML, ""); err != nil {
			return 0, 0, err
		}
	}
	if o.Reruns < -1 {
		return 0, 0, errkind.BadInputf("--reruns %d: want 0 or more, or -1 for as many as --repeat", o.Reruns)
	}
	return maxReg, ceiling, nil
}

// gateInputs are what the gate judges: the baseline (the first
// --baseline), the baseline's runs (several --baseline files pooled, or
// --baseline-binary's re-runs), the runs judged, and what was altered in
// the saved files read.
type gateInputs struct {
	base     *report.Loaded
	baseRuns []report.Result
	runs     []report.Result
	altered  []string
}

// loadGateInputs reads the --baseline and --result files. A saved run
// edited since (its checksums differ) is not judged: a failed baseline
// edited to "failed": 0 passed as healthy.
func loadGateInputs(o gateOptions) (*gateInputs, error) {
	in := &gateInputs{}
	for i, p := range o.Baselines {
		l, err := loadResult(p)
		if err != nil {
			return nil, err
		}
		what := "baseline"
		if len(o.Baselines) > 1 {
			what = fmt.Sprintf("baseline %d", i+1)
			// Several baselines: their runs pooled, as --result's are.
			in.baseRuns = append(in.baseRuns, l.Result)
		}
		for _, a := range l.Altered {
			in.altered = append(in.altered, what+": "+a)
		}
		if in.base == nil {
			in.base = l
		}
	}
	for i, p := range o.Results {
		l, err := loadResult(p)
		if err != nil {
			return nil, err
		}
		for _, a := range l.Altered {
			in.altered = append(in.altered, fmt.Sprintf("result %d: %s", i+1, a))
		}
		in.runs = append(in.runs, l.Result)
	}
	return in, nil
}

// rerunGate makes --repeat's runs of the baseline's command: with
// --binary's nixlctl (else this one) and, with --baseline-binary, as
// many with that one, in turns. A run a neighbour moved is made again,
// up to --reruns extra runs a side; it stays with the others, and the
// gate sets it aside when enough runs it did not move remain.
func (a *app) rerunGate(ctx context.Context, o gateOptions, in *gateInputs) error {
	if o.Repeat <= 0 {
		return nil
	}
	left := map[bool]int{false: o.Reruns, true: o.Reruns} // by rerunSide.ofBaseline
	if o.Reruns < 0 {
		left[false], left[true] = o.Repeat, o.Repeat
	}
	if o.JudgeShared {
		left[false], left[true] = 0, 0
	}
	this := rerunSide{exe: o.Binary, name: o.Binary}
	if this.exe == "" {
		var err error
		if this.exe, err = ctl.SelfExe(); err != nil {
			return err
		}
		this.name = "nixlctl"
	}
	old := rerunSide{exe: o.BaseBinary, name: o.BaseBinary, ofBaseline: true}
	for i := 0; i < o.Repeat; i++ {
		// Alternating which side goes first (old, new, new, old, ...)
		// keeps a drift of the host within a pair from favouring one.
		// The sides are told apart by role, not by path: the same
		// binary on both is a valid A/A check.
		sides := []rerunSide{this}
		if old.exe != "" {
			sides = []rerunSide{old, this}
			if i%2 == 1 {
				sides = []rerunSide{this, old}
			}
		}
		for _, side := range sides {
			for {
				r, err := rerun(ctx, a, in.base.Result.Header(), side, i+1, o.Repeat)
				if err != nil {
					return err
				}
				if side.ofBaseline {
					in.baseRuns = append(in.baseRuns, r)
				} else {
					in.runs = append(in.runs, r)
				}
				// A --repeat result (a baseline saved with it) is judged
				// run by run instead: the gate sets aside its moved runs.
				if r.Header().Repeats != nil || !report.NeighbourMoved(r) || left[side.ofBaseline] == 0 {
					break
				}
				left[side.ofBaseline]--
				fmt.Fprintf(a.io.ErrOut, "gate: a neighbour moved that run (%s): running it again (%d more re-run(s) allowed on its side)\n",
					r.(report.HostSharer).SharedHost(), left[side.ofBaseline])
			}
		}
	}
	return nil
}

// appendStepSummary adds the verdict in Markdown to the file
// GITHUB_STEP_SUMMARY names, as a GitHub Actions step's summary; a
// failure to is logged, not fatal.
func (a *app) appendStepSummary(g *report.GateReport) {
	path := os.Getenv("GITHUB_STEP_SUMMARY")
	if path == "" {
		return
	}
	var md bytes.Buffer
	err := g.WriteMarkdown(&md)
	// userfile.CheckOutput: a FIFO there would block the gate's exit.
	if err == nil {
		err = userfile.CheckOutput(path)
	}
	var f *os.File
	if err == nil {
		f, err = os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	}
	if err == nil {
		_, err = f.Write(append(md.Bytes(), '\n'))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		a.log.Warn("GITHUB_STEP_SUMMARY", "err", err)
	}
}

// flagsNotRerun are the baseline's flags a re-run drops: where it wrote
// its output, and how it showed progress. Those with a value take it.
var flagsNotRerun = map[string]bool{"output": true, "o": true, "save": true, "plot": true, "html": true, "records": true, "tui": false}

// rerunArgs removes flagsNotRerun from args (in any of the forms --f v,
// --f=v, -o v, -ov) and asks for JSON without a terminal view.
func rerunArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, hasValue := "", false
		switch {
		case strings.HasPrefix(arg, "--"):
			name, _, hasValue = strings.Cut(arg[2:], "=")
		case strings.HasPrefix(arg, "-o"):
			name, hasValue = "o", len(arg) > 2
		default:
			out = append(out, arg)
			continue
		}
		takesValue, drop := flagsNotRerun[name]
		if !drop {
			out = append(out, arg)
			continue
		}
		if takesValue && !hasValue {
			i++ // skip the value
		}
	}
	return append(out, "-o", "json", "--tui=off")
}

// rerunSide is a nixlctl that makes one side's runs in a gate: this
// build's, or the baseline's (gate --baseline-binary).
type rerunSide struct {
	exe        string // what runs
	name       string // how the log names it
	ofBaseline bool
}

// rerun runs the baseline's command again with s's nixlctl.
func rerun(ctx context.Context, a *app, base *report.Meta, s rerunSide, i, n int) (report.Result, error) {
	if len(base.Args) == 0 {
		return nil, errkind.BadInputf("--repeat: the baseline does not record its command line (an older result); run it yourself and pass --result")
	}
	args := rerunArgs(base.Args)
	side := ""
	if s.ofBaseline {
		side = " (baseline)"
	}
	fmt.Fprintf(a.io.ErrOut, "gate: run %d/%d%s: %s %s\n", i, n, side, s.name, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, s.exe, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, a.io.ErrOut
	// Interrupted, the run is asked to stop as a Ctrl-C would (it then
	// stops its endpoints); killed, the gate takes it along (SIGTERM,
	// the same clean stop), where it used to leave the run and its
	// endpoints going for seconds.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = ctl.DefaultGrace
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("gate: run %d%s of %q failed: %w", i, side, strings.Join(args, " "), err)
	}
	r, err := report.DecodeResult(out.Bytes())
	if err != nil {
		return nil, fmt.Errorf("gate: run %d%s: %w", i, side, err)
	}
	return r, nil
}

// checkExecutable refuses a --binary that cannot run, before any run
// spends minutes.
func checkExecutable(flag, path string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return errkind.BadInputf("--%s: %v", flag, err)
	case st.IsDir() || st.Mode().Perm()&0o111 == 0:
		return errkind.BadInputf("--%s %s: not an executable file", flag, path)
	}
	return nil
}
