package probe

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/report"
)

// A saved result read back by `report show` may carry any number of SSM
// sizes (the live decoder insists on two): every format prints what is
// there and none panics.
func TestSideChannelRendersAnySSMSizes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sizes []int64
		want  string
	}{
		{nil, "ssm sizes"},
		{[]int64{7}, "7"},
		{[]int64{4096, 65536}, "4096, 65536"},
		{[]int64{1, 2, 3}, "1, 2, 3"},
	} {
		res := &SideChannelResult{VLLM: &VLLMHandshake{SSMSizes: tc.sizes}}
		for _, f := range []report.Format{report.FormatTable, report.FormatMarkdown, report.FormatCSV} {
			var b bytes.Buffer
			if err := report.Write(&b, f, res); err != nil {
				t.Fatalf("%v %s: %v", tc.sizes, f, err)
			}
			line := ""
			for _, l := range strings.Split(b.String(), "\n") {
				if strings.Contains(l, "ssm sizes") {
					line = l
				}
			}
			if !strings.Contains(line, tc.want) {
				t.Errorf("%v %s: the ssm sizes line %q lacks %q", tc.sizes, f, line, tc.want)
			}
		}
	}
}
