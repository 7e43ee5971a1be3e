package ec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// ShmRegion is the encoder cache's memory, like vLLM's ECSharedRegion: a
// file in /dev/shm mapped MAP_SHARED, cut into fixed-size blocks of one
// embedding vector each (hidden size x dtype bytes), registered with the
// agent once as one DRAM region. Being a file, it could be mapped by
// other processes of the same engine (vLLM's TP workers share it).
//
// Upstream keeps the file until its process closes the region, and a
// process killed with SIGKILL leaks it (its memory stays in /dev/shm
// until someone removes it). nixlctl maps nothing by path after
// creation, so it unlinks the file as soon as it is mapped: the mapping
// holds the memory, which the kernel frees however the process ends (a
// double Ctrl-C or a killed driver left a 268 MB producer region and two
// 67 MB consumer regions behind). Files of older nixlctl versions are
// named after the creating process (pid and start time), and
// CleanStaleRegions, run whenever a region is created, still removes
// exactly the files of processes that are gone.
type ShmRegion struct {
	Path       string
	BlockBytes int
	NumBlocks  int
	data       []byte
	buf        *nixl.Buffer
}

// DefaultShmDir is where regions are created.
const DefaultShmDir = "/dev/shm"

// shmPrefix names nixlctl's region files: nixlctl_ec_<pid>-<start>_<role>_<seq>.mmap.
const shmPrefix = "nixlctl_ec_"

var shmSeq atomic.Uint64

// CreateShmRegion creates, maps and pre-faults a region of size bytes
// rounded down to whole blocks in dir ("" for /dev/shm).
func CreateShmRegion(dir, role string, size, blockBytes int) (*ShmRegion, error) {
	if blockBytes <= 0 {
		return nil, fmt.Errorf("block size must be > 0 (got %d)", blockBytes)
	}
	n := size / blockBytes
	if n <= 0 {
		return nil, fmt.Errorf("region of %d bytes holds no %d-byte block", size, blockBytes)
	}
	if dir == "" {
		dir = DefaultShmDir
	}
	_, _ = CleanStaleRegions(dir)
	self := nixl.Self()
	role = strings.Map(func(r rune) rune {
		if r == '_' || r == '/' || r == '.' {
			return '-'
		}
		return r
	}, role)
	path := filepath.Join(dir, fmt.Sprintf("%s%d-%d_%s_%d.mmap", shmPrefix, self.PID, self.StartTime, role, shmSeq.Add(1)))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create region: %w", err)
	}
	defer f.Close() // the mapping keeps the memory
	total := n * blockBytes
	fail := func(err error) (*ShmRegion, error) {
		os.Remove(path)
		return nil, err
	}
	if err := f.Truncate(int64(total)); err != nil {
		return fail(fmt.Errorf("size region %s: %w", path, err))
	}
	data, err := unix.Mmap(int(f.Fd()), 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("map region %s: %w", path, err))
	}
	// Fault the pages in now (vLLM uses MADV_POPULATE_WRITE), so neither
	// registration nor the first transfers pay for it; without tmpfs
	// space this fails here with a clear error instead of a SIGBUS later.
	if err := unix.Madvise(data, unix.MADV_POPULATE_WRITE); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			unix.Munmap(data)
			return fail(fmt.Errorf("populate region %s (%d bytes; is %s full?): %w", path, total, dir, err))
		}
		for i := 0; i < len(data); i += os.Getpagesize() {
			data[i] = 0 // kernels before 5.14
		}
	}
	if err := os.Remove(path); err != nil {
		unix.Munmap(data)
		return fail(fmt.Errorf("unlink region %s: %w", path, err))
	}
	r := &ShmRegion{Path: path, BlockBytes: blockBytes, NumBlocks: n, data: data}
	r.buf = nixl.NewBuffer(uint64(uintptr(unsafe.Pointer(&data[0]))), total, nixl.DRAM, 0, "shm", data, nil)
	return r, nil
}

// Buffer is the region as transfer memory, to register with an agent.
func (r *ShmRegion) Buffer() *nixl.Buffer { return r.buf }

// Block is the host view of block i.
func (r *ShmRegion) Block(i int) []byte {
	return r.data[i*r.BlockBytes : (i+1)*r.BlockBytes]
}

// Descs lists one descriptor per block, descriptor i being block i, the
// list vLLM preps locally and sends peers as its mem descriptor.
func (r *ShmRegion) Descs() []nixl.Desc {
	d := make([]nixl.Desc, r.NumBlocks)
	for i := range d {
		d[i] = r.buf.Desc(i*r.BlockBytes, r.BlockBytes)
	}
	return d
}

// Close unmaps the region (its file was unlinked when it was mapped);
// deregister it from its agent first.
func (r *ShmRegion) Close() error {
	if r.data == nil {
		return nil
	}
	err := unix.Munmap(r.data)
	r.data = nil
	return err
}

// CleanStaleRegions removes region files in dir whose creating process
// is gone (a pid that no longer runs, or runs with another start time),
// and returns their paths. Files of live processes and files not named
// by nixlctl are never touched.
func CleanStaleRegions(dir string) ([]string, error) {
	if dir == "" {
		dir = DefaultShmDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		pid, start, ok := parseRegionName(e.Name())
		if !ok || regionOwnerAlive(pid, start) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if os.Remove(p) == nil {
			removed = append(removed, p)
		}
	}
	return removed, nil
}

func parseRegionName(name string) (pid int, start uint64, ok bool) {
	rest, found := strings.CutPrefix(name, shmPrefix)
	if !found || !strings.HasSuffix(rest, ".mmap") {
		return 0, 0, false
	}
	owner, _, found := strings.Cut(rest, "_")
	if !found {
		return 0, 0, false
	}
	ps, ss, found := strings.Cut(owner, "-")
	if !found {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(ps)
	start, err2 := strconv.ParseUint(ss, 10, 64)
	return pid, start, err1 == nil && err2 == nil && pid > 0
}

// regionOwnerAlive treats a zombie or exiting owner as gone: its memory
// is being torn down and it will never unlink its file.
func regionOwnerAlive(pid int, start uint64) bool {
	return nixl.Alive(nixl.Process{PID: uint32(pid), StartTime: start})
}

// store is what either side of the encoder cache holds: its region of
// blocks, the cache's bookkeeping over them, and an agent that registered
// the region and prepared it as one list (by block index).
type store struct {
	region  *ShmRegion
	cache   *Cache
	agent   nixl.Agent
	descs   []nixl.Desc
	localDl nixl.Dlist
	md      []byte
}

// open fills s; on an error, what it made so far is left for the
// caller's close to release.
func (s *store) open(shmDir, role string, regionBytes, blockBytes int, backend, name string) error {
	var err error
	if s.region, err = CreateShmRegion(shmDir, role, regionBytes, blockBytes); err != nil {
		return err
	}
	s.cache = NewCache(s.region.NumBlocks)
	if s.agent, err = nixl.Open(backend, nixl.Config{Name: name}); err != nil {
		return err
	}
	if err = s.agent.RegisterMem(s.region.Buffer()); err != nil {
		return err
	}
	s.descs = s.region.Descs()
	if s.localDl, err = s.agent.PrepXferDlist("", nixl.DRAM, s.descs); err != nil {
		return err
	}
	s.md, err = s.agent.LocalMD()
	return err
}

// close undoes open, whatever part of it was done: the agent first (it
// fails transfers still running) and then the region it had registered.
func (s *store) close() error {
	var errs []error
	if s.agent != nil {
		if s.region != nil {
			_ = s.agent.DeregisterMem(s.region.Buffer())
		}
		errs = append(errs, s.agent.Close())
		s.agent = nil
	}
	if s.region != nil {
		errs = append(errs, s.region.Close())
		s.region = nil
	}
	return errors.Join(errs...)
}
