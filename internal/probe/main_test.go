package probe

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

func TestMain(m *testing.M) {
	// This test binary doubles as the leak peer child process.
	if os.Getenv("NIXLCTL_PROBE_TEST_PEER") == "1" {
		if err := ctl.ServeStdio(context.Background(), LeakPeerRole(slog.New(slog.NewTextHandler(os.Stderr, nil)))); err != nil {
			fmt.Fprintln(os.Stderr, "leak peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if peerDir != "" {
		os.RemoveAll(peerDir)
	}
	os.Exit(code)
}

var peerDir string

// peerBinary is the program tests run as the leak peer: this test binary,
// or under the race detector a build of it without, because the race
// detector's own memory grows for tens of seconds and a receiver that
// should be STABLE would not be.
var peerBinary = sync.OnceValues(func() (string, error) {
	if !raceEnabled {
		return os.Executable()
	}
	dir, err := os.MkdirTemp("", "nixlctl-probe-peer-")
	if err != nil {
		return "", err
	}
	peerDir = dir
	out := filepath.Join(dir, "peer.test")
	// go test puts its own GOROOT/bin first on the PATH of the tests.
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build the peer without -race: %w", err)
	}
	cmd := exec.Command(gobin, "test", "-c", "-o", out, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the peer without -race: %v\n%s", err, b)
	}
	return out, nil
})

// testPeer runs this test binary as the peer.
func testPeer(t testing.TB) PeerSpec {
	exe, err := peerBinary()
	if err != nil {
		t.Fatal(err)
	}
	return PeerSpec{Exe: exe, Args: []string{"-test.run=^$"}, Env: []string{"NIXLCTL_PROBE_TEST_PEER=1"}}
}
