package launcher

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func envOf(m map[string]string) Env {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		opt  Options
		want Info
	}{
		{"none", nil, Options{}, Info{Rank: 0, WorldSize: 1, Source: None}},
		{"unrelated variables", map[string]string{"HOME": "/root", "SLURM_JOB_ID": "42"}, Options{},
			Info{Rank: 0, WorldSize: 1, Source: None}},
		{"slurm", map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "1234"}, Options{},
			Info{Rank: 3, WorldSize: 4, JobID: "1234", Source: Slurm}},
		{"slurm, old NPROCS", map[string]string{"SLURM_PROCID": "1", "SLURM_NPROCS": "2", "SLURM_JOB_ID": "9"}, Options{},
			Info{Rank: 1, WorldSize: 2, JobID: "9", Source: Slurm}},
		{"open mpi", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "prterun-host-1234@1"}, Options{},
			Info{Rank: 0, WorldSize: 2, JobID: "prterun-host-1234@1", Source: OpenMPI}},
		{"torchrun", map[string]string{"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "kv1"}, Options{},
			Info{Rank: 5, WorldSize: 8, Leader: "node0:29500", JobID: "kv1", Source: Torchrun}},
		{"torchrun, IPv6 master, default run id", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "fd00::1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}, Options{},
			Info{Rank: 0, WorldSize: 2, Leader: "[fd00::1]:29500", Source: Torchrun}},
		{"torchrun by hand, no port", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "NIXLCTL_JOB_ID": "mine"}, Options{},
			Info{Rank: 1, WorldSize: 2, Leader: "10.0.0.1", JobID: "mine", Source: Torchrun}},
		{"indexed job, world size from env", map[string]string{"JOB_COMPLETION_INDEX": "1", "NIXLCTL_WORLD_SIZE": "2"}, Options{WorldSize: 9},
			Info{Rank: 1, WorldSize: 2, Source: IndexedJob}},
		{"indexed job, caller's default", map[string]string{"JOB_COMPLETION_INDEX": "0", "NIXLCTL_JOB_ID": "pd-7"}, Options{WorldSize: 2},
			Info{Rank: 0, WorldSize: 2, JobID: "pd-7", Source: IndexedJob}},
		{"leaderworkerset", map[string]string{"LWS_LEADER_ADDRESS": "pd-0.pd.default", "LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2"}, Options{},
			Info{Rank: 1, WorldSize: 2, Leader: "pd-0.pd.default", JobID: "pd-0.pd.default", Source: LeaderWorkers}},
		{"torchrun under slurm: RANK wins", map[string]string{"RANK": "6", "WORLD_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"}, Options{},
			Info{Rank: 6, WorldSize: 8, Source: Torchrun, Shadowed: []string{Slurm}}},
		{"mpirun inside sbatch: OMPI wins", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "77"}, Options{},
			Info{Rank: 3, WorldSize: 4, Source: OpenMPI, Shadowed: []string{Slurm}}},
		{"everything at once", map[string]string{
			"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "x", "SLURM_PROCID": "-4",
			"LWS_WORKER_INDEX": "0", "JOB_COMPLETION_INDEX": "0"}, Options{},
			Info{Rank: 0, WorldSize: 1, Source: Torchrun, Shadowed: []string{OpenMPI, Slurm, LeaderWorkers, IndexedJob}}},
		// An explicit NIXLCTL_JOB_ID beats the launcher's id (a driver
		// outside mpirun cannot know PMIX_NAMESPACE).
		{"open mpi, NIXLCTL_JOB_ID wins", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "prterun-host-1234@1", "NIXLCTL_JOB_ID": "pd-9"}, Options{},
			Info{Rank: 1, WorldSize: 2, JobID: "pd-9", Source: OpenMPI}},
		{"slurm, NIXLCTL_JOB_ID wins", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77", "NIXLCTL_JOB_ID": "pd-9"}, Options{},
			Info{Rank: 0, WorldSize: 2, JobID: "pd-9", Source: Slurm}},
		{"torchrun, NIXLCTL_JOB_ID wins", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "kv1", "NIXLCTL_JOB_ID": "pd-9"}, Options{},
			Info{Rank: 0, WorldSize: 2, JobID: "pd-9", Source: Torchrun}},
		{"leaderworkerset, NIXLCTL_JOB_ID wins", map[string]string{"LWS_LEADER_ADDRESS": "pd-0.pd.default", "LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2", "NIXLCTL_JOB_ID": "pd-9"}, Options{},
			Info{Rank: 1, WorldSize: 2, Leader: "pd-0.pd.default", JobID: "pd-9", Source: LeaderWorkers}},
		{"open mpi, empty NIXLCTL_JOB_ID", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "ns@1", "NIXLCTL_JOB_ID": ""}, Options{},
			Info{Rank: 0, WorldSize: 2, JobID: "ns@1", Source: OpenMPI}},
		{"leaderworkerset inside an indexed job", map[string]string{"LWS_WORKER_INDEX": "0", "LWS_GROUP_SIZE": "3", "JOB_COMPLETION_INDEX": "2"}, Options{},
			Info{Rank: 0, WorldSize: 3, Source: LeaderWorkers, Shadowed: []string{IndexedJob}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(envOf(tc.env), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestDetectErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		opt  Options
		want string // a substring; every error must name the variable
	}{
		{"non-integer rank", map[string]string{"SLURM_PROCID": "one", "SLURM_NTASKS": "2"}, Options{}, `slurm: SLURM_PROCID="one" is not an integer`},
		{"negative rank", map[string]string{"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, Options{}, "OMPI_COMM_WORLD_RANK=-1 is negative"},
		{"rank at world size", map[string]string{"RANK": "2", "WORLD_SIZE": "2"}, Options{}, "rank 2 (RANK) is not below the world size 2 (WORLD_SIZE)"},
		{"zero world size", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, Options{}, "WORLD_SIZE=0"},
		{"rank without world size", map[string]string{"RANK": "0"}, Options{}, "WORLD_SIZE is not set"},
		{"world size without rank", map[string]string{"WORLD_SIZE": "2"}, Options{}, "RANK is not set"},
		{"slurm without task count", map[string]string{"SLURM_PROCID": "0"}, Options{}, "SLURM_NTASKS is not set"},
		{"slurm NPROCS malformed", map[string]string{"SLURM_PROCID": "0", "SLURM_NPROCS": "2x"}, Options{}, `SLURM_NPROCS="2x"`},
		{"bad master port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, Options{}, `MASTER_PORT="70000"`},
		{"indexed job without world size", map[string]string{"JOB_COMPLETION_INDEX": "1"}, Options{}, "set NIXLCTL_WORLD_SIZE"},
		{"indexed job past the env world size", map[string]string{"JOB_COMPLETION_INDEX": "3", "NIXLCTL_WORLD_SIZE": "3"}, Options{}, "(JOB_COMPLETION_INDEX) is not below the world size 3 (NIXLCTL_WORLD_SIZE)"},
		{"indexed job past the default", map[string]string{"JOB_COMPLETION_INDEX": "3"}, Options{WorldSize: 2}, "(JOB_COMPLETION_INDEX) is not below the world size 2 (the caller's default)"},
		{"indexed job, malformed env world size beats a default", map[string]string{"JOB_COMPLETION_INDEX": "0", "NIXLCTL_WORLD_SIZE": ""}, Options{WorldSize: 2}, `NIXLCTL_WORLD_SIZE=""`},
		{"lws index past group", map[string]string{"LWS_WORKER_INDEX": "2", "LWS_GROUP_SIZE": "2"}, Options{}, "(LWS_WORKER_INDEX) is not below the world size 2 (LWS_GROUP_SIZE)"},
		// A malformed winner must not fall through to a valid launcher below it.
		{"malformed torchrun over valid slurm", map[string]string{"RANK": "1.5", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, Options{}, `torchrun: RANK="1.5"`},
		{"overflowing rank", map[string]string{"RANK": "99999999999999999999", "WORLD_SIZE": "2"}, Options{}, "RANK="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(envOf(tc.env), tc.opt)
			if err == nil {
				t.Fatalf("no error; got %+v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestFromEnviron(t *testing.T) {
	for _, k := range []string{"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
		"LWS_WORKER_INDEX", "LWS_GROUP_SIZE", "JOB_COMPLETION_INDEX"} {
		t.Setenv(k, "") // restores the variable after the test
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "3")
	got, err := FromEnviron(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Rank != 1 || got.WorldSize != 3 || got.Source != Torchrun {
		t.Errorf("%+v", got)
	}
}

// Launcher variables are outside input: whatever they hold, Detect returns
// either an error or a rank inside the world.
func FuzzDetect(f *testing.F) {
	f.Add("3", "4", "0", "")
	f.Add("-1", "x", "", "2")
	f.Add("", "", "5", "0")
	f.Fuzz(func(t *testing.T, rank, size, index, nws string) {
		env := map[string]string{}
		for k, v := range map[string]string{"SLURM_PROCID": rank, "SLURM_NTASKS": size, "JOB_COMPLETION_INDEX": index, "NIXLCTL_WORLD_SIZE": nws} {
			if v != "" {
				env[k] = v
			}
		}
		got, err := Detect(envOf(env), Options{WorldSize: 2})
		if err == nil && (got.Rank < 0 || got.WorldSize < 1 || got.Rank >= got.WorldSize) {
			t.Fatalf("%v gave %+v", env, got)
		}
	})
}
