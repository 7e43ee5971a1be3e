package ec

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
)

// BlockCache is the encoder cache's bookkeeping over a region's blocks
// (vLLM's EmbeddingCache): entries keyed by mm_hash own a list of block
// indices and a pin count — not ready (being encoded or transferred),
// ready (0: evictable) or pinned (>0: a transfer reads it, or the current
// step uses it). Alloc evicts ready, unpinned entries in FIFO order of
// their creation until the new entry fits, and fails without evicting
// anything when free plus evictable blocks cannot hold it. Free blocks
// are a LIFO stack, so recently used blocks are reused first.
//
// It is a plain struct driven by method calls (safe for concurrent use),
// so the producer, the consumer and the unit tests share one
// implementation.
type Cache struct {
	mu      sync.Mutex
	total   int
	free    []int
	entries map[string]*cacheEntry
	fifo    *list.List // of *cacheEntry, oldest first
	stats   CacheStats
}

type cacheEntry struct {
	key    string
	blocks []int
	pins   int // notReady, 0 ready, >0 pinned
	elem   *list.Element
}

const notReady = -1

// CacheStats count what the cache did.
type CacheStats struct {
	Evictions     int64 `json:"evictions"`      // entries evicted to make room
	EvictedBlocks int64 `json:"evicted_blocks"` // their blocks
	PinnedSkips   int64 `json:"pinned_skips"`   // pinned entries an eviction had to pass over
	NotReadySkips int64 `json:"not_ready_skips"`
	Exhausted     int64 `json:"exhausted"` // allocations refused: free + evictable too small
}

// EntryState is the state of a cache entry.
type EntryState int

// Entry states.
const (
	Absent EntryState = iota
	NotReady
	Ready
	Pinned
)

func (s EntryState) String() string {
	return [...]string{"absent", "not ready", "ready", "pinned"}[s]
}

// ErrExhausted is returned when free and evictable blocks cannot hold an
// allocation: everything else is pinned or not ready.
var ErrExhausted = errors.New("region exhausted")

// NewBlockCache manages numBlocks blocks, all free.
func NewCache(numBlocks int) *Cache {
	c := &Cache{total: numBlocks, free: make([]int, numBlocks), entries: map[string]*cacheEntry{}, fifo: list.New()}
	for i := range c.free {
		c.free[i] = numBlocks - 1 - i // pop order 0, 1, 2, ...
	}
	return c
}

// Alloc creates a not-ready entry of n blocks for key, evicting ready,
// unpinned entries oldest first if needed.
func (c *Cache) Alloc(key string, n int) ([]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc %q: %d blocks", key, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; ok {
		return nil, fmt.Errorf("alloc %q: already allocated", key)
	}
	if n > c.total {
		c.stats.Exhausted++
		return nil, fmt.Errorf("%w: %d blocks needed, the region has %d", ErrExhausted, n, c.total)
	}
	if len(c.free) < n {
		evictable := len(c.free)
		for e := c.fifo.Front(); e != nil && evictable < n; e = e.Next() {
			if ent := e.Value.(*cacheEntry); ent.pins == 0 {
				evictable += len(ent.blocks)
			}
		}
		if evictable < n {
			c.stats.Exhausted++
			return nil, fmt.Errorf("%w: %d blocks needed, %d free + %d evictable (the rest pinned or not ready)",
				ErrExhausted, n, len(c.free), evictable-len(c.free))
		}
		for e := c.fifo.Front(); e != nil && len(c.free) < n; {
			next := e.Next()
			switch ent := e.Value.(*cacheEntry); {
			case ent.pins > 0:
				c.stats.PinnedSkips++
			case ent.pins == notReady:
				c.stats.NotReadySkips++
			default:
				c.removeLocked(ent)
				c.stats.Evictions++
				c.stats.EvictedBlocks += int64(len(ent.blocks))
			}
			e = next
		}
	}
	blocks := make([]int, n)
	for i := range blocks {
		blocks[i] = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	}
	ent := &cacheEntry{key: key, blocks: blocks, pins: notReady}
	ent.elem = c.fifo.PushBack(ent)
	c.entries[key] = ent
	return append([]int(nil), blocks...), nil
}

func (c *Cache) removeLocked(ent *cacheEntry) {
	c.fifo.Remove(ent.elem)
	delete(c.entries, ent.key)
	for i := len(ent.blocks) - 1; i >= 0; i-- {
		c.free = append(c.free, ent.blocks[i])
	}
}

// MarkReady makes a not-ready entry ready (evictable).
func (c *Cache) MarkReady(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok || ent.pins != notReady {
		return fmt.Errorf("mark ready %q: %s", key, c.stateLocked(ent))
	}
	ent.pins = 0
	return nil
}

// Discard frees a not-ready entry (a failed encode or transfer).
func (c *Cache) Discard(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok || ent.pins != notReady {
		return fmt.Errorf("discard %q: %s", key, c.stateLocked(ent))
	}
	c.removeLocked(ent)
	return nil
}

// Detach removes a not-ready entry but keeps its blocks allocated: a
// transfer that may still write them (it could not be aborted) owns them
// until Release.
func (c *Cache) Detach(key string) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok || ent.pins != notReady {
		return nil, fmt.Errorf("detach %q: %s", key, c.stateLocked(ent))
	}
	c.fifo.Remove(ent.elem)
	delete(c.entries, key)
	return ent.blocks, nil
}

// Release returns detached blocks to the free pool.
func (c *Cache) Release(blocks []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(blocks) - 1; i >= 0; i-- {
		c.free = append(c.free, blocks[i])
	}
}

// PinIfReady pins a ready (or already pinned) entry and returns its
// blocks, or says why not: Absent or NotReady.
func (c *Cache) PinIfReady(key string) ([]int, EntryState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	switch {
	case !ok:
		return nil, Absent
	case ent.pins == notReady:
		return nil, NotReady
	}
	ent.pins++
	return append([]int(nil), ent.blocks...), Pinned
}

// Unpin drops one pin.
func (c *Cache) Unpin(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok || ent.pins <= 0 {
		return fmt.Errorf("unpin %q: %s", key, c.stateLocked(ent))
	}
	ent.pins--
	return nil
}

// Drop frees a ready, unpinned entry.
func (c *Cache) Drop(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok || ent.pins != 0 {
		return fmt.Errorf("drop %q: %s", key, c.stateLocked(ent))
	}
	c.removeLocked(ent)
	return nil
}

// State reports an entry's state and blocks.
func (c *Cache) State(key string) (EntryState, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent, ok := c.entries[key]
	if !ok {
		return Absent, nil
	}
	return c.stateLocked(ent), append([]int(nil), ent.blocks...)
}

func (c *Cache) stateLocked(ent *cacheEntry) EntryState {
	switch {
	case ent == nil:
		return Absent
	case ent.pins == notReady:
		return NotReady
	case ent.pins == 0:
		return Ready
	}
	return Pinned
}

// Free is the number of free blocks.
func (c *Cache) Free() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.free)
}

// Len is the number of entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Stats returns the counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Check verifies the invariant that every block is either free or owned
// by exactly one entry (or detached, counted by the caller), for tests and
// for a leak check at the end of a run: it returns the number of blocks
// neither free nor in an entry.
func (c *Cache) Check() (detached int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make([]bool, c.total)
	mark := func(b int, who string) error {
		if b < 0 || b >= c.total {
			return fmt.Errorf("block %d out of range (%s)", b, who)
		}
		if seen[b] {
			return fmt.Errorf("block %d owned twice (%s)", b, who)
		}
		seen[b] = true
		return nil
	}
	for _, b := range c.free {
		if err := mark(b, "free"); err != nil {
			return 0, err
		}
	}
	for k, ent := range c.entries {
		for _, b := range ent.blocks {
			if err := mark(b, k); err != nil {
				return 0, err
			}
		}
	}
	for _, s := range seen {
		if !s {
			detached++
		}
	}
	return detached, nil
}
