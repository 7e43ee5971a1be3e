package report

import (
	"strings"
	"testing"
)

// sickResult is a fake result whose run went wrong.
type sickResult struct {
	*fakeResult
	problems []string
}

func (s sickResult) Problems() []string { return s.problems }

// The gate never passes a run that lost, leaked or corrupted anything or
// was interrupted, however good its numbers, nor judges against such a
// baseline.
func TestGateRefusesFailedRuns(t *testing.T) {
	t.Parallel()
	healthy, better := fake(0.80, nil), fake(0.95, nil)
	crashed := sickResult{fake(0.95, nil), []string{"83 of 200 requests failed", "224 blocks leaked (still held at the end)"}}
	tests := []struct {
		name    string
		base    Result
		runs    []Result
		refused []string
	}{
		{"healthy", healthy, []Result{better}, nil},
		{"a run failed requests", healthy, []Result{better, crashed},
			[]string{"result 2: 83 of 200 requests failed", "result 2: 224 blocks leaked (still held at the end)"}},
		{"the baseline was interrupted", sickResult{fake(0.8, nil), []string{"interrupted"}}, []Result{better},
			[]string{"baseline: interrupted"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := Gate(tc.base, tc.runs, GateOptions{MaxRegression: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			if g.Passed != (len(tc.refused) == 0) || strings.Join(g.Refused, "|") != strings.Join(tc.refused, "|") {
				t.Fatalf("passed %v, refused %q; want refused %q", g.Passed, g.Refused, tc.refused)
			}
			if len(tc.refused) > 0 && (!strings.HasPrefix(g.Headline(), "FAIL") || !strings.Contains(g.Headline(), tc.refused[0])) {
				t.Errorf("headline does not say why: %s", g.Headline())
			}
		})
	}
}
