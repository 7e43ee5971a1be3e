package htmlreport

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromium finds Debian's headless-capable browser. Without one the
// browser test is skipped, except in CI (CI=true), where scripts/setup.sh
// --deps installs it and its absence is a failure.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (scripts/setup.sh --deps installs it)")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the browser test")
	return ""
}

// runChromium runs the browser headless on one page with its console
// logged to stderr.
func runChromium(t *testing.T, bin, profile, page string, args ...string) (stdout, stderr []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0"}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), "file://"+page)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, errb.Bytes())
	}
	return out.Bytes(), errb.Bytes()
}

// consoleErrorRE matches what Chromium logs for a script error or a
// console.error on the page: "Uncaught ..." and CONSOLE lines of level
// error, and any failed load.
var consoleErrorRE = regexp.MustCompile(`(?m)^.*(Uncaught|:CONSOLE\(\d+\)\].*(error|Error)|Failed to load resource|net::ERR_).*$`)

func consoleErrors(stderr []byte) []string {
	var out []string
	for _, m := range consoleErrorRE.FindAll(stderr, -1) {
		out = append(out, string(m))
	}
	return out
}

// TestBrowser opens every kind of page in headless Chromium: the page
// must render without console errors, its script must run to its end,
// and the numbers in the DOM the browser built must equal the result's.
// A screenshot of each is saved in the test's temporary directory (and
// in $HTMLREPORT_SCREENSHOTS when set, which is how docs/img got its).
func TestBrowser(t *testing.T) {
	bin := chromium(t)
	shots := os.Getenv("HTMLREPORT_SCREENSHOTS")
	dir := t.TempDir()
	// One profile for the runs, one after another: a fresh one costs
	// Chromium seconds to set up each time.
	profile := t.TempDir()

	t.Run("console errors are caught", func(t *testing.T) {
		// The check below must be able to fail: a page with a broken
		// script has to show up in it.
		bad := filepath.Join(dir, "broken.html")
		if err := os.WriteFile(bad, []byte(`<!DOCTYPE html><html><body><p>x</p><script>console.error("boom"); undefinedFunction();</script></body></html>`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, stderr := runChromium(t, bin, profile, bad, "--dump-dom")
		if errs := consoleErrors(stderr); len(errs) == 0 {
			t.Fatalf("a page with a script error logged none that the test sees:\n%s", stderr)
		}
	})

	for _, tc := range pageCases {
		t.Run(tc.name, func(t *testing.T) {
			p, want := tc.build(t)
			path := filepath.Join(dir, tc.name+".html")
			if err := os.WriteFile(path, render(t, p), 0o644); err != nil {
				t.Fatal(err)
			}
			png := filepath.Join(dir, tc.name+".png")
			dom, stderr := runChromium(t, bin, profile, path, "--dump-dom", "--window-size=1280,2000", "--screenshot="+png)
			for _, e := range consoleErrors(stderr) {
				t.Errorf("console: %s", e)
			}
			if !bytes.Contains(dom, []byte(`data-script="ran"`)) {
				t.Errorf("the page's script did not run to its end")
			}
			if n := bytes.Count(dom, []byte("<svg")); n == 0 {
				t.Errorf("no charts in the rendered page")
			}
			n := checkNumbers(t, dom, want)
			shot, err := os.ReadFile(png)
			if err != nil {
				t.Fatalf("no screenshot: %v", err)
			}
			if !bytes.HasPrefix(shot, []byte("\x89PNG")) || len(shot) < 10_000 {
				t.Errorf("screenshot %s: %d bytes, not a picture of a page", png, len(shot))
			}
			t.Logf("%d numbers equal the result's; screenshot %s", n, png)
			if shots != "" {
				if err := os.WriteFile(filepath.Join(shots, "report-"+strings.ReplaceAll(tc.name, "_", "-")+".png"), shot, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
