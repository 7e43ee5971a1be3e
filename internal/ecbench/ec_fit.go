package ecbench

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// hostRoom is what this host can give the regions: free bytes of the
// RAM-backed file system they live in, and MemAvailable (unknown: -1).
type hostRoom struct{ shmFree, memAvail int64 }

// readHostRoom statfs's the region directory and reads /proc/meminfo.
func readHostRoom() hostRoom {
	r := hostRoom{-1, -1}
	var st unix.Statfs_t
	if unix.Statfs(ec.DefaultShmDir, &st) == nil {
		r.shmFree = int64(st.Bavail) * st.Bsize
	}
	if avail := runcore.MemAvailable(); avail > 0 {
		r.memAvail = avail
	}
	return r
}

// checkRegionsFit refuses regions this host cannot hold. The regions are
// pre-faulted files in /dev/shm, which is RAM: a 1T region would fill it
// (and then memory) page by page before failing, with other processes'
// shared memory starved meanwhile, so the sizes are checked up front.
// Only the regions created here count: a remote producer's is not ours.
func (o *ECOptions) checkRegionsFit(room hostRoom) error {
	producer := int64(0)
	if o.Producer.Addr == "" {
		producer = int64(o.ProducerRegion)
	}
	consumers := int64(o.Consumers) * int64(o.ConsumerRegion)
	limit := room.shmFree
	if room.memAvail >= 0 && (limit < 0 || room.memAvail < limit) {
		limit = room.memAvail
	}
	if limit < 0 {
		return nil // nothing known: let the allocation say
	}
	var have []string
	if room.shmFree >= 0 {
		have = append(have, report.Bytes(room.shmFree)+" free in "+ec.DefaultShmDir)
	}
	if room.memAvail >= 0 {
		have = append(have, report.Bytes(room.memAvail)+" of memory available")
	}
	free := strings.Join(have, ", ")
	switch {
	case producer > limit:
		return errkind.Field("ProducerRegion", "%s does not fit: %s", report.Bytes(producer), free)
	case producer+consumers > limit:
		return errkind.Field("ConsumerRegion", "%d consumers x %s (plus the producer's %s) do not fit: %s",
			o.Consumers, report.Bytes(int64(o.ConsumerRegion)), report.Bytes(producer), free)
	}
	return nil
}
