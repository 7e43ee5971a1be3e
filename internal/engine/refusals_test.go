package engine

import "testing"

// The refusals that the CLI, the bench and the engine share are one
// function each, with one message.
func TestCheckPP(t *testing.T) {
	for _, tc := range []struct {
		p    Protocol
		pp   int
		fail bool
	}{
		{ProtoSGLang, 1, false},
		{ProtoSGLang, 2, true},
		{ProtoPull, 2, false},
		{ProtoPush, 4, false},
	} {
		err := CheckPP(tc.p, tc.pp)
		if (err != nil) != tc.fail {
			t.Errorf("CheckPP(%s, %d) = %v, want failure %v", tc.p, tc.pp, err, tc.fail)
		}
	}
}
