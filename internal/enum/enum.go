// Package enum parses the enumerations that options, configs and RPCs
// carry (a protocol, a router, a verify mode), so that every one rejects
// an unknown value the same way: naming the kind, the text it got and the
// values it accepts.
//
// It imports nothing of nixlctl's, so that any package may use it.
package enum

import (
	"fmt"
	"strings"
)

// Parse sets *dst to the member of all whose name (String) is b. Matching
// by name rather than by conversion serves string enums and integer ones
// (engine.Verify) alike. Otherwise it leaves *dst alone and says
// `unknown <kind> "<b>" (want <names>)`.
func Parse[T fmt.Stringer](dst *T, kind string, b []byte, all []T) error {
	for _, x := range all {
		if x.String() == string(b) {
			*dst = x
			return nil
		}
	}
	return fmt.Errorf("unknown %s %q (want %s)", kind, b, Names(all))
}

// Names lists all's names for a message: "pull, push, sglang".
func Names[T fmt.Stringer](all []T) string {
	s := make([]string, len(all))
	for i, x := range all {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}
