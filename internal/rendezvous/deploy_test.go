package rendezvous

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The deploy/ examples cannot run here (no cluster, no Slurm); these
// tests check that they parse and keep the promises their comments make
// about the rendezvous: roles by index, ranks the roster expects, P and D
// on different nodes.

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		ClusterIP      string `yaml:"clusterIP"`
		CompletionMode string `yaml:"completionMode"`
		Completions    int    `yaml:"completions"`
		Parallelism    int    `yaml:"parallelism"`
		Template       struct {
			Spec struct {
				Subdomain string `yaml:"subdomain"`
				Affinity  struct {
					PodAntiAffinity struct {
						Required []struct {
							TopologyKey string `yaml:"topologyKey"`
						} `yaml:"requiredDuringSchedulingIgnoredDuringExecution"`
					} `yaml:"podAntiAffinity"`
				} `yaml:"affinity"`
				Containers []struct {
					Args            []string `yaml:"args"`
					SecurityContext struct {
						Capabilities struct {
							Add []string `yaml:"add"`
						} `yaml:"capabilities"`
					} `yaml:"securityContext"`
					Env []struct {
						Name  string `yaml:"name"`
						Value string `yaml:"value"`
					} `yaml:"env"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func TestK8sManifest(t *testing.T) {
	f, err := os.Open("../../deploy/k8s/nixlctl-pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	byName := map[string]k8sObject{}
	dec := yaml.NewDecoder(f)
	dec.KnownFields(false)
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		byName[o.Kind+"/"+o.Metadata.Name] = o
	}
	svc, ok := byName["Service/nixlctl-pd"]
	if !ok || svc.Spec.ClusterIP != "None" {
		t.Fatalf("no headless Service nixlctl-pd: %+v", svc)
	}
	if _, ok := byName["Service/nixlctl-driver"]; !ok {
		t.Error("no Service for the driver")
	}
	if _, ok := byName["Job/nixlctl-driver"]; !ok {
		t.Error("no driver Job")
	}
	job, ok := byName["Job/nixlctl-pd"]
	if !ok {
		t.Fatal("no Job nixlctl-pd")
	}
	s := job.Spec
	if s.CompletionMode != "Indexed" || s.Completions != 2 || s.Parallelism != 2 {
		t.Errorf("Job: mode %q, completions %d, parallelism %d", s.CompletionMode, s.Completions, s.Parallelism)
	}
	ps := s.Template.Spec
	if ps.Subdomain != "nixlctl-pd" {
		t.Errorf("subdomain %q: pods get DNS names only under the headless Service's name", ps.Subdomain)
	}
	if r := ps.Affinity.PodAntiAffinity.Required; len(r) != 1 || r[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity %+v", r)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers", len(ps.Containers))
	}
	c := ps.Containers[0]
	if add := c.SecurityContext.Capabilities.Add; len(add) != 1 || add[0] != "IPC_LOCK" {
		t.Errorf("capabilities %v", add)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["NIXLCTL_WORLD_SIZE"] != "2" || env["NIXLCTL_JOB_ID"] == "" {
		t.Errorf("env %v: the launcher needs the world size and a run id", env)
	}
	script := strings.Join(c.Args, "\n")
	for _, want := range []string{`"$JOB_COMPLETION_INDEX"`, "0) role=prefill", "1) role=decode",
		`nixlctl serve "$role" --listen 0.0.0.0:7400 --register`} {
		if !strings.Contains(script, want) {
			t.Errorf("the endpoint's script lacks %q:\n%s", want, script)
		}
	}
	// The roster the driver is given matches the roles by index.
	driver := strings.Join(byName["Job/nixlctl-driver"].Spec.Template.Spec.Containers[0].Args, "\n")
	if !strings.Contains(driver, "--roster prefill=0,decode=1") {
		t.Errorf("the driver's roster:\n%s", driver)
	}
}

func TestSlurmScript(t *testing.T) {
	const path = "../../deploy/slurm/nixlctl-pd.sbatch"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bash, err := exec.LookPath("bash"); err == nil {
		if out, err := exec.Command(bash, "-n", path).CombinedOutput(); err != nil {
			t.Fatalf("bash -n: %v\n%s", err, out)
		}
	}
	for _, want := range []string{"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", `"$SLURM_PROCID"`,
		"0) role=prefill", "1) role=decode", "--register", "--roster prefill=0,decode=1", `--run-id "${NIXLCTL_JOB_ID:-$SLURM_JOB_ID}"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q", path, want)
		}
	}
}
