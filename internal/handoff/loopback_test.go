package handoff

import (
	"errors"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

func TestCheckLoopbackAdvert(t *testing.T) {
	hostA := ctl.HostInfo{Hostname: "a", Identity: clocksync.HostIdentity{BootID: "b", PIDNamespace: "pid:[1]", TimeNamespace: "time:[1]"}}
	hostB := ctl.HostInfo{Hostname: "b", Identity: clocksync.HostIdentity{BootID: "b", PIDNamespace: "pid:[2]", TimeNamespace: "time:[1]"}}
	at := func(role string, h ctl.HostInfo) *Endpoint {
		return &Endpoint{host: h, info: runcore.EndpointInfo{Role: role, Hostname: h.Hostname}}
	}
	prefill := at("prefill", hostA)
	for _, tc := range []struct {
		name    string
		addr    string
		dialers []*Endpoint
		wantErr string
	}{
		{"loopback to another host", "tcp://127.0.0.1:7401", []*Endpoint{at("decode", hostB)}, "decode on b runs on another host"},
		{"localhost to another host", "http://localhost:8998", []*Endpoint{at("decode", hostB)}, "loopback address"},
		{"ipv6 loopback to another host", "tcp://[::1]:7401", []*Endpoint{at("decode", hostA), at("decode-1", hostB)}, "decode-1 on b"},
		{"loopback on one host", "tcp://127.0.0.1:7401", []*Endpoint{at("decode", hostA)}, ""},
		{"routable address", "tcp://10.0.0.1:7401", []*Endpoint{at("decode", hostB)}, ""},
		{"no address", "", []*Endpoint{at("decode", hostB)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLoopbackAdvert("prefill", prefill, tc.addr, tc.dialers)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.addr) {
				t.Fatalf("err = %v, want one naming %q and %q", err, tc.addr, tc.wantErr)
			}
		})
	}
}

func TestUnreachableWarning(t *testing.T) {
	failed := HandoffSummary{
		FailuresByReason: map[string]int{"decode: handshake failed with prefill-N ...": 5, "prefill: out of KV blocks": 2},
		FailureExamples: map[string]string{
			"decode: handshake failed with prefill-N ...": "decode: handshake failed with prefill-0: connecting to tcp://10.0.0.2:41233: Destination is unreachable",
			"prefill: out of KV blocks":                   "prefill: out of KV blocks",
		},
	}
	eps := []runcore.EndpointInfo{{Role: "prefill-0", SideChannel: "tcp://10.0.0.2:41233"}, {Role: "decode", SideChannel: "tcp://127.0.0.1:5000"}}
	route := func(ip string) (string, error) { return map[string]string{"10.0.0.2": "veth-a"}[ip], nil }
	w := unreachableWarning(failed, "", eps, route)
	for _, want := range []string{"5 requests failed as unreachable", "Destination is unreachable", "--net-devices", "10.0.0.2 through veth-a"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	if strings.Contains(w, "127.0.0.1") {
		t.Errorf("warning %q routes a loopback side channel", w)
	}
	if w := unreachableWarning(failed, "veth-a", eps, route); !strings.Contains(w, "the pinned device does not reach") {
		t.Errorf("pinned: %q", w)
	}
	failed.Requests, failed.Failed = 7, 7
	res := &HandoffResult{Summary: failed}
	if p := res.Problems(); len(p) == 0 || !strings.Contains(p[0], "pin one that does with --net-devices") {
		t.Errorf("the failure line does not name the fix: %q", p)
	}
	res.Config.NetDevices = "veth-a"
	if p := res.Problems(); strings.Contains(p[0], "pin one that does") {
		t.Errorf("pinned, the failure line still suggests a pin: %q", p)
	}
	other := HandoffSummary{FailuresByReason: map[string]int{"prefill: out of KV blocks": 2}, FailureExamples: map[string]string{"prefill: out of KV blocks": "prefill: out of KV blocks"}}
	if w := unreachableWarning(other, "", eps, route); w != "" {
		t.Errorf("warned about other failures: %q", w)
	}
}

func TestDialErrorNamesTheRegistration(t *testing.T) {
	refused := errors.New("dial tcp 10.0.0.2:7400: connect: connection refused")
	if err := dialError("decode", "10.0.0.2:7400", registration{}, refused); err.Error() != "decode endpoint 10.0.0.2:7400: "+refused.Error() {
		t.Errorf("a plain address: %v", err)
	}
	reg := registration{etcd: true, who: "decode rank 1, registered from host node2 (nixlctl/42/members/decode/1)"}
	err := dialError("decode", "10.0.0.2:7400", reg, refused)
	for _, want := range []string{"decode rank 1", "node2", "stale registration", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
	if !errors.Is(err, refused) {
		t.Error("the dial error is not wrapped")
	}
}
