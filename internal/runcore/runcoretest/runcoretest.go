// Package runcoretest holds the checks the run kinds' tests share.
package runcoretest

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/runcore"
)

// CheckLocalPath checks the network path of a run whose endpoints all ran
// on this host: nothing warns about the path, and each of roles has a
// verdict on the whole payload.
func CheckLocalPath(t testing.TB, np runcore.NetPath, warnings []string, payload int64, roles ...string) {
	t.Helper()
	for _, w := range warnings {
		if strings.HasPrefix(w, "net path") {
			t.Errorf("a local run warns: %s", w)
		}
	}
	for _, r := range roles {
		v, ok := np[r]
		if !ok || v.Error != "" || v.Payload != payload || payload <= 0 || v.Host == "" {
			t.Errorf("%s: verdict %+v (payload %d)", r, v, payload)
		}
	}
	if runcore.PathLine(np) == "" {
		t.Error("no path line")
	}
	t.Logf("path: %s", runcore.PathLine(np))
}

// EnumCase is one text given to an enum's UnmarshalText: Want is the value
// it must parse to, or, with WantErr set, the error must name the text and
// contain WantErr (the valid values).
type EnumCase struct {
	Dst     interface{ UnmarshalText([]byte) error }
	In      string
	Want    any
	WantErr string
}

// CheckEnumParses checks that enums parse themselves, naming the valid
// values when they cannot.
func CheckEnumParses(t testing.TB, cases []EnumCase) {
	t.Helper()
	for _, tc := range cases {
		err := tc.Dst.UnmarshalText([]byte(tc.In))
		if tc.WantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.WantErr) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.In)) {
				t.Errorf("%T %q: %v, want an error naming %s", tc.Dst, tc.In, err, tc.WantErr)
			}
			continue
		}
		got := reflect.ValueOf(tc.Dst).Elem().Interface()
		if err != nil || got != tc.Want {
			t.Errorf("%T %q: %v, %v; want %v", tc.Dst, tc.In, got, err, tc.Want)
		}
	}
}
