package nixl

import "testing"

type listA struct{}

func (listA) Len() int       { return 0 }
func (listA) Remote() string { return "" }

type listB struct{ listA }

func TestReleaseDlistRefusesAnotherBackendsList(t *testing.T) {
	if err := ReleaseDlist[listA](listA{}, "fake"); err != nil {
		t.Errorf("own list: %v", err)
	}
	if err := ReleaseDlist[listA](listB{}, "fake"); err == nil || err.Error() != "not a fake descriptor list" {
		t.Errorf("another backend's list: %v", err)
	}
}
