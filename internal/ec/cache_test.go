package ec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

func ready(t *testing.T, c *Cache, key string, n int) []int {
	t.Helper()
	b, err := c.Alloc(key, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MarkReady(key); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBlockCacheAllocFree(t *testing.T) {
	c := NewCache(10)
	a, err := c.Alloc("a", 3)
	if err != nil || !cmp.Equal(a, []int{0, 1, 2}) {
		t.Fatalf("first alloc %v %v", a, err)
	}
	if st, _ := c.State("a"); st != NotReady {
		t.Errorf("new entry is %v", st)
	}
	if _, err := c.Alloc("a", 1); err == nil {
		t.Error("double alloc accepted")
	}
	if _, err := c.Alloc("z", 0); err == nil {
		t.Error("zero blocks accepted")
	}
	if err := c.Discard("a"); err != nil || c.Free() != 10 {
		t.Fatalf("discard: %v, %d free", err, c.Free())
	}
	// LIFO: the blocks just freed come back first.
	b, _ := c.Alloc("b", 2)
	if !cmp.Equal(b, []int{0, 1}) {
		t.Errorf("LIFO reuse: %v", b)
	}
	if err := c.Unpin("b"); err == nil {
		t.Error("unpin of a not-ready entry accepted")
	}
	if err := c.MarkReady("b"); err != nil {
		t.Fatal(err)
	}
	if err := c.MarkReady("b"); err == nil {
		t.Error("mark ready twice accepted")
	}
	if err := c.Discard("b"); err == nil {
		t.Error("discard of a ready entry accepted (only failed fills are discarded)")
	}
	if err := c.Drop("b"); err != nil || c.Free() != 10 || c.Len() != 0 {
		t.Errorf("drop: %v, %d free, %d entries", err, c.Free(), c.Len())
	}
	if n, err := c.Check(); err != nil || n != 0 {
		t.Errorf("check: %d %v", n, err)
	}
}

func TestBlockCachePins(t *testing.T) {
	c := NewCache(4)
	if _, st := c.PinIfReady("x"); st != Absent {
		t.Errorf("absent: %v", st)
	}
	c.Alloc("x", 2)
	if _, st := c.PinIfReady("x"); st != NotReady {
		t.Errorf("not ready: %v", st)
	}
	c.MarkReady("x")
	b1, st := c.PinIfReady("x")
	b2, st2 := c.PinIfReady("x")
	if st != Pinned || st2 != Pinned || !cmp.Equal(b1, b2) {
		t.Fatalf("pin twice: %v %v %v %v", b1, st, b2, st2)
	}
	if err := c.Drop("x"); err == nil {
		t.Error("drop of a pinned entry accepted")
	}
	c.Unpin("x")
	if st, _ := c.State("x"); st != Pinned {
		t.Errorf("one pin left: %v", st)
	}
	c.Unpin("x")
	if st, _ := c.State("x"); st != Ready {
		t.Errorf("all pins gone: %v", st)
	}
	if err := c.Unpin("x"); err == nil {
		t.Error("unpin below zero accepted")
	}
}

func TestBlockCacheFIFOSkipsPinned(t *testing.T) {
	c := NewCache(6)
	ready(t, c, "old", 2)
	ready(t, c, "mid", 2)
	ready(t, c, "new", 2)
	c.PinIfReady("old") // an in-flight transfer reads it
	// Needs 2: "old" is first in line but pinned, so "mid" goes.
	b, err := c.Alloc("next", 2)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State("mid"); st != Absent {
		t.Errorf("mid should be evicted, is %v", st)
	}
	for _, k := range []string{"old", "new"} {
		if st, _ := c.State(k); st == Absent {
			t.Errorf("%s evicted", k)
		}
	}
	s := c.Stats()
	if s.Evictions != 1 || s.EvictedBlocks != 2 || s.PinnedSkips != 1 {
		t.Errorf("stats %+v", s)
	}
	// Needs 2 again: "old" is still pinned, "new" goes; "next" (not
	// ready, behind it) is never reached.
	if _, err := c.Alloc("last", 2); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State("new"); st != Absent {
		t.Errorf("new should be evicted, is %v", st)
	}
	if st, _ := c.State("next"); st != NotReady || len(b) != 2 {
		t.Errorf("not-ready entry touched: %v", st)
	}
	if s := c.Stats(); s.PinnedSkips != 2 || s.Evictions != 2 {
		t.Errorf("stats %+v", s)
	}
	// A not-ready entry first in line is passed over like a pinned one.
	c2 := NewCache(3)
	c2.Alloc("filling", 1)
	ready(t, c2, "done", 2)
	if _, err := c2.Alloc("want", 2); err != nil {
		t.Fatal(err)
	}
	if st, _ := c2.State("filling"); st != NotReady {
		t.Errorf("not-ready entry evicted (%v)", st)
	}
	if s := c2.Stats(); s.NotReadySkips != 1 || s.Evictions != 1 {
		t.Errorf("stats %+v", s)
	}
	if n, err := c.Check(); err != nil || n != 0 {
		t.Errorf("check: %d %v", n, err)
	}
}

func TestBlockCacheExhaustion(t *testing.T) {
	c := NewCache(4)
	ready(t, c, "a", 2)
	c.PinIfReady("a")
	c.Alloc("b", 1) // not ready
	ready(t, c, "c", 1)
	// 0 free + 1 evictable ("c") < 2: refused, and nothing evicted.
	_, err := c.Alloc("d", 2)
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "0 free + 1 evictable") {
		t.Fatalf("want exhaustion, got %v", err)
	}
	if st, _ := c.State("c"); st != Ready {
		t.Errorf("a refused allocation evicted c (%v)", st)
	}
	if _, err := c.Alloc("huge", 5); !errors.Is(err, ErrExhausted) {
		t.Errorf("larger than the region: %v", err)
	}
	if s := c.Stats(); s.Exhausted != 2 || s.Evictions != 0 {
		t.Errorf("stats %+v", s)
	}
	// Detached blocks stay out of the pool until released.
	blocks, err := c.Detach("b")
	if err != nil || len(blocks) != 1 {
		t.Fatal(blocks, err)
	}
	if n, _ := c.Check(); n != 1 {
		t.Errorf("detached blocks: %d", n)
	}
	c.Release(blocks)
	if n, err := c.Check(); n != 0 || err != nil {
		t.Errorf("after release: %d %v", n, err)
	}
}

func TestShmRegionAndStaleCleanup(t *testing.T) {
	dir := t.TempDir()
	r, err := CreateShmRegion(dir, "test_role", 10*5120+100, 5120)
	if err != nil {
		t.Fatal(err)
	}
	if r.NumBlocks != 10 || len(r.Descs()) != 10 || r.Buffer().Len != 10*5120 {
		t.Fatalf("region %d blocks, buffer %d", r.NumBlocks, r.Buffer().Len)
	}
	if d := r.Descs()[3]; d.Addr != r.Buffer().Addr+3*5120 || d.Len != 5120 {
		t.Errorf("descriptor 3: %+v", d)
	}
	blocktag.Fill(r.Block(9), 42)
	if blocktag.Check(r.Block(9), 42) != nil {
		t.Error("block 9 round trip")
	}
	// Unlinked as soon as it is mapped: a killed process leaks nothing.
	if _, err := os.Stat(r.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("region file %s still there while mapped: %v", r.Path, err)
	}
	// The file of a process that is gone is stale; our own live file and
	// files nixlctl did not name are kept.
	dead := deadPID(t)
	stale := filepath.Join(dir, shmPrefix+dead+"_consumer_1.mmap")
	foreign := filepath.Join(dir, "vllm_ec_abc.mmap")
	for _, p := range []string{stale, foreign} {
		os.WriteFile(p, []byte("x"), 0o600)
	}
	removed, err := CleanStaleRegions(dir)
	if err != nil || !cmp.Equal(removed, []string{stale}) {
		t.Errorf("removed %v (%v)", removed, err)
	}
	live := filepath.Join(dir, fmt.Sprintf("%s%d-%d_consumer_1.mmap", shmPrefix, nixl.Self().PID, nixl.Self().StartTime))
	os.WriteFile(live, []byte("x"), 0o600)
	if removed, _ := CleanStaleRegions(dir); len(removed) != 0 {
		t.Errorf("removed %v: a live owner's file and a foreign file must stay", removed)
	}
	for _, p := range []string{live, foreign} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed", p)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateShmRegion(dir, "x", 100, 5120); err == nil {
		t.Error("region smaller than a block accepted")
	}
}

// deadPID returns "pid-start" of a process that has exited and been reaped.
func deadPID(t *testing.T) string {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	start, _ := nixl.StartTime(p.Pid)
	p.Wait()
	return fmt.Sprintf("%d-%d", p.Pid, start)
}
