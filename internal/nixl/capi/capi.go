// Package capi is the "nixl" transfer backend: NVIDIA's NIXL itself,
// reached through its C API (libnixl_capi.so), which is loaded with dlopen
// at run time. nixlctl builds and runs without NIXL; the backend is then
// unavailable and says why.
//
// The C shim (shim.c) holds nixlctl's own declarations of the NIXL
// functions it calls and resolves all of them when the library is loaded,
// so a library that lacks one is refused up front rather than failing in
// the middle of a run. Each agent is a NIXL agent with one UCX backend and
// NIXL's progress thread, so transfers complete without anyone polling,
// unless nixl.Config.Progress says that the caller polls or the agent spins.
package capi

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

const (
	backendName = "nixl"
	libName     = "libnixl_capi.so"
	// The UCX plugin is the transport this backend asks NIXL for.
	pluginName = "UCX"
)

func init() {
	nixl.Register(nixl.Backend{Name: backendName, New: New, Available: Available, Version: Version})
}

// candidate is one place the library may be.
type candidate struct {
	path string // a file, or a bare name for the loader's own search
	from string // the setting that produced it, for messages
	// explicit: the user named this file; if it is missing the search
	// stops there rather than quietly using some other NIXL.
	explicit bool
}

// candidates lists where to look, in order: $NIXLCTL_NIXL_LIB, then under
// $NIXL_PREFIX, then the loader's own path (LD_LIBRARY_PATH, ld.so.cache),
// then where NVIDIA's packages install NIXL.
func candidates(getenv func(string) string) []candidate {
	var cs []candidate
	if p := getenv("NIXLCTL_NIXL_LIB"); p != "" {
		cs = append(cs, candidate{path: p, from: "NIXLCTL_NIXL_LIB", explicit: true})
	}
	if pre := getenv("NIXL_PREFIX"); pre != "" {
		for _, sub := range []string{"lib", "lib/x86_64-linux-gnu", "lib64"} {
			cs = append(cs, candidate{path: filepath.Join(pre, sub, libName), from: "NIXL_PREFIX"})
		}
	}
	cs = append(cs, candidate{path: libName, from: "loader path"})
	for _, dir := range []string{"/opt/nvidia/nvda_nixl/lib", "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu"} {
		cs = append(cs, candidate{path: filepath.Join(dir, libName), from: "default"})
	}
	return cs
}

// library is a loaded libnixl_capi.so.
type library struct {
	c    *C.nxc_lib_t
	path string
}

// openFunc opens one candidate; notFound means "try the next one".
type openFunc func(path string) (lib *library, notFound bool, err error)

func openLib(path string) (*library, bool, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var nf C.int
	var ebuf [1024]C.char
	l := C.nxc_open(cpath, &nf, &ebuf[0], C.size_t(len(ebuf)))
	if l == nil {
		return nil, nf != 0, errors.New(C.GoString(&ebuf[0]))
	}
	var pbuf [4096]C.char
	where := path
	if C.nxc_path_of(l, &pbuf[0], C.size_t(len(pbuf))) == 0 {
		where = C.GoString(&pbuf[0])
	}
	return &library{c: l, path: where}, false, nil
}

func (l *library) close() { C.nxc_close(l.c) }

// search tries the candidates in order and returns the first library that
// loads. A file that exists but cannot be used ends the search with its
// reason: falling back to another NIXL would hide the problem.
func search(cs []candidate, open openFunc) (*library, error) {
	var tried []string
	for _, c := range cs {
		if strings.Contains(c.path, "/") {
			if _, err := os.Stat(c.path); err != nil {
				if c.explicit {
					return nil, fmt.Errorf("%s=%s: %w", c.from, c.path, err)
				}
				tried = append(tried, c.path)
				continue
			}
		}
		lib, notFound, err := open(c.path)
		if err == nil {
			return lib, nil
		}
		if notFound && !c.explicit {
			tried = append(tried, c.path+" ("+c.from+")")
			continue
		}
		if strings.Contains(err.Error(), "cannot open shared object file") {
			// The file is there and one of its dependencies is not: NIXL's
			// libraries carry no RUNPATH, whatever found libnixl_capi.so.
			return nil, fmt.Errorf("%s (from %s): %w; %s", c.path, c.from, err, depHint)
		}
		return nil, fmt.Errorf("%s (from %s): %w", c.path, c.from, err)
	}
	return nil, fmt.Errorf("%s not found (searched: %s); set NIXLCTL_NIXL_LIB or NIXL_PREFIX", libName, strings.Join(tried, ", "))
}

// depHint says what a library that loads but lacks a dependency needs.
const depHint = "NIXL's libraries record no library path: put NIXL's lib directory and Abseil's (and NIXL's UCX first) on LD_LIBRARY_PATH, as docs/backends.md shows"

// loaded is the process's one NIXL library, or why there is none.
type loaded struct {
	lib *library
	err error
}

var load = sync.OnceValue(func() loaded {
	lib, err := findLib(candidates(os.Getenv))
	if err != nil {
		return loaded{err: err}
	}
	C.nxc_use(lib.c)
	if err := probe(lib.path); err != nil {
		return loaded{lib: lib, err: err}
	}
	return loaded{lib: lib}
})

// findLib finds a library that has the whole API and is not NIXL's stub
// build (which has the API and no implementation).
func findLib(cs []candidate) (*library, error) {
	lib, err := search(cs, openLib)
	if err != nil {
		return nil, err
	}
	if bool(C.nxc_is_stub(lib.c)) {
		lib.close()
		return nil, fmt.Errorf("%s is NIXL's stub build (API only, no implementation)", lib.path)
	}
	return lib, nil
}

// probe creates a throwaway agent with a UCX backend: loading the library
// proves little, since the plugin directory, UCX itself and the UCX
// version in this process are only found out when a backend is made.
func probe(libPath string) error {
	name := C.CString(fmt.Sprintf("nixlctl-probe-%d", os.Getpid()))
	defer C.free(unsafe.Pointer(name))
	cfg := C.nxc_agent_config_t{num_workers: 1, lthr_delay_us: 100000}
	var a C.nxc_agent_t
	if st := C.nxc_create_configured_agent(name, &cfg, &a); st != C.NXC_SUCCESS {
		return fmt.Errorf("%s: creating an agent failed: %s", libPath, statusText(st))
	}
	defer C.nxc_destroy_agent(a)
	plugins, err := availablePlugins(a)
	if err != nil {
		return fmt.Errorf("%s: %w", libPath, err)
	}
	found := false
	for _, p := range plugins {
		found = found || p == pluginName
	}
	if !found {
		return fmt.Errorf("%s plugin not found in %s (plugins there: %s)", pluginName, pluginDir(libPath), listOrNone(plugins))
	}
	b, err := createBackend(a, nil)
	if err != nil {
		return fmt.Errorf("%s: %w (check that the UCX NIXL was built for comes first in LD_LIBRARY_PATH)", libPath, err)
	}
	C.nxc_destroy_backend(b)
	return nil
}

// pluginDir says where NIXL looked for plugins: NIXL_PLUGIN_DIR, else the
// plugins directory next to libnixl.so.
func pluginDir(libPath string) string {
	if d := os.Getenv("NIXL_PLUGIN_DIR"); d != "" {
		return "NIXL_PLUGIN_DIR=" + d
	}
	return filepath.Join(filepath.Dir(libPath), "plugins") + " (NIXL_PLUGIN_DIR is not set)"
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}

func availablePlugins(a C.nxc_agent_t) ([]string, error) {
	var l C.nxc_string_list_t
	if st := C.nxc_get_available_plugins(a, &l); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("listing NIXL plugins: %s", statusText(st))
	}
	defer C.nxc_destroy_string_list(l)
	var n C.size_t
	if st := C.nxc_string_list_size(l, &n); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("listing NIXL plugins: %s", statusText(st))
	}
	var out []string
	for i := C.size_t(0); i < n; i++ {
		var s *C.char
		if C.nxc_string_list_get(l, i, &s) == C.NXC_SUCCESS && s != nil {
			out = append(out, C.GoString(s))
		}
	}
	return out, nil
}

// createBackend makes the agent's UCX backend with the plugin's default
// parameters overridden by params.
func createBackend(a C.nxc_agent_t, params map[string]string) (C.nxc_backend_t, error) {
	plugin := C.CString(pluginName)
	defer C.free(unsafe.Pointer(plugin))
	var mems C.nxc_mem_list_t
	var p C.nxc_params_t
	if st := C.nxc_get_plugin_params(a, plugin, &mems, &p); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("NIXL has no usable %s plugin: %s", pluginName, statusText(st))
	}
	defer C.nxc_destroy_mem_list(mems)
	defer C.nxc_destroy_params(p)
	for k, v := range params {
		ck, cv := C.CString(k), C.CString(v)
		st := C.nxc_params_add(p, ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if st != C.NXC_SUCCESS {
			return nil, fmt.Errorf("backend parameter %s=%s: %s", k, v, statusText(st))
		}
	}
	var b C.nxc_backend_t
	if st := C.nxc_create_backend(a, plugin, p, &b); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("creating the %s backend failed: %s", pluginName, statusText(st))
	}
	return b, nil
}

// Available reports whether NIXL loads here and can make a UCX backend,
// and if not, why.
func Available() (bool, string) {
	if r := Unavailable(); r != "" {
		return false, r
	}
	return true, ""
}

// Unavailable is why the nixl backend cannot run here ("" if it can).
func Unavailable() string {
	if err := load().err; err != nil {
		return err.Error()
	}
	return ""
}

// Version is the NIXL in use. The C API does not report NIXL's version, so
// this is the library's path, which names the installation.
func Version() string {
	if l := load().lib; l != nil {
		return l.path
	}
	return ""
}

func loadedLib() (*library, error) {
	l := load()
	if l.err != nil {
		return nil, fmt.Errorf("%w: nixl: %v", nixl.ErrUnavailable, l.err)
	}
	return l.lib, nil
}

// statusText names a nixl_capi_status_t.
func statusText(st C.nxc_status_t) string {
	names := map[C.nxc_status_t]string{
		C.NXC_SUCCESS:           "success",
		C.NXC_IN_PROG:           "in progress",
		C.NXC_ERR_INVALID_PARAM: "invalid parameter",
		C.NXC_ERR_BACKEND:       "backend error",
		C.NXC_ERR_INVALID_STATE: "invalid state",
		C.NXC_ERR_EXCEPTION:     "exception",
		C.NXC_ERR_NO_TELEMETRY:  "telemetry is off",
		C.NXC_ERR_NOT_FOUND:     "not found",
		C.NXC_ERR_NOT_LOADED:    "NIXL is not loaded",
	}
	if n, ok := names[st]; ok {
		return fmt.Sprintf("%s (NIXL status %d)", n, int(st))
	}
	return fmt.Sprintf("NIXL status %d", int(st))
}
