package clocksync

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStage(t *testing.T) {
	d, err := Stage("handoff", 100, 350)
	if err != nil || d != 250 {
		t.Errorf("Stage = %v, %v", d, err)
	}
	if d, err := Stage("handoff", 100, 100); err != nil || d != 0 {
		t.Errorf("a zero stage is real: %v, %v", d, err)
	}
	_, err = Stage("handoff", 350, 100)
	var neg *NegativeStageError
	if !errors.As(err, &neg) || neg.Name != "handoff" || neg.Start != 350 || neg.End != 100 {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "handoff is negative") {
		t.Errorf("message %q", err)
	}
}

func TestStagesCountsNegative(t *testing.T) {
	var s Stages
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			s.Measure("transfer", 0, 10)
			if i < 3 {
				s.Measure("handoff", 10, 5)
			}
			if i == 0 {
				s.Measure("decode", 10, 9)
			}
		})
	}
	wg.Wait()
	if s.Total() != 12 {
		t.Errorf("Total %d", s.Total())
	}
	if d := cmp.Diff([]NegativeCount{{"decode", 1}, {"handoff", 3}}, s.Negative()); d != "" {
		t.Error(d)
	}
	if d := cmp.Diff([]string{"1 negative stage in decode", "3 negative stages in handoff"}, s.Warnings()); d != "" {
		t.Error(d)
	}
	var empty Stages
	if empty.Warnings() != nil || len(empty.Negative()) != 0 {
		t.Error("a fresh Stages has warnings")
	}
}
