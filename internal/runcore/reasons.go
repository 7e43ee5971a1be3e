package runcore

import (
	"fmt"
	"sort"
	"strings"
)

// ByReason renders a count per reason as " (2 registration timeout, 1
// peer died)", largest first; "" when there are none.
func ByReason[N int | int64](m map[string]N) string {
	keys := ReasonOrder(m)
	if len(keys) == 0 {
		return ""
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// ReasonOrder is m's reasons with a count, largest first, then by name.
func ReasonOrder[N int | int64](m map[string]N) []string {
	keys := make([]string, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}
