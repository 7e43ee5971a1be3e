// Package launcher finds this process's rank and the world size from the
// environment a launcher (Slurm, Open MPI, torchrun, a Kubernetes Indexed
// Job, a LeaderWorkerSet) gives it, so that a multi-host run needs no
// per-process flags. The environment is injected, so Detect is pure and
// every launcher is tested without one.
package launcher

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

// Source names the launcher the rank came from.
const (
	Slurm         = "slurm"
	OpenMPI       = "openmpi"
	Torchrun      = "torchrun"
	IndexedJob    = "k8s-indexed-job"
	LeaderWorkers = "lws"
	None          = "none"
)

// Info is this process's place in the job.
type Info struct {
	Rank, WorldSize int
	// Leader is rank 0's address (host or host:port) when the launcher
	// says; empty otherwise, and the caller must find rank 0 another way.
	Leader string
	// JobID namespaces rendezvous keys so that two jobs sharing a store do
	// not meet; empty when the launcher gives nothing unique.
	JobID string
	// Source is which launcher the values came from (a constant above).
	Source string
	// Shadowed lists other launchers whose variables were also set but
	// lost to Source, so the caller can log what it ignored.
	Shadowed []string
}

// Options are what the environment may not say.
type Options struct {
	// WorldSize is used when the launcher gives no world size (an Indexed
	// Job: pods see their index, not the Job's completions). The
	// environment's NIXLCTL_WORLD_SIZE overrides it.
	WorldSize int
}

// Env looks up one variable, like os.LookupEnv.
type Env func(string) (string, bool)

// FromEnviron is Detect on this process's environment.
func FromEnviron(opt Options) (Info, error) { return Detect(os.LookupEnv, opt) }

// detector recognises one launcher: present says whether its variables are
// set at all; parse reads them.
type detector struct {
	source  string
	present func(Env) bool
	parse   func(Env, Options) (parsed, error)
}

// detectors are tried in this order and the first present one wins; the
// rest are Shadowed. Launchers nest, and the innermost knows each
// process's rank best:
//   - torchrun first: run under srun or mpirun it starts several workers
//     per task, and only RANK tells them apart (SLURM_PROCID and the
//     OMPI rank are the task's, shared by its workers). Its variables are
//     also the ones a user sets by hand to override everything else.
//   - Open MPI before Slurm: mpirun inside an sbatch allocation passes the
//     batch step's SLURM_PROCID (0) to every rank; OMPI_COMM_WORLD_RANK is
//     per process.
//   - Slurm before the Kubernetes ones, which never legitimately coexist
//     with it.
//   - LeaderWorkerSet before Indexed Job: it names the leader and the group
//     size, an Indexed Job names neither.
var detectors = []detector{
	{Torchrun, anySet("RANK", "WORLD_SIZE"), parseTorchrun},
	{OpenMPI, anySet("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), parseOpenMPI},
	{Slurm, anySet("SLURM_PROCID"), parseSlurm},
	{LeaderWorkers, anySet("LWS_WORKER_INDEX", "LWS_GROUP_SIZE"), parseLWS},
	{IndexedJob, anySet("JOB_COMPLETION_INDEX"), parseIndexedJob},
}

// Detect reads rank and world size from the first launcher (in the order
// above) whose variables are set. A malformed value is an error naming the
// variable, never a fall-through to the next launcher, which would give
// every process a wrong but plausible rank. With no launcher the process
// is rank 0 of 1.
func Detect(env Env, opt Options) (Info, error) {
	var chosen *detector
	var shadowed []string
	for i := range detectors {
		d := &detectors[i]
		if !d.present(env) {
			continue
		}
		if chosen == nil {
			chosen = d
		} else {
			shadowed = append(shadowed, d.source)
		}
	}
	if chosen == nil {
		return Info{Rank: 0, WorldSize: 1, Source: None}, nil
	}
	info, err := chosen.parse(env, opt)
	if err != nil {
		return Info{}, fmt.Errorf("launcher: %s: %w", chosen.source, err)
	}
	info.Source, info.Shadowed = chosen.source, shadowed
	if info.Rank >= info.WorldSize {
		return Info{}, fmt.Errorf("launcher: %s: rank %d (%s) is not below the world size %d (%s)",
			chosen.source, info.Rank, info.rankVar, info.WorldSize, info.sizeVar)
	}
	return info.Info, nil
}

// parsed carries the variable names along for the rank check's error.
type parsed struct {
	Info
	rankVar, sizeVar string
}

func anySet(names ...string) func(Env) bool {
	return func(env Env) bool {
		for _, n := range names {
			if _, ok := env(n); ok {
				return true
			}
		}
		return false
	}
}

// intVar reads a required non-negative integer.
func intVar(env Env, name string) (int, error) {
	s, ok := env(name)
	if !ok {
		return 0, fmt.Errorf("%s is not set", name)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not an integer", name, s)
	}
	if v < 0 {
		return 0, fmt.Errorf("%s=%d is negative", name, v)
	}
	return v, nil
}

// sizeVar reads a required world size, which must be at least 1.
func sizeVar(env Env, name string) (int, error) {
	v, err := intVar(env, name)
	if err == nil && v < 1 {
		err = fmt.Errorf("%s=%d: a world has at least one process", name, v)
	}
	return v, err
}

// firstSet names the first of names that is set, or else the first name,
// so that an error about a missing variable names the usual one.
func firstSet(env Env, names ...string) string {
	for _, n := range names {
		if _, ok := env(n); ok {
			return n
		}
	}
	return names[0]
}

func rankAndSize(env Env, rankName, sizeName string) (parsed, error) {
	var p parsed
	var err error
	p.rankVar, p.sizeVar = rankName, sizeName
	if p.Rank, err = intVar(env, rankName); err != nil {
		return parsed{}, err
	}
	if p.WorldSize, err = sizeVar(env, sizeName); err != nil {
		return parsed{}, err
	}
	return p, nil
}

func get(env Env, name string) string {
	v, _ := env(name)
	return v
}

// jobID is NIXLCTL_JOB_ID when it is set, else the launcher's id. The
// explicit variable wins: someone set it on purpose, typically to give the
// endpoints the run id of a driver outside the launcher (mpirun -x
// NIXLCTL_JOB_ID=...), which cannot know a PMIX_NAMESPACE or a job id
// made up after it started.
func jobID(env Env, launcherVar string) string {
	if v := get(env, "NIXLCTL_JOB_ID"); v != "" {
		return v
	}
	return get(env, launcherVar)
}

func parseTorchrun(env Env, _ Options) (parsed, error) {
	p, err := rankAndSize(env, "RANK", "WORLD_SIZE")
	if err != nil {
		return parsed{}, err
	}
	if host := get(env, "MASTER_ADDR"); host != "" {
		p.Leader = host
		if port := get(env, "MASTER_PORT"); port != "" {
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
				return parsed{}, fmt.Errorf("MASTER_PORT=%q is not a port", port)
			}
			p.Leader = net.JoinHostPort(host, port)
		}
	}
	// torchrun's --rdzv-id defaults to "none", which namespaces nothing.
	if id := jobID(env, "TORCHELASTIC_RUN_ID"); id != "none" {
		p.JobID = id
	}
	return p, nil
}

func parseOpenMPI(env Env, _ Options) (parsed, error) {
	p, err := rankAndSize(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
	if err != nil {
		return parsed{}, err
	}
	p.JobID = jobID(env, "PMIX_NAMESPACE")
	return p, nil
}

func parseSlurm(env Env, _ Options) (parsed, error) {
	// SLURM_NPROCS is the older name Slurm still sets next to SLURM_NTASKS.
	p, err := rankAndSize(env, "SLURM_PROCID", firstSet(env, "SLURM_NTASKS", "SLURM_NPROCS"))
	if err != nil {
		return parsed{}, err
	}
	p.JobID = jobID(env, "SLURM_JOB_ID")
	return p, nil
}

func parseLWS(env Env, _ Options) (parsed, error) {
	p, err := rankAndSize(env, "LWS_WORKER_INDEX", "LWS_GROUP_SIZE")
	if err != nil {
		return parsed{}, err
	}
	// The leader's address names its group's leader pod
	// (<lws>-<group>.<service>.<namespace>), so it is unique per group and
	// doubles as the key namespace.
	p.Leader = get(env, "LWS_LEADER_ADDRESS")
	p.JobID = jobID(env, "LWS_LEADER_ADDRESS")
	return p, nil
}

func parseIndexedJob(env Env, opt Options) (parsed, error) {
	var p parsed
	var err error
	p.rankVar = "JOB_COMPLETION_INDEX"
	if p.Rank, err = intVar(env, p.rankVar); err != nil {
		return parsed{}, err
	}
	switch _, ok := env("NIXLCTL_WORLD_SIZE"); {
	case ok:
		p.sizeVar = "NIXLCTL_WORLD_SIZE"
		if p.WorldSize, err = sizeVar(env, p.sizeVar); err != nil {
			return parsed{}, err
		}
	case opt.WorldSize > 0:
		p.sizeVar, p.WorldSize = "the caller's default", opt.WorldSize
	default:
		return parsed{}, fmt.Errorf("JOB_COMPLETION_INDEX=%d but the world size is unknown: set NIXLCTL_WORLD_SIZE to the Job's completions", p.Rank)
	}
	p.JobID = get(env, "NIXLCTL_JOB_ID")
	return p, nil
}
