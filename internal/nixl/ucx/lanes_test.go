package ucx

import "testing"

func TestParseLanes(t *testing.T) {
	info := `#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0
#                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]
#                 lane[2]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] rma_bw#0
#                 lane[3]:  1:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] keepalive wireup
#
#                 am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)
`
	want := "am=sysv/memory am_bw=sysv/memory rma_bw=cma/memory keepalive=tcp/lo wireup=tcp/lo"
	if got := ParseLanes(info); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := ParseLanes("nothing"); got != "unknown" {
		t.Errorf("no lanes: %q", got)
	}
	if got := laneOf(want, "rma_bw"); got != "cma/memory" {
		t.Errorf("laneOf: %q", got)
	}
}

func TestRMAPath(t *testing.T) {
	for _, tc := range []struct {
		lanes      string
		mapped, v2 bool
		want       string
	}{
		// UCX 1.13 between two processes: mmap'd memory (cma is only an
		// rma_bw lane), and memory UCX allocated in a sysv segment.
		{"am=sysv/memory am_bw=sysv/memory rma_bw=cma/memory", false, false, "emulated over active messages on sysv/memory (software RMA: each side copies every byte)"},
		{"rma=sysv/memory am=sysv/memory rma_bw=sysv/memory", true, false, "shared-memory mapping (sysv/posix: a memcpy into the peer's segment)"},
		// An rma lane on a shared-memory transport cannot reach memory it
		// did not allocate: still emulated.
		{"rma=posix/memory am=posix/memory rma_bw=cma/memory", false, false, "emulated over active messages on posix/memory (software RMA: each side copies every byte)"},
		// TCP only.
		{"am=tcp/lo rma_bw=tcp/lo", false, false, "emulated over active messages on tcp/lo (software RMA: each side copies every byte)"},
		// RDMA: one-sided on the rma lane.
		{"rma=rc_mlx5/mlx5_0:1 am=rc_mlx5/mlx5_0:1 rma_bw=rc_mlx5/mlx5_0:1", false, false, "rc_mlx5/mlx5_0:1 (one-sided)"},
		// Protocols v2 (UCX 1.22): zero-copy on the rma_bw lane.
		{"am=sysv/memory rma_bw=cma/memory", false, true, "cma/memory (zero-copy)"},
	} {
		if got := RMAPath(tc.lanes, tc.mapped, tc.v2); got != tc.want {
			t.Errorf("%q mapped=%v v2=%v: %q, want %q", tc.lanes, tc.mapped, tc.v2, got, tc.want)
		}
	}
	for v, want := range map[string]bool{"1.13.1": false, "1.21.9": false, "1.22.0": true, "2.0": true, "": false} {
		if versionAtLeast(v, 1, 22) != want {
			t.Errorf("versionAtLeast(%q, 1, 22) != %v", v, want)
		}
	}
}
