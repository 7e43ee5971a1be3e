package fleet

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"sync"
)

// ucxWarnLine matches UCX's own WARN lines ("[1700000000.123] [vm:42:0]
// mpool.c:269 UCX WARN object 0x55d... was not returned to mpool
// ucp_requests"), and ucxVolatile the parts that differ between lines
// saying the same thing: timestamps, pids, addresses, counts.
var (
	ucxWarnLine = regexp.MustCompile(`\bUCX\s+WARN\b`)
	ucxVolatile = regexp.MustCompile(`\[[0-9.]+\]|\[[^\]]*:[0-9]+:[0-9]+\]|0x[0-9a-fA-F]+|[0-9]+`)
)

// ucxWarnRepeats is how many lines of one UCX warning pass before the
// rest are only counted.
const ucxWarnRepeats = 3

// warnFolder passes a child's stderr through, but counts UCX WARN lines
// that repeat: a prefill whose decode died mid-transfer prints one "not
// returned to mpool" line per request object UCX still held when its
// worker closed (203 of them in one run), burying everything else. The
// first few of each pass; Close says how many more there were.
type warnFolder struct {
	mu      sync.Mutex
	w       io.Writer
	name    string // the child, for the summary line
	partial []byte
	seen    map[string]int
	order   []string
	example map[string]string
}

func newWarnFolder(w io.Writer, name string) *warnFolder {
	return &warnFolder{w: w, name: name, seen: map[string]int{}, example: map[string]string{}}
}

func (f *warnFolder) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.partial = append(f.partial, p...)
	for {
		i := bytes.IndexByte(f.partial, '\n')
		if i < 0 {
			break
		}
		line := f.partial[:i+1]
		if f.pass(line) {
			if _, err := f.w.Write(line); err != nil {
				f.partial = f.partial[i+1:]
				return len(p), err
			}
		}
		f.partial = f.partial[i+1:]
	}
	return len(p), nil
}

// pass counts line if it is a UCX warning and says whether to print it.
func (f *warnFolder) pass(line []byte) bool {
	if !ucxWarnLine.Match(line) {
		return true
	}
	key := ucxVolatile.ReplaceAllString(string(line), "N")
	if f.seen[key] == 0 {
		f.order = append(f.order, key)
		f.example[key] = string(bytes.TrimSpace(line))
	}
	f.seen[key]++
	return f.seen[key] <= ucxWarnRepeats
}

// Close writes what is left of a last line and one summary line per UCX
// warning that was cut short. Call it once the child exited (its stderr
// is copied until then).
func (f *warnFolder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.partial) > 0 {
		_, _ = f.w.Write(append(f.partial, '\n'))
		f.partial = nil
	}
	for _, k := range f.order {
		if n := f.seen[k]; n > ucxWarnRepeats {
			fmt.Fprintf(f.w, "nixlctl: %s printed %d more UCX warnings like %q (%d in all; not shown)\n", f.name, n-ucxWarnRepeats, f.example[k], n)
		}
		delete(f.seen, k)
	}
	f.order = nil
	return nil
}
