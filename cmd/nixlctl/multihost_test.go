package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

// TestMultiHost runs nixlctl across two hosts staged on this machine by
// scripts/twohosts.sh: network, IPC, PID and mount namespaces joined by a
// veth shaped with tbf, one side's CLOCK_MONOTONIC shifted an hour in a
// time namespace. It needs root; under CI=true it must run, elsewhere it
// skips with the reason when namespaces cannot be made.
func TestMultiHost(t *testing.T) {
	mh := newTwoHosts(t)
	b := mh.addr("b")

	t.Run("xfer", func(t *testing.T) {
		mh.serve(t, "b", 0, "serve", "target", "--listen", "0.0.0.0:7300")
		var res struct {
			Environment struct{ Transport string }
			Points      []struct {
				BandwidthGBps float64 `json:"bandwidth_gbps"`
			}
			NetPath   json.RawMessage `json:"net_path"`
			Placement string          `json:"placement"`
			Endpoints []struct {
				Addr string `json:"addr"`
			} `json:"endpoints"`
		}
		mh.runJSON(t, "a", 0, &res, "bench", "xfer", "--target", b+":7300", "--start-block-size", "1M", "--max-block-size", "1M",
			"--num-iter", "100", "--warmup-iter", "10")
		if len(res.Points) != 1 {
			t.Fatalf("%d points", len(res.Points))
		}
		mh.checkTransport(t, res.Environment.Transport)
		if g := res.Points[0].BandwidthGBps; g <= 0 || g > 1.1*mh.ceilingGBps {
			t.Errorf("bench xfer %.3f GB/s over a link shaped to %.3f GB/s: the bytes did not take the veth", g, mh.ceilingGBps)
		}
		mh.checkNetPath(t, res.NetPath, "initiator")
		if res.Placement != "one kernel, separate namespaces" || len(res.Endpoints) != 2 || res.Endpoints[1].Addr != b+":7300" {
			t.Errorf("placement %q, endpoints %+v", res.Placement, res.Endpoints)
		}
	})

	t.Run("handoffs across a skewed clock", func(t *testing.T) {
		// Decode's clock runs an hour ahead of the driver's and prefill's.
		mh.serve(t, "b", 3600, "serve", "decode", "--listen", "0.0.0.0:7401")
		for _, proto := range []string{"pull", "push", "sglang"} {
			t.Run(proto, func(t *testing.T) {
				var res handoffJSON
				mh.runJSON(t, "a", 0, &res, "bench", proto, "--decode", b+":7401", "--model", "llama-3.2-1b", "--isl", "256",
					"--requests", "6", "--concurrency", "2")
				res.check(t, mh)
				if len(res.Endpoints) != 2 {
					t.Fatalf("endpoints %+v", res.Endpoints)
				}
				off := time.Duration(res.Endpoints[1].Clock.OffsetNS)
				if res.Endpoints[1].Clock.SameClock || math.Abs((off-time.Hour).Seconds()) > 0.5 {
					t.Errorf("decode's clock offset %v (%s), want +1h", off, res.Endpoints[1].Clock.Text)
				}
				if !res.Endpoints[0].Clock.SameClock {
					t.Errorf("prefill, the driver's child, is on its clock: %+v", res.Endpoints[0].Clock)
				}
				if !strings.HasPrefix(res.Endpoints[1].SideChannel, "tcp://"+b+":") {
					t.Errorf("decode advertised %q, want an address on %s (the listen host is 0.0.0.0)", res.Endpoints[1].SideChannel, b)
				}
				mh.checkNetPath(t, res.NetPath, "decode")
			})
		}
	})

	t.Run("remote prefill with --advertise", func(t *testing.T) {
		mh.serve(t, "b", 0, "serve", "prefill", "--listen", "0.0.0.0:7402", "--advertise", b)
		// The driver and its decode child on a shifted clock this time.
		var res handoffJSON
		mh.runJSON(t, "a", 3600, &res, "bench", "sglang", "--prefill", b+":7402", "--model", "llama-3.2-1b", "--isl", "256",
			"--requests", "6", "--concurrency", "2")
		res.check(t, mh)
		if off := time.Duration(res.Endpoints[0].Clock.OffsetNS); math.Abs((off + time.Hour).Seconds()) > 0.5 {
			t.Errorf("prefill's clock offset %v, want -1h", off)
		}
	})

	t.Run("unroutable advertise fails fast", func(t *testing.T) {
		bogus := strings.TrimSuffix(b, ".2") + ".77"
		mh.serve(t, "b", 0, "serve", "prefill", "--listen", "0.0.0.0:7403", "--advertise", bogus)
		start := time.Now()
		code, _, stderr := mh.run(t, "a", 0, "bench", "pull", "--prefill", b+":7403", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "4")
		if code == 0 || !strings.Contains(stderr, "advertises tcp://"+bogus) {
			t.Errorf("exit %d, stderr %q: want a failure naming %s", code, lastLines(stderr, 3), bogus)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("took %v to notice", d)
		}
	})

	t.Run("loopback advertise with the driver on the prefill's host", func(t *testing.T) {
		// The driver reaches 127.0.0.1 itself, so only knowing where the
		// decode runs can catch this; before, every request failed after
		// 17 s with "no reply within 5s".
		mh.serve(t, "a", 0, "serve", "prefill", "--listen", "127.0.0.1:7409")
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7410")
		start := time.Now()
		code, _, stderr := mh.run(t, "a", 0, "bench", "pull", "--prefill", "127.0.0.1:7409", "--decode", b+":7410",
			"--model", "llama-3.2-1b", "--isl", "256", "--requests", "4")
		if code == 0 || !strings.Contains(stderr, "loopback address") || !strings.Contains(stderr, "tcp://127.0.0.1:") {
			t.Errorf("exit %d, stderr %q: want a refusal naming the loopback side channel", code, lastLines(stderr, 3))
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("took %v to refuse", d)
		}
	})

	t.Run("--net-devices checked at the remote endpoint", func(t *testing.T) {
		// This host's /sys says nothing of the other's devices: before,
		// a name host b lacks was accepted and UCX failed there.
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7414")
		start := time.Now()
		code, _, stderr := mh.run(t, "a", 0, "bench", "pull", "--decode", b+":7414", "--net-devices", "bogus0",
			"--model", "llama-3.2-1b", "--isl", "256", "--requests", "4")
		if code != 2 || !strings.Contains(stderr, `"bogus0": decode (on host`) || !strings.Contains(stderr, "has no such network device") {
			t.Errorf("exit %d, %s: want 2 and the remote decode's devices", code, lastLines(stderr, 2))
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("took %v", d)
		}
	})

	t.Run("ec", func(t *testing.T) {
		mh.serve(t, "b", 0, "serve", "encoder", "--listen", "0.0.0.0:7301")
		var res struct {
			Summary struct {
				Requests int `json:"requests"`
				Failed   int `json:"failed"`
			}
		}
		mh.runJSON(t, "a", 0, &res, "bench", "ec", "--producer", b+":7301", "--requests", "40")
		if res.Summary.Requests == 0 || res.Summary.Failed != 0 {
			t.Errorf("ec summary %+v", res.Summary)
		}
	})

	t.Run("2P x 2D across the link", func(t *testing.T) {
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7406")
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7407")
		var res handoffJSON
		mh.runJSON(t, "a", 0, &res, "bench", "pull", "--prefills", "2", "--decode", b+":7406,"+b+":7407", "--model", "llama-3.2-1b",
			"--isl", "256", "--requests", "16", "--warmup", "4", "--concurrency", "4")
		res.check(t, mh)
		if len(res.Summary.Pairs) != 4 {
			t.Fatalf("%d pairs, want 4: %+v", len(res.Summary.Pairs), res.Summary.Pairs)
		}
		for _, p := range res.Summary.Pairs {
			if p.Requests == 0 || p.Failed != 0 {
				t.Errorf("pair prefill %d decode %d: %+v", p.Prefill, p.Decode, p)
			}
		}
		// Each engine against its own bytes, the two decodes of host b
		// together (one host-wide counter): before, each read about 50%.
		for _, side := range []string{"decode-0", "decode-1"} {
			mh.checkNetPath(t, res.NetPath, side)
		}
	})

	t.Run("etcd rendezvous", func(t *testing.T) {
		etcd, err := exec.LookPath("etcd")
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("etcd is not installed (scripts/setup.sh --deps installs etcd-server): %v", err)
			}
			t.Skipf("etcd is not installed: %v", err)
		}
		a := mh.addr("a")
		url := "http://" + a + ":23790"
		cmd, _, out := mh.startExe(t, "a", etcd, "--name", "mh", "--data-dir", t.TempDir(),
			"--listen-client-urls", url, "--advertise-client-urls", url,
			"--listen-peer-urls", "http://127.0.0.1:23800", "--initial-advertise-peer-urls", "http://127.0.0.1:23800",
			"--initial-cluster", "mh=http://127.0.0.1:23800")
		defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }()
		waitFor(t, 30*time.Second, func() bool { return strings.Contains(out.String(), "ready to serve client requests") })
		reg := "etcd://" + a + ":23790"
		// Prefill on host a, decode on host b: each registers where it
		// listens; the driver dials what etcd says.
		mh.start(t, "a", 0, "serve", "prefill", "--listen", "0.0.0.0:7410", "--register", reg, "--run-id", "mh", "--rank", "0", "--world-size", "2")
		mh.start(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7411", "--register", reg, "--run-id", "mh", "--rank", "1", "--world-size", "2")
		var res struct {
			handoffJSON
			Config struct {
				Rendezvous struct {
					Members []struct {
						Role string `json:"role"`
						Addr string `json:"addr"`
					} `json:"members"`
				} `json:"rendezvous"`
			} `json:"config"`
		}
		drv, out2, errb := mh.start(t, "a", 0, "bench", "pull", "--rendezvous", reg, "--run-id", "mh", "--roster", "prefill=0,decode=1",
			"--join-window", "60s", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "6", "--concurrency", "2", "-o", "json")
		if err := drv.Wait(); err != nil {
			t.Fatalf("driver: %v\n%s", err, lastLines(errb.String(), 5))
		}
		if err := json.Unmarshal(out2.Bytes(), &res); err != nil {
			t.Fatalf("driver's result: %v", err)
		}
		res.check(t, mh)
		if m := res.Config.Rendezvous.Members; len(m) != 2 {
			t.Errorf("rendezvous members %+v", m)
		}
		mh.checkNetPath(t, res.NetPath, "decode")
		// The endpoints leaving at the run's end is its teardown, not a
		// member lost: every successful run warned so before.
		if strings.Contains(errb.String(), "member left after the rendezvous") {
			t.Errorf("a successful run warned about its own teardown: %s", lastLines(errb.String(), 5))
		}

		// A decode killed within its lease leaves a stale key: the next
		// run must name the rank and say "stale", not only a dial error.
		mh.start(t, "a", 0, "serve", "prefill", "--listen", "0.0.0.0:7412", "--register", reg, "--run-id", "mh2", "--rank", "0", "--world-size", "2")
		dec, _, decErr := mh.start(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7413", "--register", reg, "--run-id", "mh2", "--rank", "1", "--world-size", "2")
		waitFor(t, 30*time.Second, func() bool { return strings.Contains(decErr.String(), "registered decode rank 1") })
		_ = syscall.Kill(-dec.Process.Pid, syscall.SIGKILL)
		_ = dec.Wait()
		code, _, stderr := mh.run(t, "a", 0, "bench", "pull", "--rendezvous", reg, "--run-id", "mh2", "--roster", "prefill=0,decode=1",
			"--join-window", "60s", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "2")
		t.Logf("stale: exit %d, %s", code, lastLines(stderr, 1))
		if code == 0 || !strings.Contains(stderr, "decode rank 1") || !strings.Contains(stderr, "stale registration") {
			t.Errorf("a stale registration: exit %d, %s", code, lastLines(stderr, 3))
		}
	})

	t.Run("decode killed on the other host", func(t *testing.T) {
		dec := mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7404")
		cmd, out, errb := mh.start(t, "a", 0, "bench", "push", "--decode", b+":7404", "--model", "llama-3.2-1b", "--isl", "2048",
			"--requests", "400", "--concurrency", "2", "-o", "json")
		waitFor(t, 60*time.Second, func() bool { return strings.Contains(errb.String(), "requests") })
		time.Sleep(time.Second)
		killed := time.Now()
		dec.kill()
		decodeDied(t, cmd, out, errb, killed, 15*time.Second, "its decode killed")
	})

	t.Run("decode's host drops off the network", func(t *testing.T) {
		// No FIN, no RST: the link goes down under a running push. The
		// control connection's keep-alive and user timeout end it.
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7412")
		cmd, out, errb := mh.start(t, "a", 0, "bench", "push", "--decode", b+":7412", "--model", "llama-3.2-1b", "--isl", "2048",
			"--requests", "400", "--concurrency", "2", "-o", "json")
		waitFor(t, 60*time.Second, func() bool { return strings.Contains(errb.String(), "requests") })
		down := time.Now()
		if out, err := exec.Command("ip", "-n", mh.name+"-b", "link", "set", mh.dev, "down").CombinedOutput(); err != nil {
			t.Fatalf("link down: %v %s", err, out)
		}
		defer func() {
			if out, err := exec.Command("ip", "-n", mh.name+"-b", "link", "set", mh.dev, "up").CombinedOutput(); err != nil {
				t.Errorf("link up: %v %s", err, out)
			}
		}()
		took := decodeDied(t, cmd, out, errb, down, 30*time.Second, "its decode's host gone")
		t.Logf("the run stopped %v after the link went down", took.Round(100*time.Millisecond))
	})

	t.Run("second interface with the same address, --net-devices", func(t *testing.T) {
		mh.script(t, "dup", mh.name)
		// Two endpoints: UCX reads the pin once per process, when its
		// first session starts.
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7405")
		mh.serve(t, "b", 0, "serve", "decode", "--listen", "0.0.0.0:7408")
		args := []string{"bench", "pull", "--decode", b + ":7405", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "4", "--kv-lease-duration", "1s"}
		// Unpinned, UCX may pick the duplicate first and fail, or not,
		// by the order it finds devices in (a hash of name and
		// namespace): said, not asserted.
		code, _, stderr := mh.run(t, "a", 0, args...)
		t.Logf("without --net-devices: exit %d %s", code, lastLines(stderr, 1))
		if code != 0 && strings.Contains(stderr, "unreachable") && !strings.Contains(stderr, "pin one that does with --net-devices") {
			t.Errorf("requests failed as unreachable without a word on --net-devices: %s", lastLines(stderr, 4))
		}
		var res handoffJSON
		mh.runJSON(t, "a", 0, &res, "bench", "pull", "--decode", b+":7408", "--net-devices", mh.dev, "--model", "llama-3.2-1b",
			"--isl", "256", "--requests", "6", "--concurrency", "2")
		res.check(t, mh)
		if res.Config.NetDevices != mh.dev {
			t.Errorf("config.net_devices %q, want %q", res.Config.NetDevices, mh.dev)
		}
		mh.checkNetPath(t, res.NetPath, "decode")
		// The first endpoint's transport started unpinned: asking it for
		// a pin now is refused, not silently ignored.
		code, _, stderr = mh.run(t, "a", 0, append(args[:4:4], "--net-devices", mh.dev, "--isl", "256", "--requests", "2")...)
		if code == 0 || !strings.Contains(stderr, "cannot change it") {
			t.Errorf("a pin on an endpoint whose transport started unpinned: exit %d, %s", code, lastLines(stderr, 2))
		}
	})
}

// handoffJSON is what the test reads of a bench pull|push|sglang result.
type handoffJSON struct {
	Summary struct {
		Requests       int            `json:"requests"`
		Failed         int            `json:"failed"`
		CorruptBlocks  int            `json:"corrupt_blocks"`
		NegativeStages map[string]int `json:"negative_stages"`
		Pairs          []struct {
			Prefill  int `json:"prefill"`
			Decode   int `json:"decode"`
			Requests int `json:"requests"`
			Failed   int `json:"failed"`
		} `json:"pairs"`
		Handoff struct {
			P50 float64 `json:"p50"`
		} `json:"handoff_latency_ms"`
	}
	Config struct {
		NetDevices string `json:"net_devices"`
	}
	Environment struct{ Transport string }
	Endpoints   []struct {
		Role        string `json:"role"`
		SideChannel string `json:"side_channel"`
		Clock       struct {
			SameClock bool   `json:"same_clock"`
			OffsetNS  int64  `json:"offset_ns"`
			Text      string `json:"text"`
		}
	}
	Placement    string          `json:"placement"`
	EndpointDied string          `json:"endpoint_died"`
	NetPath      json.RawMessage `json:"net_path"`
}

func (r *handoffJSON) check(t *testing.T, mh *twoHosts) {
	t.Helper()
	s := r.Summary
	if s.Requests == 0 || s.Failed != 0 || s.CorruptBlocks != 0 || len(s.NegativeStages) != 0 {
		t.Errorf("summary %+v", s)
	}
	// Sane: positive, and nowhere near the hour between the clocks.
	if s.Handoff.P50 <= 0 || s.Handoff.P50 > 60e3 {
		t.Errorf("handoff p50 %.1f ms", s.Handoff.P50)
	}
	if r.Placement != "one kernel, separate namespaces" {
		t.Errorf("placement %q", r.Placement)
	}
	mh.checkTransport(t, r.Environment.Transport)
}

// twoHosts is a pair of staged hosts, a and b.
type twoHosts struct {
	script      func(t *testing.T, args ...string) string
	scriptPath  string
	name, dev   string
	addrs       map[string]string
	bin         string
	ceilingGBps float64 // what tbf lets through
}

func newTwoHosts(t *testing.T) *twoHosts {
	ci := os.Getenv("CI") == "true"
	skip := func(format string, a ...any) {
		t.Helper()
		if ci {
			t.Fatalf("CI=true and the two-host test cannot run: "+format, a...)
		}
		t.Skipf(format, a...)
	}
	if testing.Short() && !ci {
		t.Skip("-short")
	}
	if os.Geteuid() != 0 {
		skip("needs root for network namespaces")
	}
	for _, tool := range []string{"ip", "unshare", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("%s not found", tool)
		}
	}
	scriptPath, err := filepath.Abs("../../scripts/twohosts.sh")
	if err != nil {
		t.Fatal(err)
	}
	mh := &twoHosts{name: fmt.Sprintf("mh%d", os.Getpid()%100000), scriptPath: scriptPath, ceilingGBps: 0.25}
	mh.script = func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := exec.Command("bash", append([]string{scriptPath}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("twohosts.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	_ = exec.Command("bash", scriptPath, "down", mh.name).Run()
	if out, err := exec.Command("bash", scriptPath, "up", mh.name, "2gbit").CombinedOutput(); err != nil {
		_ = exec.Command("bash", scriptPath, "down", mh.name).Run()
		skip("cannot stage two hosts: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("bash", scriptPath, "down", mh.name).Run() })
	mh.dev = mh.script(t, "dev", mh.name, "a")
	mh.addrs = map[string]string{"a": mh.script(t, "addr", mh.name, "a"), "b": mh.script(t, "addr", mh.name, "b")}
	// This test binary is nixlctl when its name says so (TestMain).
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	mh.bin = filepath.Join(t.TempDir(), "nixlctl")
	if err := os.Symlink(exe, mh.bin); err != nil {
		t.Fatal(err)
	}
	return mh
}

func (mh *twoHosts) addr(host string) string { return mh.addrs[host] }

// command is nixlctl args on host, its clock shifted by shift seconds.
func (mh *twoHosts) command(host string, shift int, args ...string) *exec.Cmd {
	a := []string{mh.scriptPath, "run", mh.name, host}
	if shift != 0 {
		a = append(a, "--shift", fmt.Sprint(shift))
	}
	cmd := exec.Command("bash", append(append(a, mh.bin), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// runGroup runs cmd in a process group of its own and returns what Wait
// does; if ctx ends first, the whole group is killed: the launcher
// (mpirun, sbatch, the netns wrapper) and all it started.
func runGroup(ctx context.Context, t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stop()
	return cmd.Wait()
}

func (mh *twoHosts) run(t *testing.T, host string, shift int, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := mh.command(host, shift, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := runGroup(ctx, t, cmd)
	if ctx.Err() != nil {
		t.Fatalf("nixlctl %s timed out; stderr:\n%s", strings.Join(args, " "), lastLines(errb.String(), 10))
	}
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return code, out.String(), errb.String()
}

func (mh *twoHosts) runJSON(t *testing.T, host string, shift int, v any, args ...string) {
	t.Helper()
	code, out, stderr := mh.run(t, host, shift, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("nixlctl %s: exit %d\n%s", strings.Join(args, " "), code, lastLines(stderr, 10))
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("nixlctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// start runs nixlctl on host in the background.
func (mh *twoHosts) start(t *testing.T, host string, shift int, args ...string) (*exec.Cmd, *bytes.Buffer, *syncBuffer) {
	t.Helper()
	return mh.startCmd(t, mh.command(host, shift, args...))
}

// startExe runs another program on host in the background.
func (mh *twoHosts) startExe(t *testing.T, host, exe string, args ...string) (*exec.Cmd, *bytes.Buffer, *syncBuffer) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{mh.scriptPath, "run", mh.name, host, exe}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return mh.startCmd(t, cmd)
}

func (mh *twoHosts) startCmd(t *testing.T, cmd *exec.Cmd) (*exec.Cmd, *bytes.Buffer, *syncBuffer) {
	t.Helper()
	out, errb := &bytes.Buffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd, out, errb
}

// server is a serve --listen running on one of the hosts.
type server struct {
	cmd *exec.Cmd
}

func (s *server) kill() { _ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL) }

// serve starts a nixlctl serve on host and waits until it listens; it is
// killed when the (sub)test ends.
func (mh *twoHosts) serve(t *testing.T, host string, shift int, args ...string) *server {
	t.Helper()
	cmd, _, errb := mh.start(t, host, shift, args...)
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(errb.String(), "listening on") })
	return &server{cmd: cmd}
}

func (mh *twoHosts) checkTransport(t *testing.T, transport string) {
	t.Helper()
	if !strings.Contains(transport, "tcp/"+mh.dev) || !strings.Contains(transport, "error handling: peer") {
		t.Errorf("transport %q: want TCP over %s with peer error handling", transport, mh.dev)
	}
}

// checkNetPath checks that the side's interface counters name the veth as
// what carried the payload.
func (mh *twoHosts) checkNetPath(t *testing.T, raw json.RawMessage, side string) {
	t.Helper()
	var np map[string]struct {
		Carriers []struct {
			Name  string  `json:"name"`
			Share float64 `json:"share"`
		} `json:"carriers"`
	}
	if err := json.Unmarshal(raw, &np); err != nil {
		t.Fatalf("net_path %s: %v", raw, err)
	}
	c := np[side].Carriers
	if len(c) == 0 || c[0].Name != mh.dev || c[0].Share < 0.9 {
		t.Errorf("net path of %s: %s; want %s carrying the payload", side, raw, mh.dev)
	}
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	testkit.WaitFor(t, d, "the condition", ok, nil)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
// decodeDied waits for a bench whose decode was lost at since: it must
// exit non-zero within limit, its result naming the decode in
// endpoint_died. It returns how long the bench took to stop.
func decodeDied(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer, errb *syncBuffer, since time.Time, limit time.Duration, what string) time.Duration {
	t.Helper()
	err := cmd.Wait()
	took := time.Since(since)
	if err == nil {
		t.Errorf("bench exited 0 with %s", what)
	}
	if took > limit {
		t.Errorf("took %v to stop with %s", took, what)
	}
	var res handoffJSON
	if json.Unmarshal(out.Bytes(), &res) != nil || !strings.Contains(res.EndpointDied, "decode") {
		t.Errorf("endpoint_died %q; stderr %s", res.EndpointDied, lastLines(errb.String(), 4))
	}
	return took
}

type syncBuffer = testkit.SyncBuffer
