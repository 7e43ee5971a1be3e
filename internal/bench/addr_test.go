package bench

import "testing"

func TestCheckAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:7400", true},
		{"host:1", true},
		{"[::1]:65535", true},
		{"nonsense", false},
		{"host:99999", false},
		{"host:0", false},
		{"host:http", false},
		{":7400", false},
		{"host:", false},
	} {
		if err := checkAddr(tc.addr); (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.addr, err)
		}
	}
}
