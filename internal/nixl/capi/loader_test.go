package capi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func paths(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.path)
	}
	return out
}

func TestCandidatesOrder(t *testing.T) {
	got := paths(candidates(env(map[string]string{
		"NIXLCTL_NIXL_LIB": "/x/libnixl_capi.so",
		"NIXL_PREFIX":      "/p",
	})))
	want := []string{
		"/x/libnixl_capi.so",
		"/p/lib/libnixl_capi.so",
		"/p/lib/x86_64-linux-gnu/libnixl_capi.so",
		"/p/lib64/libnixl_capi.so",
		"libnixl_capi.so",
		"/opt/nvidia/nvda_nixl/lib/libnixl_capi.so",
		"/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/libnixl_capi.so",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("search order (-want +got):\n%s", d)
	}
	got = paths(candidates(env(nil)))
	if d := cmp.Diff(want[4:], got); d != "" {
		t.Errorf("search order without settings (-want +got):\n%s", d)
	}
}

// fakeOpen pretends that the files in ok load, and those in broken exist
// but fail; everything else is not found.
func fakeOpen(ok, broken []string, opened *[]string) openFunc {
	return func(path string) (*library, bool, error) {
		*opened = append(*opened, path)
		for _, p := range ok {
			if p == path {
				return &library{path: path}, false, nil
			}
		}
		for _, p := range broken {
			if p == path {
				return nil, false, errors.New("has no nixl_capi_gen_notif")
			}
		}
		return nil, true, errors.New("cannot open shared object file: No such file or directory")
	}
}

func TestSearch(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present.so")
	if err := os.WriteFile(present, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.so")

	t.Run("first that loads wins", func(t *testing.T) {
		var opened []string
		cs := []candidate{{path: missing, from: "NIXL_PREFIX"}, {path: "libnixl_capi.so", from: "loader path"}, {path: present, from: "default"}}
		lib, err := search(cs, fakeOpen([]string{"libnixl_capi.so", present}, nil, &opened))
		if err != nil || lib.path != "libnixl_capi.so" {
			t.Fatalf("got %v, %v; want the loader path's library", lib, err)
		}
		// A file that is not there is never handed to dlopen.
		if d := cmp.Diff([]string{"libnixl_capi.so"}, opened); d != "" {
			t.Errorf("opened (-want +got):\n%s", d)
		}
	})

	t.Run("nothing found", func(t *testing.T) {
		var opened []string
		_, err := search(candidates(env(map[string]string{"NIXL_PREFIX": dir})), fakeOpen(nil, nil, &opened))
		if err == nil {
			t.Fatal("no error")
		}
		for _, want := range []string{"libnixl_capi.so not found", filepath.Join(dir, "lib", libName), "/opt/nvidia/nvda_nixl/lib/libnixl_capi.so", "set NIXLCTL_NIXL_LIB or NIXL_PREFIX"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q does not mention %q", err, want)
			}
		}
	})

	t.Run("explicit library missing stops the search", func(t *testing.T) {
		var opened []string
		cs := []candidate{{path: missing, from: "NIXLCTL_NIXL_LIB", explicit: true}, {path: present, from: "default"}}
		_, err := search(cs, fakeOpen([]string{present}, nil, &opened))
		if err == nil || !strings.Contains(err.Error(), "NIXLCTL_NIXL_LIB="+missing) || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("got %v; want an error naming NIXLCTL_NIXL_LIB", err)
		}
		if len(opened) != 0 {
			t.Errorf("went on to open %v", opened)
		}
	})

	t.Run("a missing dependency says where it must be", func(t *testing.T) {
		lacking := func(path string) (*library, bool, error) {
			return nil, false, errors.New("dlopen " + path + ": libnixl.so: cannot open shared object file: No such file or directory")
		}
		_, err := search([]candidate{{path: present, from: "NIXL_PREFIX"}}, lacking)
		if err == nil || !strings.Contains(err.Error(), "libnixl.so: cannot open") || !strings.Contains(err.Error(), "LD_LIBRARY_PATH") {
			t.Fatalf("got %v; want the loader's reason and the hint", err)
		}
	})

	t.Run("a broken library stops the search", func(t *testing.T) {
		var opened []string
		cs := []candidate{{path: present, from: "NIXL_PREFIX"}, {path: "libnixl_capi.so", from: "loader path"}}
		_, err := search(cs, fakeOpen([]string{"libnixl_capi.so"}, []string{present}, &opened))
		if err == nil || !strings.Contains(err.Error(), "has no nixl_capi_gen_notif") || !strings.Contains(err.Error(), "NIXL_PREFIX") {
			t.Fatalf("got %v; want the broken library's reason", err)
		}
	})
}

// apiNames lists the functions the shim resolves, read from shim.h so the
// fake libraries below cannot drift from it.
func apiNames(t *testing.T) []string {
	t.Helper()
	h, err := os.ReadFile("shim.h")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(h), "#define NXC_FUNCS(X)")
	if i < 0 {
		t.Fatal("NXC_FUNCS not found in shim.h")
	}
	var names []string
	for _, m := range regexp.MustCompile(`\bX\((\w+),`).FindAllStringSubmatch(string(h[i:]), -1) {
		names = append(names, m[1])
	}
	if len(names) < 40 {
		t.Fatalf("found only %d functions in shim.h", len(names))
	}
	return names
}

// fakeLib builds a library that exports the API (every function fails
// with NIXL_CAPI_ERROR_BACKEND) except the names in omit.
func fakeLib(t *testing.T, dir, file string, stub bool, omit ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is needed to build fake libraries")
	}
	var src strings.Builder
	src.WriteString("#include <stdbool.h>\n")
	fmt.Fprintf(&src, "bool nixl_capi_is_stub(void) { return %v; }\n", stub)
	for _, n := range apiNames(t) {
		skip := false
		for _, o := range omit {
			skip = skip || o == n
		}
		if !skip {
			fmt.Fprintf(&src, "int nixl_capi_%s(void) { return -2; }\n", n)
		}
	}
	c := filepath.Join(dir, file+".c")
	if err := os.WriteFile(c, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, file)
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return so
}

func TestLoadFakeLibraries(t *testing.T) {
	dir := t.TempDir()

	t.Run("complete", func(t *testing.T) {
		so := fakeLib(t, dir, "complete.so", false)
		lib, err := findLib([]candidate{{path: so, from: "NIXLCTL_NIXL_LIB", explicit: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer lib.close()
		if lib.path != so {
			t.Errorf("path %q, want %q", lib.path, so)
		}
	})

	t.Run("missing a function", func(t *testing.T) {
		so := fakeLib(t, dir, "old.so", false, "get_xfer_telemetry")
		_, err := findLib([]candidate{{path: so, from: "NIXLCTL_NIXL_LIB", explicit: true}})
		if err == nil || !strings.Contains(err.Error(), "has no nixl_capi_get_xfer_telemetry") {
			t.Fatalf("got %v; want it to name the missing function", err)
		}
	})

	t.Run("stub build", func(t *testing.T) {
		so := fakeLib(t, dir, "stub.so", true)
		_, err := findLib([]candidate{{path: so, from: "NIXLCTL_NIXL_LIB", explicit: true}})
		if err == nil || !strings.Contains(err.Error(), "stub build") {
			t.Fatalf("got %v; want the stub refused", err)
		}
	})

	t.Run("found under NIXL_PREFIX", func(t *testing.T) {
		pre := filepath.Join(dir, "prefix")
		sub := filepath.Join(pre, "lib", "x86_64-linux-gnu")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		so := fakeLib(t, sub, libName, false)
		lib, err := findLib(candidates(env(map[string]string{"NIXL_PREFIX": pre})))
		if err != nil {
			t.Fatal(err)
		}
		defer lib.close()
		if lib.path != so {
			t.Errorf("loaded %q, want %q", lib.path, so)
		}
	})

	t.Run("missing dependency is not 'not found'", func(t *testing.T) {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			t.Skip("gcc is needed")
		}
		// A library that needs libgone.so, which is then removed: the
		// loader's message names libgone.so, and the search must stop on it
		// rather than report that NIXL is not installed.
		dep := filepath.Join(dir, "libgone.so")
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", dep, "-x", "c", "/dev/null").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		so := filepath.Join(dir, "needs.so")
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, "-x", "c", "/dev/null", "-Wl,--no-as-needed", "-L"+dir, "-lgone").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		os.Remove(dep)
		_, notFound, err := openLib(so)
		if err == nil || notFound || !strings.Contains(err.Error(), "libgone.so") {
			t.Fatalf("got notFound=%v, %v", notFound, err)
		}
		_, notFound, err = openLib(filepath.Join(dir, "nothere.so"))
		if err == nil || !notFound {
			t.Fatalf("missing file: got notFound=%v, %v", notFound, err)
		}
	})
}
