package report

import (
	"fmt"
	"math"
)

// RunsShift compares two sets of run values of one metric (a baseline's
// runs and a result's, each run one number) with a Mann-Whitney U test,
// exact for the small counts runs come in (ties count half). Unlike Shift
// it tests the numbers the gate judges, not the latency histograms behind
// them: a ratio measured against a reference beside it can move while its
// latencies do not, and the other way round.
type RunsShift struct {
	NA, NB int
	// U counts the pairs where the result's value is worse than the
	// baseline's (ties half).
	U float64
	// PWorse is the one-sided p-value that the result's runs are worse:
	// the chance of a U this large or larger if both came from one
	// distribution.
	PWorse float64
	// PBetter is the same for better.
	PBetter float64
}

// RunsAlpha is the one-sided level below which runs are "worse": 0.05,
// the least p three runs against three can give (1/20) when every run is
// worse than every baseline run.
const RunsAlpha = 0.05

// MinRuns is the fewest values each side needs for CompareRuns.
const MinRuns = 3

// CompareRuns tests whether runs are worse than base in direction better.
func CompareRuns(base, runs []float64, better Better) RunsShift {
	s := RunsShift{NA: len(base), NB: len(runs), PWorse: 1, PBetter: 1}
	if len(base) == 0 || len(runs) == 0 {
		return s
	}
	for _, r := range runs {
		for _, b := range base {
			worse := r < b
			if better == LowerIsBetter {
				worse = r > b
			}
			switch {
			case r == b:
				s.U += 0.5
			case worse:
				s.U++
			}
		}
	}
	dist := uDistribution(len(base), len(runs))
	total := 0.0
	for _, c := range dist {
		total += c
	}
	// P(U >= s.U) and P(U <= s.U), U's null distribution symmetric on
	// 0..n*m. A half-count tie rounds towards the less extreme value.
	hi, lo := 0.0, 0.0
	for u, c := range dist {
		if float64(u) >= s.U {
			hi += c
		}
		if float64(u) <= s.U {
			lo += c
		}
	}
	s.PWorse, s.PBetter = hi/total, lo/total
	return s
}

// uDistribution counts, for each u in 0..n*m, the arrangements of n
// baseline and m result values with u (result, baseline) pairs in
// order: the Mann-Whitney U's null distribution without ties.
func uDistribution(n, m int) []float64 {
	// f[i][j][u]: arrangements of i and j values with U = u; built by
	// whether the largest value is a baseline one (adds j to U) or not.
	prev := make([][]float64, m+1) // i-1
	for j := range prev {
		prev[j] = make([]float64, n*m+1)
		prev[j][0] = 1 // i = 0: one arrangement, U = 0
	}
	for i := 1; i <= n; i++ {
		cur := make([][]float64, m+1)
		cur[0] = make([]float64, n*m+1)
		cur[0][0] = 1
		for j := 1; j <= m; j++ {
			cur[j] = make([]float64, n*m+1)
			for u := 0; u <= n*m; u++ {
				v := cur[j-1][u]
				if u >= j {
					v += prev[j][u-j]
				}
				cur[j][u] = v
			}
		}
		prev = cur
	}
	return prev[m]
}

func (s RunsShift) String() string {
	if s.NA < MinRuns || s.NB < MinRuns {
		return "-"
	}
	p := math.Min(s.PWorse, s.PBetter)
	dir := "worse"
	if s.PBetter < s.PWorse {
		dir = "better"
	}
	return fmt.Sprintf("runs %d vs %d: %s p=%.3g", s.NA, s.NB, dir, p)
}
