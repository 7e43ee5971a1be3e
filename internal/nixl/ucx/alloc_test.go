package ucx

import (
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// Waiting for a transfer polls its status thousands of times: a poll
// that allocates makes Go's GC run, and on a small host its mark worker
// takes a core from the copy (the nixl backend's polls did, see
// capi.TestPollsDoNotAllocate).
func TestStatusPollDoesNotAllocate(t *testing.T) {
	init, err := New(nixl.Config{Name: "initiator"})
	if err != nil {
		t.Fatal(err)
	}
	defer init.Close()
	target, err := New(nixl.Config{Name: "target"})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ib, err := nixl.AllocDRAM(4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ib.Free()
	tb, err := nixl.AllocDRAM(4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Free()
	if err := init.RegisterMem(ib); err != nil {
		t.Fatal(err)
	}
	if err := target.RegisterMem(tb); err != nil {
		t.Fatal(err)
	}
	md, err := target.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	remote, err := init.LoadRemoteMD(md)
	if err != nil {
		t.Fatal(err)
	}
	x, err := init.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{ib.Desc(0, 4096)}, nixl.DRAM, []nixl.Desc{tb.Desc(0, 4096)}, remote, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := init.PostXferReq(x)
	for deadline := time.Now().Add(20 * time.Second); st == nixl.InProgress && err == nil && time.Now().Before(deadline); {
		st, err = init.XferStatus(x)
	}
	if st != nixl.Done {
		t.Fatalf("transfer ended %v: %v", st, err)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = init.XferStatus(x) }); n != 0 {
		t.Errorf("a status poll of a finished request allocates %.1f times", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = init.Telemetry(x) }); n != 0 {
		t.Errorf("reading telemetry allocates %.1f times", n)
	}
}
