package report

import (
	"bytes"
	"testing"
)

func TestWriteMetricsProm(t *testing.T) {
	t.Parallel()
	r := fake(0.8, nil)
	var b bytes.Buffer
	if err := WriteMetricsProm(&b, r); err != nil {
		t.Fatal(err)
	}
	want := `# HELP nixlctl_fake_measure_bandwidth_gbps bandwidth_gbps (GB/s), higher is better
# TYPE nixlctl_fake_measure_bandwidth_gbps gauge
nixlctl_fake_measure_bandwidth_gbps 16.0
# HELP nixlctl_fake_measure_efficiency efficiency (ratio), higher is better
# TYPE nixlctl_fake_measure_efficiency gauge
nixlctl_fake_measure_efficiency 0.8
`
	if got := b.String(); !bytes.HasPrefix([]byte(got), []byte(want)) {
		t.Fatalf("got:\n%s\nwant it to start with:\n%s", got, want)
	}
}
