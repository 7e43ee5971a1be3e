package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/rendezvous/etcdtest"
)

// TestRendezvous runs bench drivers that find their endpoints through a
// rendezvous, every side a real nixlctl process: the endpoints register
// (serve prefill|decode --register) instead of being named on the
// driver's command line.
func TestRendezvous(t *testing.T) {
	t.Run("tcp with a reverse member", func(t *testing.T) {
		drv := startRdv(t, "bench", "pull", "--rendezvous", "127.0.0.1:0", "--run-id", "t1", "--join-window", "60s",
			"--prefills", "1", "--decodes", "2", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "6", "--warmup", "0",
			"--concurrency", "2", "-o", "json")
		addr := drv.rendezvousAddr(t)
		eps := []*rdvProc{
			startRdv(t, "serve", "prefill", "--listen", "127.0.0.1:0", "--register", addr, "--run-id", "t1", "--rank", "0", "--world-size", "3"),
			startRdv(t, "serve", "decode", "--listen", "127.0.0.1:0", "--register", addr, "--run-id", "t1", "--rank", "1", "--world-size", "3"),
			// Reverse: the control channel rides the registration.
			startRdv(t, "serve", "decode", "--register", "tcp://"+addr, "--run-id", "t1", "--rank", "2", "--world-size", "3"),
		}
		drv.wantExit(t, 0, 120*time.Second)
		res := drv.result(t)
		if res.Summary.Requests != 6 || res.Summary.Failed != 0 || res.Summary.CorruptBlocks != 0 {
			t.Errorf("summary %+v", res.Summary)
		}
		r := res.Config.Rendezvous
		if r == nil || r.Addr != addr || r.RunID != "t1" || r.Roster != "decode=1-2,prefill=0" || len(r.Members) != 3 {
			t.Fatalf("rendezvous %+v", r)
		}
		for _, m := range r.Members {
			wantReverse := m.Role == "decode" && m.Rank == 2
			if m.Host == "" || (m.Addr == "reverse") != wantReverse || !wantReverse && !strings.HasPrefix(m.Addr, "127.0.0.1:") {
				t.Errorf("member %+v", m)
			}
		}
		for _, ep := range eps {
			ep.wantExit(t, 0, 30*time.Second)
			if !strings.Contains(ep.stderr.String(), "registered ") {
				t.Errorf("%s: stderr %q does not say what it registered", ep.name, lastLines(ep.stderr.String(), 3))
			}
		}
	})

	t.Run("a rank never comes", func(t *testing.T) {
		start := time.Now()
		drv := startRdv(t, "bench", "push", "--rendezvous", "127.0.0.1:0", "--run-id", "t2", "--join-window", "3s",
			"--model", "llama-3.2-1b", "--isl", "256", "--requests", "2", "-o", "json")
		addr := drv.rendezvousAddr(t)
		pre := startRdv(t, "serve", "prefill", "--listen", "127.0.0.1:0", "--register", addr, "--run-id", "t2", "--rank", "0", "--world-size", "2")
		drv.wantExit(t, 1, 30*time.Second)
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("took %v with a 3s join window", d)
		}
		if msg := drv.stderr.String(); !strings.Contains(msg, "missing decode rank 1 ") || strings.Contains(msg, "prefill rank 0") {
			t.Errorf("stderr %q: want the run to fail naming decode rank 1 (and only it)", lastLines(msg, 3))
		}
		// The driver ended the registration: the endpoint leaves too.
		pre.wantExit(t, 0, 15*time.Second)
	})

	t.Run("etcd", func(t *testing.T) {
		etcd := startEtcdServer(t)
		drv := startRdv(t, "bench", "sglang", "--rendezvous", etcd, "--run-id", "t3", "--join-window", "60s",
			"--model", "llama-3.2-1b", "--isl", "256", "--requests", "4", "--warmup", "0", "--concurrency", "2", "-o", "json")
		drv.rendezvousAddr(t)
		eps := []*rdvProc{
			startRdv(t, "serve", "prefill", "--listen", "127.0.0.1:0", "--register", etcd, "--run-id", "t3", "--rank", "0", "--world-size", "2"),
			startRdv(t, "serve", "decode", "--listen", "127.0.0.1:0", "--register", etcd, "--run-id", "t3", "--rank", "1", "--world-size", "2"),
		}
		drv.wantExit(t, 0, 120*time.Second)
		res := drv.result(t)
		if res.Summary.Requests != 4 || res.Summary.Failed != 0 {
			t.Errorf("summary %+v", res.Summary)
		}
		if r := res.Config.Rendezvous; r == nil || r.Addr != etcd || len(r.Members) != 2 || !strings.HasPrefix(r.Members[0].From, "nixlctl/t3/members/") {
			t.Errorf("rendezvous %+v", r)
		}
		// An etcd registration has no driver to end it: the endpoints
		// leave when their session ends.
		for _, ep := range eps {
			ep.wantExit(t, 0, 30*time.Second)
		}
	})
}

type rdvResult struct {
	Config struct {
		Rendezvous *struct {
			Addr    string `json:"addr"`
			RunID   string `json:"run_id"`
			Roster  string `json:"roster"`
			Members []struct {
				Role string `json:"role"`
				Rank int    `json:"rank"`
				Host string `json:"host"`
				Addr string `json:"addr"`
				From string `json:"from"`
			} `json:"members"`
		} `json:"rendezvous"`
	} `json:"config"`
	Summary struct {
		Requests      int `json:"requests"`
		Failed        int `json:"failed"`
		CorruptBlocks int `json:"corrupt_blocks"`
	} `json:"summary"`
}

// rdvProc is a nixlctl process of the test.
type rdvProc struct {
	name   string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr syncBuffer
	exited chan struct{}
}

// rdvEnv is the test's environment without launcher variables: ranks,
// world sizes and run ids come from the flags.
func rdvEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "RANK", name == "WORLD_SIZE", name == "JOB_COMPLETION_INDEX", name == "NIXLCTL_JOB_ID",
			name == "NIXLCTL_WORLD_SIZE", strings.HasPrefix(name, "SLURM_"), strings.HasPrefix(name, "OMPI_COMM_WORLD_"),
			strings.HasPrefix(name, "LWS_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startWatched starts cmd and returns a channel closed once Wait has
// returned (ProcessState is set): a test selects on it, with a time
// bound, where Wait would block.
func startWatched(t *testing.T, cmd *exec.Cmd) chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return exited
}

// startRdv starts nixlctl (testscript.Main put it in $PATH); the test
// kills what is still running at its end.
func startRdv(t *testing.T, args ...string) *rdvProc {
	t.Helper()
	p := &rdvProc{name: strings.Join(args[:min(2, len(args))], " ")}
	p.cmd = exec.Command("nixlctl", args...)
	p.cmd.Env = rdvEnv()
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.exited = startWatched(t, p.cmd)
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Logf("%s was still running; stderr:\n%s", p.name, lastLines(p.stderr.String(), 10))
		}
	})
	return p
}

var rdvWaiting = regexp.MustCompile(`(?m)^rendezvous: waiting at (\S+) for `)

// rendezvousAddr is where the driver says it waits.
func (p *rdvProc) rendezvousAddr(t *testing.T) string {
	t.Helper()
	var addr string
	waitFor(t, 30*time.Second, func() bool {
		if m := rdvWaiting.FindStringSubmatch(p.stderr.String()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	return addr
}

func (p *rdvProc) wantExit(t *testing.T, code int, within time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("%s still running after %v; stderr:\n%s", p.name, within, lastLines(p.stderr.String(), 10))
	}
	if got := p.cmd.ProcessState.ExitCode(); got != code {
		t.Fatalf("%s exited %d, want %d; stderr:\n%s", p.name, got, code, lastLines(p.stderr.String(), 10))
	}
}

func (p *rdvProc) result(t *testing.T) rdvResult {
	t.Helper()
	var res rdvResult
	if err := json.Unmarshal(p.stdout.Bytes(), &res); err != nil {
		t.Fatalf("%s: %v; stdout %.300q", p.name, err, p.stdout.String())
	}
	return res
}

// startEtcdServer runs a real etcd for the test (etcdtest.Start).
func startEtcdServer(t *testing.T) string { return etcdtest.Start(t) }
