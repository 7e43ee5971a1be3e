package runcore

import "testing"

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ByteSize
		out  string
		err  bool
	}{
		{"4K", 4 << 10, "4K", false}, {"64M", 64 << 20, "64M", false}, {"1.5M", 3 << 19, "1536K", false}, {"4096", 4 << 10, "4K", false},
		{"1000", 1000, "1000", false}, {"", 0, "", false}, {"2G", 2 << 30, "2G", false}, {"4X", 0, "", true}, {"-1", 0, "", true},
	} {
		var b ByteSize
		err := b.UnmarshalText([]byte(tc.in))
		if (err != nil) != tc.err || b != tc.want || (err == nil && b.String() != tc.out) {
			t.Errorf("%q: %d (%q), %v; want %d (%q), error %v", tc.in, b, b.String(), err, tc.want, tc.out, tc.err)
		}
	}
}
