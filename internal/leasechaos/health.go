package leasechaos

import "fmt"

// Problems implements report.HealthReporter.
func (res *LeaseChaosResult) Problems() []string {
	var p []string
	for _, s := range res.Scenarios {
		if !s.Passed {
			p = append(p, fmt.Sprintf("scenario %s failed its expectation", s.Series()))
		}
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}
