package netpath

import "testing"

func TestRouteDevice(t *testing.T) {
	dev, err := RouteDevice("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if dev != "lo" {
		t.Errorf("127.0.0.1 routes through %q, want lo", dev)
	}
	if _, err := RouteDevice("not-an-ip"); err == nil {
		t.Error("a name was taken for an IP address")
	}
}
