package errkind

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestKinds(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	if BadInput(nil) != nil {
		t.Error("BadInput(nil) must stay nil")
	}
	wrapped := fmt.Errorf("context: %w", BadInput(base))
	if !IsBadInput(wrapped) || !errors.Is(wrapped, base) || IsCheckFailed(wrapped) {
		t.Errorf("bad input lost through wrapping: %v", wrapped)
	}
	if !IsBadInput(BadInputf("x %d", 1)) || BadInputf("x %d", 1).Error() != "x 1" {
		t.Error("BadInputf")
	}
	cf := fmt.Errorf("run: %w", CheckFailedf("%d corrupt blocks", 3))
	if !IsCheckFailed(cf) || IsBadInput(cf) || cf.Error() != "run: 3 corrupt blocks" {
		t.Errorf("check failed: %v", cf)
	}
	if IsBadInput(base) || IsCheckFailed(base) {
		t.Error("plain errors have no kind")
	}
}

func TestFieldIn(t *testing.T) {
	err := errors.Join(Field("A", "bad a"), fmt.Errorf("wrapped: %w", errors.Join(Field("D", "bad d"), errors.New("plain"), Field("B", "bad b"))))
	for _, tc := range []struct {
		field string
		found bool
	}{{"A", true}, {"B", true}, {"D", true}, {"C", false}} {
		fe, ok := FieldIn(err, tc.field)
		if ok != tc.found || (ok && fe.Field != tc.field) {
			t.Errorf("%s: got %+v, %v", tc.field, fe, ok)
		}
	}
	if _, ok := FieldIn(nil, "A"); ok {
		t.Error("nil has no field")
	}
}

func TestFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"nil", nil, nil},
		{"plain", errors.New("x"), nil},
		{"one", Field("A", "bad"), []string{"A"}},
		{"joined, wrapped and marked, in order", BadInput(errors.Join(Field("A", "bad a"), errors.New("plain"),
			fmt.Errorf("wrapped: %w", errors.Join(Field("D", "bad d"), Field("B", "bad b"))))), []string{"A", "D", "B"}},
	} {
		if got := Fields(tc.err); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Fields = %q, want %q", tc.name, got, tc.want)
		}
	}
}
