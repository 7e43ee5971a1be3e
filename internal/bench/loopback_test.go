package bench

import (
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
)

func TestCheckLoopbackAdvert(t *testing.T) {
	hostA := ctl.HostInfo{Hostname: "a", Identity: clocksync.HostIdentity{BootID: "b", PIDNamespace: "pid:[1]", TimeNamespace: "time:[1]"}}
	hostB := ctl.HostInfo{Hostname: "b", Identity: clocksync.HostIdentity{BootID: "b", PIDNamespace: "pid:[2]", TimeNamespace: "time:[1]"}}
	at := func(role string, h ctl.HostInfo) *Endpoint {
		return &Endpoint{host: h, info: EndpointInfo{Role: role, Hostname: h.Hostname}}
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
