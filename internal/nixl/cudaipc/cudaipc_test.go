package cudaipc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

func TestMain(m *testing.M) {
	// On the fake driver every async copy sleeps first, so a notification
	// sent before its data landed would be seen early, every time.
	os.Setenv("NIXLCTL_FAKE_CUDA_DELAY_US", "300")
	cudatest.MustSetup()
	os.Exit(m.Run())
}

func FuzzDecodeConn(f *testing.F) {
	f.Add(encodeConn(connInfo{Sock: "@nixlctl-cuda-ipc-1-ab", Dev: 0, UUID: "GPU-00"}))
	f.Add(encodeConn(connInfo{Sock: "@x", Dev: -1}))
	f.Add([]byte("CIPC\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeConn(b)
		if err != nil {
			if !errors.Is(err, nixl.ErrBadMetadata) {
				t.Fatalf("error does not wrap ErrBadMetadata: %v", err)
			}
			return
		}
		if !bytes.Equal(encodeConn(c), b) {
			t.Fatalf("%+v does not encode back to its input", c)
		}
	})
}

func FuzzDecodeKey(f *testing.F) {
	var h cuda.IPCHandle
	copy(h[:], "handle")
	f.Add(encodeKey(ipcKey{Offset: 4096, Size: 1 << 20, Handle: h}), uint64(4096))
	f.Add(encodeKey(ipcKey{Size: 1}), uint64(2))
	f.Fuzz(func(t *testing.T, b []byte, regionLen uint64) {
		k, err := decodeKey(b, regionLen)
		if err != nil {
			if !errors.Is(err, nixl.ErrBadMetadata) {
				t.Fatalf("error does not wrap ErrBadMetadata: %v", err)
			}
			return
		}
		if k.Offset+regionLen > k.Size || k.Offset+regionLen < k.Offset {
			t.Fatalf("region %d+%d accepted outside its %d-byte allocation", k.Offset, regionLen, k.Size)
		}
		if !bytes.Equal(encodeKey(k), b) {
			t.Fatalf("%+v does not encode back to its input", k)
		}
	})
}

func FuzzDecodeNotif(f *testing.F) {
	f.Add(encodeNotif("initiator", []byte("req-1")))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		from, msg, err := decodeNotif(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeNotif(from, msg), b) {
			t.Fatalf("%q/%q does not encode back to its input", from, msg)
		}
	})
}

// pair is two agents of this process on GPU dev and dev2.
func pair(t *testing.T, size, dev, dev2 int) (init, target nixl.Agent, ib, tb *nixl.Buffer, remote string) {
	t.Helper()
	cudatest.RequireDevices(t, max(dev, dev2)+1)
	var err error
	if init, err = New(nixl.Config{Name: "initiator"}); err != nil {
		t.Fatal(err)
	}
	if target, err = New(nixl.Config{Name: "target"}); err != nil {
		t.Fatal(err)
	}
	if ib, err = cuda.Alloc(dev, size); err != nil {
		t.Fatal(err)
	}
	if tb, err = cuda.Alloc(dev2, size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		init.Close()
		target.Close()
		ib.Free()
		tb.Free()
	})
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
	if remote, err = init.LoadRemoteMD(md); err != nil {
		t.Fatal(err)
	}
	own, _ := init.LocalMD()
	if _, err := target.LoadRemoteMD(own); err != nil {
		t.Fatal(err)
	}
	return
}

func spans(n, blk int, reverse bool, size int) []nixl.Span {
	out := make([]nixl.Span, n)
	for i := range out {
		out[i] = nixl.Span{Off: i * blk, Len: blk}
		if reverse {
			out[i].Off = size - (i+1)*blk
		}
	}
	return out
}

func descs(b *nixl.Buffer, ss []nixl.Span) []nixl.Desc {
	out := make([]nixl.Desc, len(ss))
	for i, s := range ss {
		out[i] = b.Desc(s.Off, s.Len)
	}
	return out
}

// A notification attached to a transfer arrives after the data, and it
// goes out with nobody polling the initiator: the completion goroutine
// sends it. Both directions, on one GPU and across two.
// awaitData waits for a notification at target (10 s at most) and checks
// that it did not overtake its transfer: dst's spans hold the data key
// tags.
func awaitData(t *testing.T, target nixl.Agent, dst *nixl.Buffer, spans []nixl.Span, key func(int) uint64, iter int) {
	t.Helper()
	select {
	case <-target.NotifReady():
	case <-time.After(10 * time.Second):
		t.Fatalf("iteration %d: no notification", iter)
	}
	if c, err := blocktag.CheckSpans(dst, spans, key); err != nil || c.Bad != 0 {
		t.Fatalf("iteration %d: notified before the data was there: %+v %v", iter, c, err)
	}
}

func TestNotificationAfterDataWithoutPolling(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, devs := range [][2]int{{0, 0}, {0, 1}} {
		for _, op := range []nixl.Op{nixl.Write, nixl.Read} {
			t.Run(fmt.Sprintf("%v/GPU%d-GPU%d", op, devs[0], devs[1]), func(t *testing.T) {
				const size, blk, n = 1 << 20, 16 << 10, 16
				init, target, ib, tb, remote := pair(t, size, devs[0], devs[1])
				ls, rs := spans(n, blk, false, size), spans(n, blk, true, size)
				src, srcSpans, dst, dstSpans := ib, ls, tb, rs
				if op == nixl.Read {
					src, srcSpans, dst, dstSpans = tb, rs, ib, ls
				}
				for iter := 0; iter < 5; iter++ {
					key := func(i int) uint64 { return blocktag.Key(uint64(iter), uint64(i)) }
					if err := blocktag.FillSpans(src, srcSpans, key); err != nil {
						t.Fatal(err)
					}
					msg := []byte(fmt.Sprintf("done-%d", iter))
					r, err := init.CreateXferReq(op, nixl.VRAM, descs(ib, ls), nixl.VRAM, descs(tb, rs), remote, msg)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := init.PostXferReq(r); err != nil {
						t.Fatal(err)
					}
					awaitData(t, target, dst, dstSpans, key, iter)
					got, _ := target.GetNotifs()
					if len(got["initiator"]) != 1 || string(got["initiator"][0]) != string(msg) {
						t.Fatalf("notifications %q", got)
					}
					// The sender publishes Done once the notification is sent:
					// just after the target may have seen it.
					deadline := time.Now().Add(10 * time.Second)
					for st, err := init.XferStatus(r); st != nixl.Done; st, err = init.XferStatus(r) {
						if st == nixl.Failed || time.Now().After(deadline) {
							t.Fatalf("status after the notification: %v %v", st, err)
						}
					}
					tel := init.Telemetry(r)
					if tel.Bytes != n*blk || tel.Descs != n || tel.PostDuration <= 0 || tel.XferDuration <= 0 {
						t.Errorf("telemetry %+v", tel)
					}
					if err := init.ReleaseXferReq(r); err != nil {
						t.Fatal(err)
					}
				}
				if strings.Contains(init.Info().Details["transport:target"], "IPC") {
					t.Errorf("in one process the pointers are used directly: %s", init.Info().Details["transport:target"])
				}
			})
		}
	}
}

func TestRefusals(t *testing.T) {
	cudatest.Require(t)
	a, err := New(nixl.Config{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dram, _ := nixl.AllocDRAM(4096, false)
	defer dram.Free()
	if err := a.RegisterMem(dram); !errors.Is(err, nixl.ErrMemType) || !strings.Contains(err.Error(), "GPU memory only") {
		t.Errorf("DRAM registration: %v", err)
	}
	if _, err := a.PrepXferDlist("", nixl.DRAM, nil); !errors.Is(err, nixl.ErrMemType) {
		t.Errorf("DRAM descriptors: %v", err)
	}
	// Metadata of an agent on another host.
	md := nixl.Metadata{Backend: backendName, Name: "far", Conn: encodeConn(connInfo{Sock: "@nowhere", Dev: 0}),
		Proc: nixl.Process{Host: "another-boot-id", PID: 1}}
	b, _ := md.Encode()
	if _, err := a.LoadRemoteMD(b); !errors.Is(err, nixl.ErrUnavailable) {
		t.Errorf("agent on another host: %v", err)
	}
	// A dead peer's socket.
	md.Proc = nixl.Self()
	b, _ = md.Encode()
	if _, err := a.LoadRemoteMD(b); !errors.Is(err, nixl.ErrPeerFailed) {
		t.Errorf("unreachable peer: %v", err)
	}
	// A region key that claims more than its allocation.
	md.Conn = encodeConn(connInfo{Sock: "@nowhere", Dev: 0})
	md.Regions = []nixl.RegionMD{{Addr: 1 << 20, Len: 8192, Mem: nixl.VRAM, Key: encodeKey(ipcKey{Offset: 0, Size: 4096})}}
	b, _ = md.Encode()
	if _, err := a.LoadRemoteMD(b); !errors.Is(err, nixl.ErrBadMetadata) {
		t.Errorf("oversized region: %v", err)
	}
	if cuda.DeviceCount() > 1 {
		b0, _ := cuda.Alloc(0, 4096)
		defer b0.Free()
		b1, _ := cuda.Alloc(1, 4096)
		defer b1.Free()
		if err := a.RegisterMem(b0); err != nil {
			t.Fatal(err)
		}
		if err := a.RegisterMem(b1); err == nil || !strings.Contains(err.Error(), "one GPU") {
			t.Errorf("a second GPU's memory: %v", err)
		}
	}
	if err := a.SendNotif("x", make([]byte, maxNotif+1)); err == nil {
		t.Error("an oversized notification was sent")
	}
}

// Another goroutine polling a request while it is posted again must never
// finish the new posting with the previous posting's completion (the
// notification would then overtake the data).
func TestConcurrentPollerAndRepost(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after pair's cleanup closed the agents
	const size, blk, n = 1 << 20, 16 << 10, 16
	init, target, ib, tb, remote := pair(t, size, 0, 0)
	ls, rs := spans(n, blk, false, size), spans(n, blk, true, size)
	r, err := init.CreateXferReq(nixl.Write, nixl.VRAM, descs(ib, ls), nixl.VRAM, descs(tb, rs), remote, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = init.XferStatus(r)
			}
		}
	}()
	defer func() { close(stop); <-polled }()
	for iter := 0; iter < 30; iter++ {
		key := func(i int) uint64 { return blocktag.Key(uint64(iter), uint64(i)) }
		if err := blocktag.FillSpans(ib, ls, key); err != nil {
			t.Fatal(err)
		}
		if _, err := init.PostXferReq(r); err != nil {
			t.Fatal(err)
		}
		awaitData(t, target, tb, rs, key, iter)
		if got, _ := target.GetNotifs(); len(got["initiator"]) != 1 {
			t.Fatalf("iteration %d: notifications %q", iter, got)
		}
		for st, _ := init.XferStatus(r); st != nixl.Done; st, _ = init.XferStatus(r) {
			if st == nixl.Failed {
				t.Fatal("failed")
			}
		}
	}
}
