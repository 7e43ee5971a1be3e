// Package etcdtest starts a real etcd (Debian's etcd-server) for tests of
// the etcd rendezvous: on free ports, with a fresh data directory, stopped
// when the test ends. Without the binary the test is skipped with the
// reason, except under CI=true, where it must be there.
package etcdtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Start runs etcd and returns its etcd://HOST:PORT address once it serves.
func Start(t testing.TB) string {
	t.Helper()
	exe, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("etcd is not installed (apt-get install etcd-server; scripts/setup.sh --deps does): %v", err)
		}
		t.Skipf("etcd is not installed, so the etcd rendezvous is untested (apt-get install etcd-server): %v", err)
	}
	client := "http://" + testkit.FreeAddr(t)
	peer := "http://" + testkit.FreeAddr(t)
	var out lockedBuffer
	cmd := exec.Command(exe, "--name", "t", "--data-dir", t.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := strings.TrimPrefix(client, "http://")
	// Serving means answering a read, which waits for etcd to elect
	// itself, not just listening.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := cli.Get(ctx, "ready")
		cancel()
		if err == nil {
			return "etcd://" + addr
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("etcd exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not serve within 20s: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lockedBuffer collects etcd's output while the test may read it.
type lockedBuffer = testkit.SyncBuffer
