package handoff

import (
	"strings"
	"testing"
	"time"
)

func TestStallWarning(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	// steady: requests of 40 ms, two in flight, one finishing every 20 ms.
	steady := func(n int, from int64) []HandoffRecord {
		var rs []HandoffRecord
		for i := range n {
			start := from + int64(i)*20*ms
			rs = append(rs, HandoffRecord{Bytes: 1, TStart: start, TReady: start + 40*ms})
		}
		return rs
	}
	frozen := append(steady(50, 0), HandoffRecord{Bytes: 1, TStart: 1000 * ms, TReady: 21000 * ms})
	frozen = append(frozen, steady(50, 21000*ms)...)
	tests := []struct {
		name    string
		records []HandoffRecord
		want    string
	}{
		{"steady run", steady(100, 0), ""},
		{"frozen 20 s mid-run", frozen, "no request finished for 20.0 s"},
		// A slow run is not a stalled one: each request takes 2 s, so a
		// 2 s gap is one request's time.
		{"slow requests", []HandoffRecord{{Bytes: 1, TStart: 0, TReady: 2000 * ms}, {Bytes: 1, TStart: 2000 * ms, TReady: 4000 * ms}}, ""},
		// Warm-up and failed requests do not count, nor do the gaps
		// between rounds (the reference ran there).
		{"rounds apart", append(steady(20, 0), func() []HandoffRecord {
			rs := steady(20, 60000*ms)
			for i := range rs {
				rs[i].Round = 1
			}
			return append(rs, HandoffRecord{Warmup: true, TStart: 0, TReady: 90000 * ms}, HandoffRecord{Error: "x", TStart: 0, TReady: 90000 * ms})
		}()...), ""},
		// An open loop at one request a second: idle between arrivals.
		{"open loop, sparse arrivals", []HandoffRecord{{Bytes: 1, TStart: 0, TReady: 40 * ms}, {Bytes: 1, TStart: 3000 * ms, TReady: 3040 * ms}, {Bytes: 1, TStart: 6000 * ms, TReady: 6040 * ms}}, ""},
		{"stall before the first finish", append([]HandoffRecord{{Bytes: 1, TStart: 0, TReady: 5000 * ms}}, steady(50, 5000*ms)...), "no request finished for 5.0 s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, gap := stallWarning(tc.records)
			if tc.want == "" {
				if got != "" {
					t.Fatalf("warned %q", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) || gap <= 0 {
				t.Fatalf("got %q (gap %v), want %q", got, gap, tc.want)
			}
		})
	}
}
