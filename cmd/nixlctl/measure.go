package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/htmlreport"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/plots"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/tui"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// tuiDelay is how long a run goes before the automatic TUI appears:
// short runs just print their result.
const tuiDelay = 3 * time.Second

// measureOptions are the flags every measuring command shares.
type measureOptions struct {
	TUI           string `mapstructure:"tui"`
	Plot          string `mapstructure:"plot"`
	HTML          string `mapstructure:"html"`
	Save          string `mapstructure:"save"`
	Records       string `mapstructure:"records"`
	AllowFailures bool   `mapstructure:"allow-failures"`
	// Repeat runs the command this many times and reports their spread.
	Repeat int `mapstructure:"repeat"`

	// stream is set by streamRecords for a runner that streams its
	// records; keep then completes what it wrote instead of writing them.
	stream *recordsStream
}

// snapshot is what a runner that streams no records (bench xfer, bench
// ec) calls to leave its result as it stands in --save DIR while it runs,
// so that a killed run leaves a partial result there; nil without --save,
// or with --repeat (whose runs would overwrite one another).
func (a *app) snapshot(o measureOptions) func(report.Result) error {
	if o.Save == "" || o.Repeat > 1 {
		return nil
	}
	return func(r report.Result) error {
		r.Header().Args = a.args
		return report.SaveSnapshot(o.Save, r)
	}
}

// streamRecords returns the sink a streaming runner (bench pull|push|
// sglang) writes its records to as it goes: --records FILE and --save
// DIR's records.jsonl, so that a driver killed mid-run leaves what it
// measured. Nil when neither flag is given.
func (o *measureOptions) streamRecords(args []string) report.RecordsSink {
	if o.Records == "" && o.Save == "" {
		return nil
	}
	o.stream = &recordsStream{records: o.Records, save: o.Save, args: args}
	return o.stream
}

// recordsStream is the CLI's report.RecordsSink. Its files are created
// when the runner begins its timed phase, not before, so a run that fails
// in setup leaves none (as before streaming).
type recordsStream struct {
	records, save string
	args          []string
	w             *report.RecordsWriter
	closed        bool
	err           error
}

func (s *recordsStream) Begin(r report.Result, header any) error {
	var paths []string
	if s.save != "" {
		// First, so that --records may name a file inside it.
		if err := os.MkdirAll(s.save, 0o755); err != nil {
			return fmt.Errorf("--save: %w", err)
		}
		paths = append(paths, filepath.Join(s.save, report.RecordsName))
	}
	if s.records != "" {
		paths = append(paths, s.records)
	}
	w, err := report.CreateRecords(paths...)
	if err != nil {
		return errkind.BadInput(err) // the runner names it records; the error names the file
	}
	s.w = w
	if err := w.Header(header); err != nil {
		return err
	}
	if s.save != "" {
		// A result to show if the run never gets to write its own.
		r.Header().Args = s.args
		if err := report.SaveProvisional(s.save, r); err != nil {
			return fmt.Errorf("--save %s: %w", s.save, err)
		}
	}
	return nil
}

func (s *recordsStream) Record(rec any) error { return s.w.Append(rec) }

// close closes the files once; the error is the first of writing or
// closing them.
func (s *recordsStream) close() error {
	if s == nil || s.w == nil || s.closed {
		return s.closeErr()
	}
	s.closed = true
	s.err = s.w.Close()
	return s.err
}

func (s *recordsStream) closeErr() error {
	if s == nil {
		return nil
	}
	return s.err
}

// began says the files were created (the runner got to its timed phase).
func (s *recordsStream) began() bool { return s != nil && s.w != nil }

// addMeasureFlags declares --tui, --plot, --save and, for commands that
// keep per-request records, --records.
func addMeasureFlags(cmd *cobra.Command, records bool) {
	f := cmd.Flags()
	f.String("tui", "auto", "live terminal view: auto (when stdin and stdout are terminals, once the run passes 3 s), on, off; --tui alone means on")
	f.Lookup("tui").NoOptDefVal = "on"
	f.String("plot", "", "draw the result into this .png or .svg file")
	f.String("html", "", "write the result as one self-contained HTML page to this .html file (see nixlctl report html)")
	f.String("save", "", "keep result.json, records.jsonl and manifest.json in this directory (see nixlctl report show)")
	f.Int("repeat", 1, "run the whole measurement this many times, one after another: the result is the run at the median of its main metric, with every metric's min, median, max and 95% interval over the runs (gate judges them all)")
	f.Bool("allow-failures", false, "exit 0 even when requests failed, blocks leaked or were corrupt, or the run was interrupted (the result still lists them, and gate still refuses it)")
	if records {
		f.String("records", "", "write one JSON line per request to this file (a header line first)")
	}
}

func (o *measureOptions) validate() error {
	if o.Repeat < 1 {
		return errkind.BadInputf("--repeat %d: want 1 or more runs", o.Repeat)
	}
	switch strings.ToLower(o.TUI) {
	case "auto", "":
		o.TUI = "auto"
	case "on", "true", "1":
		o.TUI = "on"
	case "off", "false", "0":
		o.TUI = "off"
	default:
		return errkind.BadInputf("--tui %q: want auto, on or off", o.TUI)
	}
	if o.Plot != "" {
		if _, err := plots.FormatOf(o.Plot); err != nil {
			return errkind.BadInput(err)
		}
	}
	// The outputs are written after the run: a path that cannot be written
	// must be refused now, not after minutes of measuring.
	if o.Save != "" {
		if err := checkSaveDir(o.Save); err != nil {
			return err
		}
	}
	if o.HTML != "" {
		if err := checkHTMLFile("html", o.HTML, o.Save); err != nil {
			return err
		}
	}
	for _, f := range []struct{ flag, path string }{{"plot", o.Plot}, {"records", o.Records}} {
		if f.path != "" {
			if err := checkOutputFile(f.flag, f.path, o.Save); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSaveDir accepts a --save directory that can be created (its
// nearest existing ancestor is a writable directory), an empty one, or
// one holding a saved result (saving again replaces it). A directory with
// other files is refused: Save would mix a result into someone's data.
func checkSaveDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR):
		return checkCreatable("save", dir, nearestExisting(dir))
	case err != nil:
		return errkind.BadInputf("--save %s: %v", dir, err)
	case !st.IsDir():
		return errkind.BadInputf("--save %s: exists and is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return errkind.BadInputf("--save %s: %v", dir, err)
	}
	if len(entries) > 0 && !isSavedResult(dir) {
		return errkind.BadInputf("--save %s: a non-empty directory that holds no saved result (no %s or %s); give a new or empty directory",
			dir, report.ResultName, report.ManifestName)
	}
	return checkWritable("save", dir, dir)
}

func isSavedResult(dir string) bool {
	for _, name := range []string{report.ManifestName, report.ResultName} {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && st.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// checkOutputFile accepts a file path whose directory exists and is
// writable, or is the --save directory (created before anything is
// written), and that is not itself a directory, a FIFO (writing it
// would block until a reader appears) or any other special file.
func checkOutputFile(flag, path, saveDir string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return errkind.BadInputf("--%s %s: is a directory", flag, path)
	}
	if err := userfile.CheckOutput(path); err != nil {
		return errkind.BadInputf("--%s: %v", flag, err)
	}
	parent := filepath.Dir(path)
	if saveDir != "" && filepath.Clean(parent) == filepath.Clean(saveDir) {
		return nil // checked as --save
	}
	st, err := os.Stat(parent)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR):
		return errkind.BadInputf("--%s %s: directory %s does not exist", flag, path, parent)
	case err != nil:
		return errkind.BadInputf("--%s %s: %v", flag, path, err)
	case !st.IsDir():
		return errkind.BadInputf("--%s %s: %s is not a directory", flag, path, parent)
	}
	return checkWritable(flag, path, parent)
}

// nearestExisting is the closest ancestor of path that exists (MkdirAll
// creates the rest).
func nearestExisting(path string) string {
	p := filepath.Clean(path)
	for {
		parent := filepath.Dir(p)
		if _, err := os.Stat(parent); err == nil || parent == p {
			return parent
		}
		p = parent
	}
}

func checkCreatable(flag, path, ancestor string) error {
	st, err := os.Stat(ancestor)
	if err != nil {
		return errkind.BadInputf("--%s %s: %v", flag, path, err)
	}
	if !st.IsDir() {
		return errkind.BadInputf("--%s %s: %s is not a directory", flag, path, ancestor)
	}
	if err := checkWritable(flag, path, ancestor); err != nil {
		return err
	}
	// access(2) says yes to root everywhere, /proc and read-only mounts
	// included (--save /proc/nope failed after the run): make a directory
	// there, as the save will, and take it away again.
	probe, err := os.MkdirTemp(ancestor, ".nixlctl-check-")
	if err != nil {
		return errkind.BadInputf("--%s %s: cannot create a directory in %s (%v)", flag, path, ancestor, errors.Unwrap(err))
	}
	return os.Remove(probe)
}

func checkWritable(flag, path, dir string) error {
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return errkind.BadInputf("--%s %s: directory %s is not writable (%v)", flag, path, dir, err)
	}
	return nil
}

// runner is a measuring command's run: it reports progress to sink and
// returns its result (nil when nothing was measured) and error.
type runner func(ctx context.Context, sink live.Sink) (report.Result, error)

// measureAndRender runs a measuring command (measure) and renders what it
// measured, also when the run stopped early; it returns the result (nil
// when nothing was measured) and the run's error.
func (a *app) measureAndRender(ctx context.Context, mo measureOptions, run runner) (report.Result, error) {
	res, runErr := a.measure(ctx, mo, run)
	if res == nil {
		return nil, runErr
	}
	if err := a.render(res); err != nil {
		return res, err
	}
	return res, runErr
}

// measure runs a measuring command with a live display: the TUI when stdin
// and stdout are terminals and --tui allows it, else the progress bar on
// stderr. It then records the command line in the result and writes the
// records, the saved directory and the plot that were asked for; the
// caller renders the result to stdout.
func (a *app) measure(ctx context.Context, mo measureOptions, run runner) (report.Result, error) {
	if mo.Repeat > 1 {
		run = a.repeated(mo.Repeat, run)
	}
	useTUI := a.wantsTUI(mo)
	if mo.TUI == "on" && !useTUI {
		a.log.Info("--tui needs stdin and stdout to be terminals; showing progress on stderr instead")
	}
	var res report.Result
	var err error
	if useTUI {
		delay := tuiDelay
		if mo.TUI == "on" {
			delay = 0
		}
		res, err = a.withTUI(ctx, delay, run)
	} else {
		p := live.NewProgress(a.io.ErrOut, a.io.StderrTTY)
		res, err = run(ctx, p)
		p.Close()
	}
	if cerr := mo.stream.close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("records: %w", cerr))
	}
	if res == nil {
		return nil, err
	}
	if ferr := a.keep(res, mo); ferr != nil {
		return res, errors.Join(err, ferr)
	}
	if p := report.Problems(res); len(p) > 0 {
		if !mo.AllowFailures {
			return res, errors.Join(err, errkind.CheckFailedf("the run failed: %s (--allow-failures accepts such a run)", strings.Join(p, "; ")))
		}
		a.log.Warn("the run had failures, allowed by --allow-failures", "problems", strings.Join(p, "; "))
	}
	return res, err
}

// repeated runs run n times and returns their representative with the
// spread of every metric (report.WithRepeats). A run that fails, or has
// problems (failed requests, corrupt or leaked blocks), ends the series
// and is returned itself, so that nothing hides it.
func (a *app) repeated(n int, run runner) runner {
	return func(ctx context.Context, sink live.Sink) (report.Result, error) {
		var runs []report.Result
		for i := 1; i <= n; i++ {
			fmt.Fprintf(a.io.ErrOut, "nixlctl: run %d of %d\n", i, n)
			r, err := run(ctx, sink)
			if r == nil {
				return nil, err
			}
			if p := report.Problems(r); err != nil || len(p) > 0 {
				if i > 1 {
					r.Header().Warn(fmt.Sprintf("run %d of %d (--repeat) failed; the runs before it did not", i, n))
				}
				return r, err
			}
			runs = append(runs, r)
		}
		return report.WithRepeats(runs)
	}
}

// wantsTUI says whether the run gets the TUI (now or after tuiDelay).
func (a *app) wantsTUI(mo measureOptions) bool {
	return mo.TUI != "off" && a.io.StdinTTY && a.io.StdoutTTY
}

// withTUI runs with the terminal UI, started after delay if the run is
// still going. A second Ctrl-C in the UI re-sends the interrupt, which the
// signal handler turns into exit 130 once the terminal is restored.
func (a *app) withTUI(ctx context.Context, delay time.Duration, run runner) (report.Result, error) {
	stats := live.NewStats(nil)
	type outcome struct {
		res report.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := run(ctx, stats)
		done <- outcome{r, err}
	}()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case o := <-done:
		return o.res, o.err
	case <-timer.C:
	}
	// Every line bound for a terminal's stderr would be drawn over the
	// view: they go to a log file while it is up, and the view names it.
	var vl *viewLog
	model := tui.New(stats, a.interrupt)
	if a.io.StderrTTY {
		if vl = a.startViewLog(); vl != nil {
			model = model.WithLog(vl.path)
		}
	}
	p := tea.NewProgram(model, tea.WithInput(a.io.In), tea.WithOutput(a.io.Out), tea.WithoutSignalHandler())
	ui := make(chan tea.Model, 1)
	go func() {
		m, err := p.Run()
		if err != nil {
			a.log.Warn("terminal view", "err", err)
		}
		ui <- m
	}()
	// Stderr comes back as soon as the view is gone, before a second
	// Ctrl-C's interrupt can print its last words.
	var o outcome
	var logged string
	select {
	case o = <-done:
		p.Send(tui.DoneMsg{})
		m := <-ui
		logged = vl.stop()
		if mm, ok := m.(tui.Model); ok && mm.Aborted {
			a.interrupt()
		}
	case m := <-ui: // the view quit first: a second Ctrl-C
		logged = vl.stop()
		if mm, ok := m.(tui.Model); ok && mm.Aborted {
			a.interrupt()
		}
		o = <-done
	}
	if logged != "" {
		fmt.Fprintf(a.io.ErrOut, "nixlctl: log lines written during the live view are in %s\n", logged)
	}
	return o.res, o.err
}

// keep records the command line, then writes --records, --save and
// --plot. Records a runner streamed (mo.stream) are on disk already: keep
// links them with the count and checksum of what was written.
func (a *app) keep(res report.Result, mo measureOptions) error {
	h := res.Header()
	h.Args = a.args
	// First, so that --records and --plot may name files inside it.
	if mo.Save != "" {
		if err := os.MkdirAll(mo.Save, 0o755); err != nil {
			return fmt.Errorf("--save: %w", err)
		}
	}
	streamed := mo.stream.began()
	var written report.Streamed
	if streamed {
		written.Count, written.Bytes, written.SHA256 = mo.stream.w.Written()
	}
	if mo.Records != "" && streamed {
		h.RecordsFile = &report.RecordsRef{Path: mo.Records, Schema: report.RecordsSchema, Count: written.Count, SHA256: written.SHA256}
	} else if mo.Records != "" {
		rk, ok := res.(report.RecordsKeeper)
		if !ok {
			return fmt.Errorf("%s keeps no per-request records", h.Command)
		}
		f, err := userfile.Create(mo.Records)
		if err != nil {
			return errkind.BadInputf("--records: %v", err)
		}
		sum := sha256.New()
		n, err := rk.WriteRecords(io.MultiWriter(f, sum))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("--records %s: %w", mo.Records, err)
		}
		h.RecordsFile = &report.RecordsRef{Path: mo.Records, Schema: report.RecordsSchema, Count: n, SHA256: hex.EncodeToString(sum.Sum(nil))}
	}
	if mo.Plot != "" {
		pl, ok := res.(report.Plottable)
		if !ok {
			return fmt.Errorf("--plot: %s has nothing to plot", h.Command)
		}
		fig, err := pl.Figure()
		if err == nil {
			err = plots.Save(mo.Plot, fig)
		}
		if err != nil {
			return fmt.Errorf("--plot %s: %w", mo.Plot, err)
		}
	}
	if mo.HTML != "" {
		// From the result in memory, its records included.
		page, err := htmlreport.Build(res, version)
		if err == nil {
			err = writePage("html", mo.HTML, page)
		}
		if err != nil {
			return err
		}
	}
	if mo.Save != "" {
		var extra []string
		if mo.Plot != "" && filepath.Dir(mo.Plot) == filepath.Clean(mo.Save) {
			extra = append(extra, filepath.Base(mo.Plot))
		}
		if mo.HTML != "" && filepath.Dir(mo.HTML) == filepath.Clean(mo.Save) {
			extra = append(extra, filepath.Base(mo.HTML))
		}
		given := h.RecordsFile
		save := func() (*report.Manifest, error) { return report.Save(mo.Save, res, extra...) }
		if streamed {
			save = func() (*report.Manifest, error) { return report.SaveStreamed(mo.Save, res, written, extra...) }
		}
		if _, err := save(); err != nil {
			return fmt.Errorf("--save %s: %w", mo.Save, err)
		}
		// What stdout shows is read from here, not from inside DIR.
		switch {
		case given != nil:
			h.RecordsFile = given
		case h.RecordsFile != nil:
			h.RecordsFile.Path = filepath.Join(mo.Save, h.RecordsFile.Path)
		}
	}
	return nil
}

// render writes res to stdout in the chosen format; a format the kind
// cannot write is bad input.
func (a *app) render(res report.Result) error {
	err := res.Render(a.io.Out, a.format)
	if errors.Is(err, report.ErrFormat) {
		return errkind.BadInput(err)
	}
	if err != nil {
		return err
	}
	return report.WriteRepeats(a.io.Out, res, a.format)
}
