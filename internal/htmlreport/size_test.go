package htmlreport

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/nixlctl/nixlctl/internal/handoff"
)

// tenThousand is a 10,000-request bench push result made of the real
// records of the push-small fixture, repeated in time (each copy of the
// run starts where the one before ended) and summarised again, so the
// page is built from as many records as a 10,000-request run has. Each
// copy's stage times are stretched by 0.1% more than the last, so the
// values are as distinct as a real run's (the page's worst case: a CDF
// point per distinct value of its slowest 1%).
func tenThousand(t testing.TB) *handoff.HandoffResult {
	t.Helper()
	res, ok := load(t, "push-small").(*handoff.HandoffResult)
	if !ok {
		t.Fatal("push-small is not a handoff result")
	}
	recs := measured(res.Records)
	var t0, t1 int64 = recs[0].TStart, 0
	for _, r := range recs {
		t0, t1 = min(t0, r.TStart), max(t1, r.TReady)
	}
	span := t1 - t0
	out := make([]handoff.HandoffRecord, 0, 10000)
	for i := 0; i < 10000; i++ {
		r := recs[i%len(recs)]
		shift := int64(i/len(recs)) * span
		r.Index, r.ID = i, fmt.Sprintf("req-%d", i)
		r.TStart, r.TFinish, r.TReady = r.TStart+shift, r.TFinish+shift, r.TReady+shift
		k := 1 + float64(i/len(recs))/1000
		r.HandoffMS, r.TransferMS, r.PostMS, r.FinishToPostMS = r.HandoffMS*k, r.TransferMS*k, r.PostMS*k, r.FinishToPostMS*k
		r.CompletionMS, r.RegRTTMS = r.CompletionMS*k, r.RegRTTMS*k
		out = append(out, r)
	}
	res.Records = out
	res.Summary = handoff.SummarizeHandoff(out, res.Summary.MemcpyGBps)
	return res
}

// TestPageSize10k: a 10,000-request run's page stays under 2 MB (the
// issue's target): distributions are drawn at fixed quantiles and time in
// at most about 60 intervals, never request by request.
func TestPageSize10k(t *testing.T) {
	res := tenThousand(t)
	if res.Summary.Requests != 10000 {
		t.Fatalf("%d requests, want 10000", res.Summary.Requests)
	}
	p, err := Build(res, "test")
	if err != nil {
		t.Fatal(err)
	}
	page := render(t, p)
	const limit = 2 << 20
	if len(page) > limit {
		t.Errorf("page of 10,000 requests is %d bytes, want under %d", len(page), limit)
	}
	// The numbers still equal the summary recomputed from 10,000 records.
	v := resultValues(t, res)
	checkNumbers(t, page, func(_, m string) (float64, bool) { return v(m) })
	t.Logf("10,000 requests: %d bytes", len(page))
}

// BenchmarkPage10k measures building and writing the page of a
// 10,000-request run (the result already loaded) and reports its size.
func BenchmarkPage10k(b *testing.B) {
	res := tenThousand(b)
	var size int
	for b.Loop() {
		p, err := Build(res, "bench")
		if err != nil {
			b.Fatal(err)
		}
		var buf bytes.Buffer
		if err := p.Write(&buf); err != nil {
			b.Fatal(err)
		}
		size = buf.Len()
	}
	b.ReportMetric(float64(size), "page-bytes")
}
