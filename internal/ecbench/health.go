package ecbench

import (
	"fmt"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// Problems implements report.HealthReporter.
func (res *ECResult) Problems() []string {
	var p []string
	s := res.Summary
	if s.Images == 0 {
		p = append(p, "no image was measured")
	}
	if s.Failed > 0 {
		p = append(p, fmt.Sprintf("%d of %d images failed%s", s.Failed, s.Images, runcore.ByReason(s.FailuresByStatus)))
	} else if n := s.FailuresByStatus[ec.FailTagMismatch]; n > 0 {
		p = append(p, fmt.Sprintf("%d deliveries had wrong bytes", n))
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}
