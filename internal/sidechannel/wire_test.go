package sidechannel

import (
	"strings"
	"testing"
)

// msgspec decodes NixlAgentMetadata strictly: a null where the field is
// not Optional fails the handshake on the vLLM side. The map must carry
// vLLM's 19 field names, a non-null value for each but the four Optional
// region_* lists (null when unset, their upstream default), and ssm_sizes
// must be a pair.
func TestAgentMetadataHasNoNulls(t *testing.T) {
	t.Parallel()
	m := wireMap(t, AgentMetadata{EngineID: "e", NumBlocks: 4, BlockSize: 16, KVCacheLayout: "HND", AttnBackendName: "FLASH_ATTN"}.Wire())
	vllmFields := []string{"engine_id", "agent_metadata", "kv_caches_base_addr", "device_id", "num_blocks", "block_lens",
		"block_strides", "kv_cache_layout", "block_size", "ssm_sizes", "attn_backend_name",
		"physical_blocks_per_logical_kv_block", "region_num_blocks", "region_group_ids", "region_names",
		"region_mem_types", "dcp_size", "pcp_size", "region_members"}
	for _, f := range vllmFields {
		v, ok := m[f]
		if !ok {
			t.Errorf("%s missing", f)
		} else if v == nil && !strings.HasPrefix(f, "region_") || f == "region_members" && v == nil {
			t.Errorf("%s is null: msgspec rejects it", f)
		}
	}
	if ssm, ok := m["ssm_sizes"].([]any); !ok || len(ssm) != 2 {
		t.Errorf("ssm_sizes = %v, want a pair", m["ssm_sizes"])
	}
	if rm, ok := m["region_members"].([]any); !ok || len(rm) != 0 {
		t.Errorf("region_members = %v, want []", m["region_members"])
	}
	for _, f := range []string{"region_num_blocks", "region_group_ids", "region_names", "region_mem_types"} {
		if m[f] != nil {
			t.Errorf("%s = %v, want null (unset, vLLM's default None)", f, m[f])
		}
	}
}
