package ecbench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// TestMain lets this test binary double as bench ec's encoder process.
func TestMain(m *testing.M) {
	if os.Getenv("NIXLCTL_BENCH_TEST_ENCODER") == "1" {
		if err := ctl.ServeStdio(context.Background(), ec.EncoderRole(slog.New(slog.NewTextHandler(os.Stderr, nil)))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The regions must fit the smaller of /dev/shm's free space and
// MemAvailable; the error names the region that does not.
func TestECRegionsFit(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name      string
		prod, con runcore.ByteSize
		consumers int
		remote    bool
		room      hostRoom
		field     string // "" fits
	}{
		{"fits", gib, gib, 2, false, hostRoom{8 * gib, 8 * gib}, ""},
		{"producer over shm", 4 * gib, gib, 2, false, hostRoom{3 * gib, 8 * gib}, "ProducerRegion"},
		{"producer over memory", 4 * gib, gib, 2, false, hostRoom{8 * gib, 3 * gib}, "ProducerRegion"},
		{"consumers over", gib, 2 * gib, 4, false, hostRoom{8 * gib, 8 * gib}, "ConsumerRegion"},
		{"remote producer not ours", 100 * gib, gib, 2, true, hostRoom{8 * gib, 8 * gib}, ""},
		{"unknown room", 100 * gib, gib, 2, false, hostRoom{-1, -1}, ""},
		{"memory unknown", 4 * gib, gib, 2, false, hostRoom{3 * gib, -1}, "ProducerRegion"},
	}
	for _, tc := range tests {
		o := DefaultECOptions()
		o.ProducerRegion, o.ConsumerRegion, o.Consumers = tc.prod, tc.con, tc.consumers
		if tc.remote {
			o.Producer.Addr = "127.0.0.1:7000"
		}
		err := o.checkRegionsFit(tc.room)
		_, isField := errkind.FieldIn(err, tc.field)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && !isField:
			t.Errorf("%s: want a %s error, got %v", tc.name, tc.field, err)
		case tc.field != "" && !strings.Contains(err.Error(), "free in /dev/shm"):
			t.Errorf("%s: the error does not say what is free: %v", tc.name, err)
		}
	}
}

// Without an encode time there is nothing for --overlap to overlap.
func TestECIgnored(t *testing.T) {
	o := DefaultECOptions()
	o.EncodeTime = 0
	if got := o.Ignored(); len(got) != 1 || got[0].Field != "Overlap" {
		t.Errorf("without an encode time: %+v, want Overlap ignored", got)
	}
	o.EncodeTime = 5e6
	if got := o.Ignored(); len(got) != 0 {
		t.Errorf("with an encode time: %+v, want nothing ignored", got)
	}
}

// A local run, producer a child process of this host: each end has a
// verdict on the whole payload and nothing warns.
func TestECNetPathLocalRun(t *testing.T) {
	t.Setenv("UCX_NET_DEVICES", "")
	o := smallEC(nixl.Read)
	o.Requests = 10
	res, err := RunEC(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	runcoretest.CheckLocalPath(t, res.NetPath, res.Warnings, res.Summary.Bytes, "producer", "consumer")
}
