package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteMetricsProm writes a result's Metrics as Prometheus gauges, for the
// kinds that have no metric names of their own to follow (vLLM's nixl_*
// metrics describe KV transfers, not the encoder cache or a leak probe):
// nixlctl_<command>_<key>{series="..."} value. The command and key are
// folded to Prometheus' alphabet; the unit, when there is one, is in the
// HELP line.
func WriteMetricsProm(w io.Writer, res Result) error {
	cmd := slug(res.Header().Command)
	byName := map[string][]Metric{}
	var names []string
	for _, m := range res.Metrics() {
		n := "nixlctl_" + cmd + "_" + slug(m.Key)
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
		byName[n] = append(byName[n], m)
	}
	sort.Strings(names)
	for _, n := range names {
		ms := byName[n]
		help := ms[0].Key
		if ms[0].Unit != "" {
			help += " (" + ms[0].Unit + ")"
		}
		help += ", " + ms[0].Better.String() + " is better"
		if _, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", n, help, n); err != nil {
			return err
		}
		for _, m := range ms {
			labels := ""
			if m.Series != "" {
				labels = `{series="` + promEscape(m.Series) + `"}`
			}
			if _, err := fmt.Fprintf(w, "%s%s %s\n", n, labels, promFloat(m.Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func promEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
