package probe

import (
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nixlctl/nixlctl/internal/nixl/ucx"
)

// UCXLibraryVersion is the version of the libucp this process runs on.
func UCXLibraryVersion() string { return ucx.Version() }

// UCXKnows reports whether the UCP library in this process has the
// configuration variable name (UCX_ prefix optional) among the variables
// it prints. (ucp_config_modify cannot tell: UCX 1.13 accepts any name.)
// ok is false when the library could not read its configuration.
func UCXKnows(name string) (known, ok bool) {
	cfg := UCXLibraryConfig()
	if cfg == nil {
		return false, false
	}
	if !strings.HasPrefix(name, "UCX_") {
		name = "UCX_" + name
	}
	_, known = cfg[name]
	return known, true
}

// UCXLibraryConfig is the UCP configuration as the library in this
// process reads it (environment applied), parsed into variables. nil when
// the library refuses its environment.
func UCXLibraryConfig() map[string]string {
	s := ucx.LibraryConfig()
	if s == "" {
		return nil
	}
	return ParseUCXConfig(s)
}

// UCXLibraryPath is the libucp file this process loaded ("" if unknown).
func UCXLibraryPath() string { return ucx.LibraryPath() }

// FindUCXInfo finds the ucx_info of the UCX this process loaded: the one
// installed beside the library (a UCX under its own prefix, put first on
// LD_LIBRARY_PATH for NIXL), else the one on PATH. match says whether its
// version is the library's; another UCX's ucx_info can print the wrong
// devices, or crash against the loaded libraries.
func FindUCXInfo() (path string, build UCXBuild, match bool) {
	lib := UCXLibraryVersion()
	var cands []string
	if p := UCXLibraryPath(); p != "" {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		cands = append(cands, filepath.Join(filepath.Dir(p), "..", "bin", "ucx_info"))
	}
	if p, err := exec.LookPath("ucx_info"); err == nil {
		cands = append(cands, p)
	}
	for _, c := range cands {
		out, err := exec.Command(c, "-v").Output()
		if err != nil {
			continue // missing, or cannot run against the loaded libraries
		}
		b := ParseUCXVersion(string(out))
		if b.Version == lib {
			return filepath.Clean(c), b, true
		}
		if path == "" || build.Version == "" {
			path, build = filepath.Clean(c), b
		}
	}
	return path, build, false
}
