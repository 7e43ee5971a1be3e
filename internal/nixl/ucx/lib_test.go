package ucx

import (
	"path/filepath"
	"strings"
	"testing"
)

// LibraryPath names the libucp file the process runs on (probe env finds
// the matching ucx_info beside it).
func TestLibraryPath(t *testing.T) {
	p := LibraryPath()
	t.Logf("libucp %s from %q", Version(), p)
	if !strings.HasPrefix(filepath.Base(p), "libucp.so") {
		t.Errorf("LibraryPath %q is not a libucp", p)
	}
}
