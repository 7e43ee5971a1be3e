package engine

import (
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// Merge is an option of its own (it used to be a positional bool that
// SGLang's path passed as a literal true, ignoring --no-merge).
func TestBuildMovesMerge(t *testing.T) {
	spec := kv.Spec{Model: testModel(), BlockSize: 16, TP: 1, PP: 1}
	lp := pool(t, spec, 0, 16)
	rm := sidechannel.AgentMetadata{NumBlocks: 16}
	for i := range lp.Rank.Regions {
		rm.KVCachesBaseAddr = append(rm.KVCachesBaseAddr, 1<<40+uint64(i)<<30)
		rm.BlockLens = append(rm.BlockLens, lp.BlockLen(i))
	}
	plan, err := kv.Plan(lp.Spec, lp.Spec)
	if err != nil {
		t.Fatal(err)
	}
	chunks := plan.Decode[0].Reads[0].Chunks
	regions := len(lp.Rank.Regions)
	for _, tc := range []struct {
		name          string
		local, remote []int
		merge         bool
		descs         int
	}{
		{"contiguous, merged", []int{0, 1, 2, 3}, []int{4, 5, 6, 7}, true, regions},
		{"contiguous, not merged", []int{0, 1, 2, 3}, []int{4, 5, 6, 7}, false, 4 * regions * len(chunks)},
		{"a gap on one side breaks the run", []int{0, 1, 3, 4}, []int{4, 5, 6, 7}, true, 2 * regions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ml, err := buildMoves(lp, rm, moveOpts{Chunks: chunks, LocalBlocks: tc.local, RemoteBlocks: tc.remote,
				Tokens: 64, LocalIsPrefill: true, Merge: tc.merge})
			if err != nil {
				t.Fatal(err)
			}
			if len(ml.local) != tc.descs || ml.logical != 4*regions*len(chunks) || len(ml.remote) != len(ml.local) {
				t.Errorf("%d descriptors (%d logical), want %d", len(ml.local), ml.logical, tc.descs)
			}
		})
	}
}
