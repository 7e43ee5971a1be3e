package handoff

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHandoffProblems(t *testing.T) {
	recs := []HandoffRecord{
		{ID: "r1", Bytes: 10, HandoffMS: 1},
		{ID: "r2", Error: "registration of decode-7f3a timed out after 60s"},
		{ID: "r3", Error: "registration of decode-0bc1 timed out after 60s"},
		{ID: "r4", Error: "peer 127.0.0.1:4411 died", CorruptBlocks: 0},
		{ID: "r5", Bytes: 10, CorruptBlocks: 2},
	}
	s := SummarizeHandoff(recs, 0)
	want := map[string]int{"registration of decode-N timed out after N": 2, "peer N died": 1, "corrupt blocks": 1}
	if d := cmp.Diff(want, s.FailuresByReason); d != "" {
		t.Fatalf("failures by reason (-want +got):\n%s", d)
	}
	wantEx := map[string]string{"registration of decode-N timed out after N": "registration of decode-7f3a timed out after 60s", "peer N died": "peer 127.0.0.1:4411 died"}
	if d := cmp.Diff(wantEx, s.FailureExamples); d != "" {
		t.Fatalf("failure examples (-want +got):\n%s", d)
	}
	s.LeakedBlocks = 224
	res := &HandoffResult{Summary: s, Interrupted: true}
	got := res.Problems()
	wantP := []string{
		"4 of 5 requests failed (2 registration of decode-N timed out after N, 1 corrupt blocks, 1 peer N died); " +
			`first of each: "registration of decode-7f3a timed out after 60s"; "peer 127.0.0.1:4411 died"`,
		"2 corrupt blocks", "224 blocks leaked (still held at the end)", "interrupted",
	}
	if d := cmp.Diff(wantP, got); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
	if p := (&HandoffResult{Summary: SummarizeHandoff(recs[:1], 0)}).Problems(); len(p) != 0 {
		t.Errorf("a healthy run has problems: %q", p)
	}
}

// Every measured request counts in the transfer histogram, even when its
// transfer stage read 0 (the copy happened inside the post); a negative
// stage is counted and left out, never clamped to 0.
func TestStagesCountEveryMeasuredRequest(t *testing.T) {
	recs := []HandoffRecord{
		{ID: "a", Bytes: 10, HandoffMS: 2, PostMS: 1, TransferMS: 1},
		{ID: "b", Bytes: 10, HandoffMS: 2, PostMS: 2, TransferMS: 0},
		{ID: "c", Bytes: 10, HandoffMS: 2, PostMS: 1, TransferMS: -0.5},
		{ID: "d", Error: "decode: boom"},
	}
	s := SummarizeHandoff(recs, 0)
	if s.TransferMS.Count != 2 || s.HandoffLatencyMS.Count != 3 || s.PostMS.Count != 3 {
		t.Errorf("counts: transfer %d (want 2: a and b), handoff %d, post %d (want 3)", s.TransferMS.Count, s.HandoffLatencyMS.Count, s.PostMS.Count)
	}
	if d := cmp.Diff(map[string]int{"transfer_ms": 1}, s.NegativeStages); d != "" {
		t.Errorf("negative stages (-want +got):\n%s", d)
	}
	if got := stageMS(200, 100); got >= 0 {
		t.Errorf("stageMS(200, 100) = %v: a stage that ends before it starts must stay negative", got)
	}
	if got := stageMS(0, 100); got != 0 {
		t.Errorf("stageMS with a missing stamp = %v, want 0", got)
	}
}
