package runcore

import (
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
)

// Snapshotter returns what saves res as it stands through save (a no-op
// when save is nil). A failed save is warned once and not tried again: the
// run goes on, it only loses what a kill would have left.
func Snapshotter(save func(report.Result) error, res report.Result, sink live.Sink) func() {
	if save == nil {
		return func() {}
	}
	failed := false
	return func() {
		if failed {
			return
		}
		if err := save(res); err != nil {
			failed = true
			w := "--save: the partial result could not be written as the run went (" + err.Error() + "): a kill would leave nothing"
			res.Header().Warn(w)
			live.Emit(sink, live.Warning{Text: w})
		}
	}
}
