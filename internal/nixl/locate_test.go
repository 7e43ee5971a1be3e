package nixl

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLocate(t *testing.T) {
	regions := []Desc{{Addr: 0x1000, Len: 0x1000}, {Addr: 0x4000, Len: 0x2000}}
	holds := func(j int, d Desc) bool {
		r := regions[j]
		return d.Addr >= r.Addr && d.Addr+d.Len <= r.Addr+r.Len
	}
	for _, tc := range []struct {
		name    string
		remote  string
		descs   []Desc
		want    []int // each descriptor's region
		wantErr string
	}{
		{name: "runs over both regions", descs: []Desc{{Addr: 0x1000, Len: 0x100}, {Addr: 0x1100, Len: 0x100}, {Addr: 0x4000, Len: 0x1000}, {Addr: 0x5000, Len: 0x1000}, {Addr: 0x1f00, Len: 0x100}}, want: []int{0, 0, 1, 1, 0}},
		{name: "empty", want: nil},
		{name: "local descriptor outside", descs: []Desc{{Addr: 0x1000, Len: 0x100}, {Addr: 0x3000, Len: 0x10}}, want: []int{0}, wantErr: "local descriptor 1 (0x3000+16)"},
		{name: "runs past its region", descs: []Desc{{Addr: 0x1f00, Len: 0x200}}, wantErr: "local descriptor 0 (0x1f00+512)"},
		{name: "remote descriptor outside", remote: "peer-1", descs: []Desc{{Addr: 0x9000, Len: 8}}, wantErr: "remote descriptor 0 (0x9000+8) of peer-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			err := Locate(tc.remote, tc.descs, len(regions), holds, func(i, j int) error {
				if i != len(got) {
					t.Errorf("at(%d) out of order (after %d)", i, len(got))
				}
				got = append(got, j)
				return nil
			})
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (!errors.Is(err, ErrNotRegistered) || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want ErrNotRegistered naming %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("regions (-want +got):\n%s", diff)
			}
		})
	}
	refused := errors.New("refused")
	if err := Locate("p", []Desc{{Addr: 0x4000, Len: 8}}, len(regions), holds, func(int, int) error { return refused }); !errors.Is(err, refused) {
		t.Errorf("at's error: got %v", err)
	}
}
