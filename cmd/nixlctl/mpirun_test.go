package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenMPI starts prefill and decode with Open MPI's mpirun across the
// two hosts of scripts/twohosts.sh (its rsh agent is a script that runs
// orted on host b's namespaces instead of ssh): each endpoint takes its
// rank and world size from OMPI_COMM_WORLD_*, and its run id from
// NIXLCTL_JOB_ID (passed with -x), which must beat PMIX_NAMESPACE for the
// driver outside mpirun to admit them. Root; under CI=true it must run,
// elsewhere it skips with the reason.
func TestOpenMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the Open MPI test cannot run: mpirun not found (scripts/setup.sh --deps installs openmpi-bin): %v", err)
		}
		t.Skipf("mpirun not found (apt install openmpi-bin): %v", err)
	}
	mh := newTwoHosts(t)
	mh.names(t, "hosta", "hostb")
	dir := t.TempDir()
	// mpirun runs the agent as `AGENT HOST COMMAND...`; host a is mpirun's
	// own (its name resolves to a local address), so only host b's orted
	// comes through here. A UTS namespace gives orted its host's name.
	agent := filepath.Join(dir, "rsh-agent")
	script := fmt.Sprintf(`#!/bin/bash
host=$1; shift
case $host in hosta) ns=%[1]s-a ;; hostb) ns=%[1]s-b ;; *) echo "rsh-agent: unknown host $host" >&2; exit 2 ;; esac
exec ip netns exec "$ns" unshare --uts --ipc --pid --mount-proc --kill-child -- bash -c 'hostname "$0" && eval "$1"' "$host" "$*"
`, mh.name)
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	const runID = "ompi-pd"
	start := time.Now()
	driver, out, errb := mh.start(t, "a", 0, "bench", "pull", "--rendezvous", "0.0.0.0:7520", "--roster", "prefill=0,decode=1",
		"--run-id", runID, "--join-window", "60s", "--model", "llama-3.2-1b", "--isl", "256", "--requests", "8", "--concurrency", "2", "-o", "json")
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(errb.String(), "rendezvous: waiting at") })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.Command("ip", "netns", "exec", mh.name+"-a", mpirun, "--mca", "plm_rsh_agent", agent,
		"--mca", "oob_tcp_if_include", mh.dev, "--host", "hosta,hostb", "-np", "2",
		"-x", "NIXLCTL_JOB_ID", "-x", "NIXLCTL_BIN", "bash", "-c", `
case $OMPI_COMM_WORLD_RANK in 0) role=prefill ;; 1) role=decode ;; *) exit 2 ;; esac
exec "$NIXLCTL_BIN" serve "$role" --listen 0.0.0.0:7400 --register hosta:7520`)
	cmd.Env = append(rdvEnv(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"NIXLCTL_JOB_ID="+runID, "NIXLCTL_BIN="+mh.bin)
	var mout syncBuffer
	cmd.Stdout, cmd.Stderr = &mout, &mout
	merr := runGroup(ctx, t, cmd)
	derr := driver.Wait()
	t.Logf("mpirun: %v, driver: %v, in %v", merr, derr, time.Since(start).Round(100*time.Millisecond))
	if ctx.Err() != nil {
		t.Fatalf("mpirun still running after 2 min:\n%s", lastLines(mout.String(), 20))
	}
	if merr != nil || derr != nil {
		t.Fatalf("mpirun: %v\n%s\ndriver: %v\n%s", merr, lastLines(mout.String(), 20), derr, lastLines(errb.String(), 10))
	}
	for _, want := range []string{
		fmt.Sprintf("registered prefill rank 0 of 2 (run %q", runID),
		fmt.Sprintf("registered decode rank 1 of 2 (run %q, host hostb)", runID),
	} {
		if !strings.Contains(mout.String(), want) {
			t.Errorf("mpirun's output lacks %q:\n%s", want, mout.String())
		}
	}
	var res handoffJSON
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("driver's result: %v\n%s", err, out)
	}
	res.check(t, mh)
	mh.checkNetPath(t, res.NetPath, "decode")
	for deadline := time.Now().Add(10 * time.Second); len(running(mh.bin, agent)) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("10 s after mpirun ended: %q", running(mh.bin, agent))
			break
		}
	}
}
