package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSlurm runs the unmodified deploy/slurm/nixlctl-pd.sbatch on a real
// Slurm (Debian's slurm-wlm 22.05) staged on this machine: a munged of its
// own, slurmctld and one slurmd on host a, a second slurmd on host b (the
// hosts of scripts/twohosts.sh). It checks the success path (0 failed
// requests) and that a failed task or a failed driver ends the job in
// seconds, releasing both nodes and leaving no process behind. Root; under
// CI=true it must run, elsewhere it skips with the reason.
func TestSlurm(t *testing.T) {
	ci := os.Getenv("CI") == "true"
	var tools = map[string]string{}
	for _, tool := range []string{"slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "munged"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			// The daemons are in /usr/sbin, which a user's PATH may lack.
			p, err = exec.LookPath(filepath.Join("/usr/sbin", tool))
		}
		if err != nil {
			if ci {
				t.Fatalf("CI=true and the Slurm test cannot run: %s not found (scripts/setup.sh --deps installs slurm-wlm and munge)", tool)
			}
			t.Skipf("%s not found (apt install slurm-wlm munge)", tool)
		}
		tools[tool] = p
	}
	mh := newTwoHosts(t)
	sl := startSlurm(t, mh, tools)
	template, err := filepath.Abs("../../deploy/slurm/nixlctl-pd.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	small := []string{"MODEL=llama-3.2-1b", "ISL=256", "REQUESTS=12", "CONCURRENCY=2"}

	t.Run("success", func(t *testing.T) {
		start := time.Now()
		job, code, out := sl.sbatch(t, template, append([]string{"NIXLCTL=" + mh.bin}, small...)...)
		took := time.Since(start)
		t.Logf("job %s: exit %d in %v", job, code, took.Round(100*time.Millisecond))
		if code != 0 {
			t.Fatalf("job %s exited %d:\n%s", job, code, lastLines(out, 20))
		}
		m := regexp.MustCompile(`requests ok / failed\s+(\d+) / (\d+)`).FindStringSubmatch(out)
		if m == nil || m[1] == "0" || m[2] != "0" {
			t.Errorf("want requests ok and 0 failed in the table:\n%s", lastLines(out, 30))
		}
		for _, want := range []string{"registered prefill rank 0 of 2", "registered decode rank 1 of 2", "nixlctl-pd: decode on"} {
			if !strings.Contains(out, want) {
				t.Errorf("the job's output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "FAILED") {
			t.Errorf("a successful job says FAILED:\n%s", out)
		}
		sl.gone(t, job, mh.bin)
	})

	// wrapper is NIXLCTL for a job where nixlctl fails as cond says.
	wrapper := func(t *testing.T, cond, msg string) string {
		p := filepath.Join(t.TempDir(), "nixlctl-wrapper")
		script := fmt.Sprintf("#!/bin/bash\nif %s; then echo %q >&2; exit 1; fi\nexec %q \"$@\"\n", cond, msg, mh.bin)
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// why is the output's proof that the injected failure happened: the
	// driver's own line (the batch script's stderr), or srun's report of
	// the task's exit; srun may drop the last line a task printed when it
	// terminates the step a moment later (CI lost the wrapper's line).
	for _, tc := range []struct {
		name, cond, want, why string
	}{
		{"task 1 exits 1 at start", `[ "${SLURM_PROCID:-}" = 1 ] && [ "$1" = serve ]`, "nixlctl-pd: FAILED: endpoint step",
			"task 1: Exited with exit code 1"},
		{"driver exits 1 at start", `[ "$1" = bench ]`, "nixlctl-pd: FAILED: driver (bench pull) exited 1",
			"wrapper: driver exits 1 at start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := wrapper(t, tc.cond, "wrapper: "+tc.name)
			start := time.Now()
			job, code, out := sl.sbatch(t, template, append([]string{"NIXLCTL=" + w}, small...)...)
			took := time.Since(start)
			t.Logf("job %s: exit %d in %v", job, code, took.Round(100*time.Millisecond))
			if code == 0 {
				t.Errorf("job %s exited 0 with %s", job, tc.name)
			}
			if took > 30*time.Second {
				t.Errorf("job %s took %v to end with %s (the join window is 5m)", job, took, tc.name)
			}
			if !strings.Contains(out, tc.want) || !strings.Contains(out, tc.why) {
				t.Errorf("the job's output lacks %q or %q:\n%s", tc.want, tc.why, out)
			}
			sl.gone(t, job, w, mh.bin)
		})
	}
}

// slurm is a running cluster of two nodes, nodea (host a, which also runs
// slurmctld) and nodeb (host b).
type slurm struct {
	mh      *twoHosts
	conf    string // slurm.conf
	workdir string // the jobs' working directory
	tools   map[string]string
}

func startSlurm(t *testing.T, mh *twoHosts, tools map[string]string) *slurm {
	dir := t.TempDir()
	for _, d := range []string{"munge", "state", "spool", "log", "jobs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// munged: its own key and socket; everything runs as root (--force).
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(dir, "munge")
	if err := os.WriteFile(filepath.Join(mdir, "key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(mdir, "sock")
	munged := exec.Command(tools["munged"], "--foreground", "--force", "--socket="+sock,
		"--key-file="+filepath.Join(mdir, "key"), "--pid-file="+filepath.Join(mdir, "pid"),
		"--log-file="+filepath.Join(mdir, "log"), "--seed-file="+filepath.Join(mdir, "seed"))
	munged.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var mout syncBuffer
	munged.Stdout, munged.Stderr = &mout, &mout
	if err := munged.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-munged.Process.Pid, syscall.SIGKILL)
		_ = munged.Wait()
	})
	waitFor(t, 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })

	mh.names(t, "nodea", "nodeb")
	a, b := mh.addr("a"), mh.addr("b")

	// slurmctld must run on a host named in SlurmctldHost: this machine's
	// name, at host a's address.
	me, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	me, _, _ = strings.Cut(me, ".")
	conf := filepath.Join(dir, "slurm.conf")
	slurmConf := fmt.Sprintf(`ClusterName=nixlctltest
SlurmctldHost=%[1]s(%[2]s)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[4]s
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool/%%n
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd-%%n.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd-%%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=2
NodeName=nodea NodeAddr=%[2]s NodeHostname=nodea CPUs=2 State=UNKNOWN
NodeName=nodeb NodeAddr=%[3]s NodeHostname=nodeb CPUs=2 State=UNKNOWN
PartitionName=pd Nodes=nodea,nodeb Default=YES MaxTime=INFINITE State=UP
`, me, a, b, sock, dir)
	if err := os.WriteFile(conf, []byte(slurmConf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Without cgroup.conf slurmd looks for a cgroup hierarchy, which the
	// hosts' fresh /sys does not have; nothing here uses cgroups.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.conf"), []byte("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sl := &slurm{mh: mh, conf: conf, workdir: filepath.Join(dir, "jobs"), tools: tools}

	// Daemons in the foreground, each in its host's namespaces: killed,
	// each takes its PID namespace (every task it started) along.
	logs := map[string]*syncBuffer{}
	start := func(name, host string, args ...string) {
		_, _, errb := mh.startExe(t, host, tools[name], args...)
		logs[name+"-"+host] = errb
	}
	start("slurmctld", "a", "-D", "-i", "-f", conf)
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(logs["slurmctld-a"].String(), "Running as primary controller") })
	for _, h := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(dir, "spool", "node"+h), 0o700); err != nil {
			t.Fatal(err)
		}
		start("slurmd", h, "-D", "-N", "node"+h, "-f", conf)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, b := range logs {
				t.Logf("%s:\n%s", name, lastLines(b.String(), 15))
			}
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := sl.client("sinfo", "-h", "-N", "-o", "%N %T").CombinedOutput()
		if err == nil && strings.Count(string(out), "idle") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes are not idle after 60 s: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return sl
}

// names makes host a's and host b's addresses resolve as nameA and nameB
// on both hosts: ip netns exec binds /etc/netns/NS/hosts over /etc/hosts.
// The files go when the test ends.
func (mh *twoHosts) names(t *testing.T, nameA, nameB string) {
	t.Helper()
	hosts := fmt.Sprintf("127.0.0.1 localhost\n%s %s\n%s %s\n", mh.addr("a"), nameA, mh.addr("b"), nameB)
	for _, h := range []string{"a", "b"} {
		d := filepath.Join("/etc/netns", mh.name+"-"+h)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.RemoveAll(d)
			_ = os.Remove("/etc/netns") // only when empty
		})
		if err := os.WriteFile(filepath.Join(d, "hosts"), []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// client is a Slurm command run on host a.
func (sl *slurm) client(tool string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", sl.mh.name + "-a", sl.tools[tool]}, args...)...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+sl.conf)
	return cmd
}

// sbatch submits script with env added to this environment (sbatch passes
// it to the job), waits for the job to end, and returns its id, exit
// status and output file.
func (sl *slurm) sbatch(t *testing.T, script string, env ...string) (string, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := sl.client("sbatch", "--wait", "--chdir="+sl.workdir, script)
	cmd.Env = append(cmd.Env, env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := runGroup(ctx, t, cmd)
	m := regexp.MustCompile(`Submitted batch job (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("sbatch: %v\n%s", err, out.String())
	}
	job := m[1]
	if ctx.Err() != nil {
		_ = sl.client("scancel", job).Run()
		t.Fatalf("job %s still running after 4 min", job)
	}
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	b, err := os.ReadFile(filepath.Join(sl.workdir, "nixlctl-pd-"+job+".out"))
	if err != nil {
		t.Fatalf("job %s's output: %v (sbatch said %s)", job, err, out.String())
	}
	return job, code, string(b)
}

// gone checks that job left the queue and that no process runs any of
// exes (whose paths are unique to this test).
func (sl *slurm) gone(t *testing.T, job string, exes ...string) {
	t.Helper()
	start := time.Now()
	var left []string
	for {
		out, _ := sl.client("squeue", "-h", "-j", job, "-o", "%i %T").CombinedOutput()
		queued := strings.Contains(string(out), job+" ")
		left = running(exes...)
		if !queued && len(left) == 0 {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("10 s after job %s ended: squeue %q, processes %q", job, strings.TrimSpace(string(out)), left)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// running lists the processes whose command line names any of paths, as
// "PID: command line".
func running(paths ...string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		for _, path := range paths {
			if strings.Contains(cmdline, path) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				found = append(found, fmt.Sprintf("%d: %s", pid, cmdline))
				break
			}
		}
	}
	return found
}
