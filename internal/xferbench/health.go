package xferbench

import (
	"fmt"
	"strings"
)

// Problems implements report.HealthReporter.
func (res *XferResult) Problems() []string {
	var p []string
	if res.Failure != "" {
		p = append(p, "the sweep stopped at "+res.Failure)
	} else if len(res.Points) == 0 {
		p = append(p, "no point was measured")
	}
	for _, pt := range res.Points {
		if strings.HasPrefix(pt.Consistency, "FAILED") {
			p = append(p, fmt.Sprintf("block %d batch %d: consistency check %s", pt.BlockSize, pt.BatchSize, pt.Consistency))
		}
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}
