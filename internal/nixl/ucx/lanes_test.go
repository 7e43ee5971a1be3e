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
