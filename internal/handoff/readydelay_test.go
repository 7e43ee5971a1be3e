package handoff

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// --ready-delay slows the handoff stage of every protocol by at least its
// value (the regression scripts/gate-error-rates.sh measures a gate's
// power with), and the result says it was on purpose.
func TestReadyDelaySlowsEveryHandoff(t *testing.T) {
	const delay = 40 * time.Millisecond
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoPush, engine.ProtoSGLang} {
		t.Run(string(proto), func(t *testing.T) {
			o := handoffOpts(t, proto, 1, 1)
			o.Inproc, o.Requests, o.Concurrency, o.ReadyDelay = true, 4, 2, runcore.Duration(delay)
			res, err := RunHandoff(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if s := res.Summary; s.Requests != 4 || s.Failed != 0 || s.CorruptBlocks != 0 || s.LeakedBlocks != 0 {
				t.Fatalf("summary %+v", s)
			}
			for _, r := range res.Records {
				if r.HandoffMS < float64(delay.Milliseconds()) {
					t.Errorf("request %s: handoff %.1f ms, shorter than the %v ready delay", r.ID, r.HandoffMS, delay)
				}
			}
			if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.HasPrefix(w, "--ready-delay 40ms:") }) {
				t.Errorf("no --ready-delay warning in %q", res.Warnings)
			}
			if res.Config.ReadyDelay != runcore.Duration(delay) {
				t.Errorf("echo: ready delay %v", res.Config.ReadyDelay)
			}
		})
	}
}
