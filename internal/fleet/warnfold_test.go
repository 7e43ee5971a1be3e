package fleet

import (
	"fmt"
	"strings"
	"testing"
)

func TestWarnFolder(t *testing.T) {
	var out strings.Builder
	f := newWarnFolder(&out, "prefill")
	var in strings.Builder
	in.WriteString("listening on 127.0.0.1:7400\n")
	for i := range 203 {
		fmt.Fprintf(&in, "[1764288000.%06d] [vm:4242:0]           mpool.c:269  UCX  WARN  object 0x55d%07x {flags:0x%x} was not returned to mpool ucp_requests\n", i, i*64, i%3)
	}
	in.WriteString("[1764288001.000000] [vm:4242:0]    ucp_worker.c:1  UCX  WARN  another thing\n")
	in.WriteString("engine closed")
	// Written in odd pieces, as a pipe delivers them.
	s := in.String()
	for len(s) > 0 {
		n := min(len(s), 97)
		if _, err := f.Write([]byte(s[:n])); err != nil {
			t.Fatal(err)
		}
		s = s[n:]
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if n := strings.Count(got, "was not returned to mpool"); n != ucxWarnRepeats+1 {
		t.Errorf("%d mpool lines printed, want %d and a summary:\n%s", n, ucxWarnRepeats+1, got)
	}
	for _, want := range []string{"listening on 127.0.0.1:7400\n", "another thing", "engine closed\n", "prefill printed 200 more UCX warnings", "(203 in all; not shown)"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
