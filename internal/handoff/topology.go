package handoff

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// EngineSlot is one engine of an xPyD deployment: where it runs and its
// TP size.
type EngineSlot struct {
	// Addr is the control address of a `serve prefill|decode --listen`
	// ([tcp://]host:port), or "local" for a child of the driver.
	Addr string `json:"addr" yaml:"addr"`
	// TP is the engine's tensor-parallel size (0 in a file: --prefill-tp
	// or --decode-tp).
	TP int `json:"tp" yaml:"tp"`
}

// Local says whether the driver starts the engine itself.
func (s EngineSlot) Local() bool { return s.Addr == "" || s.Addr == "local" }

// remoteAddr is the address to dial, "" for a local engine.
func (s EngineSlot) remoteAddr() string {
	if s.Local() {
		return ""
	}
	return s.Addr
}

// Topology is a --topology file: the prefill and decode engines of an
// xPyD run. JSON, or YAML for a .yaml or .yml file:
//
//	{"prefill": [{"addr": "local", "tp": 2}, {"addr": "10.0.0.1:7400", "tp": 2}],
//	 "decode":  [{"addr": "local"}, {"addr": "10.0.0.2:7401", "tp": 1}]}
type Topology struct {
	Prefill []EngineSlot `json:"prefill" yaml:"prefill"`
	Decode  []EngineSlot `json:"decode" yaml:"decode"`
}

// ReadTopology reads and checks a topology file.
func ReadTopology(path string) (Topology, error) {
	b, err := userfile.ReadFile(path, userfile.MaxSmall)
	if err != nil {
		return Topology{}, err
	}
	t, err := ParseTopology(path, b)
	if err != nil {
		return Topology{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseTopology parses a topology (YAML when name ends in .yaml or .yml,
// else JSON), rejecting unknown fields, and checks it: at least one
// engine of each role, addresses host:port or "local", TP not negative.
func ParseTopology(name string, b []byte) (Topology, error) {
	var t Topology
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&t); err != nil {
			return Topology{}, fmt.Errorf("not a topology: %v", err)
		}
	default:
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return Topology{}, fmt.Errorf("not a topology: %v", err)
		}
		if dec.More() {
			return Topology{}, fmt.Errorf("not a topology: more than one JSON value")
		}
	}
	// An engine without "addr" is local; one with "addr": "" is a hole
	// left in the file, which used to run a local engine silently.
	empty, err := emptyAddrs(name, b)
	if err != nil {
		return Topology{}, err
	}
	seen := map[string]string{} // address: the engine that named it first
	for _, r := range []struct {
		role  string
		slots []EngineSlot
	}{{"prefill", t.Prefill}, {"decode", t.Decode}} {
		if len(r.slots) == 0 {
			return Topology{}, fmt.Errorf("no %s engines (want \"%s\": [{\"addr\": \"local\"}, ...])", r.role, r.role)
		}
		for i, s := range r.slots {
			if s.TP < 0 {
				return Topology{}, fmt.Errorf("%s %d: tp must not be negative", r.role, i)
			}
			if empty[fmt.Sprintf("%s %d", r.role, i)] {
				return Topology{}, fmt.Errorf("%s %d: addr is empty (want host:port or \"local\")", r.role, i)
			}
			// Two engines at one address are one engine counted twice.
			if !s.Local() {
				key := strings.TrimPrefix(s.Addr, "tcp://")
				if first, dup := seen[key]; dup {
					return Topology{}, fmt.Errorf("%s %d: address %s is also %s's", r.role, i, s.Addr, first)
				}
				seen[key] = fmt.Sprintf("%s %d", r.role, i)
			}
			if !s.Local() {
				if err := runcore.CheckAddr(s.Addr); err != nil {
					return Topology{}, fmt.Errorf("%s %d: %v (or \"local\")", r.role, i, err)
				}
			}
		}
	}
	return t, nil
}

// parseEngineList turns --prefill/--decode (comma-separated host:port or
// "local") and --prefills/--decodes (a count of local engines) into
// slots of TP tp. An empty list is count local engines; a list is its
// engines, and a count other than 1 must match it. Errors name the
// field (listField or countField) at fault.
func parseEngineList(listField, countField, list string, count, tp int) ([]EngineSlot, error) {
	if count < 0 {
		return nil, errkind.Field(countField, "must not be negative")
	}
	if strings.TrimSpace(list) == "" {
		slots := make([]EngineSlot, max(count, 1))
		for i := range slots {
			slots[i] = EngineSlot{Addr: "local", TP: tp}
		}
		return slots, nil
	}
	var slots []EngineSlot
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a != "local" {
			if err := runcore.CheckAddr(a); err != nil {
				return nil, errkind.Field(listField, "%v", err)
			}
		}
		slots = append(slots, EngineSlot{Addr: a, TP: tp})
	}
	if count > 1 && count != len(slots) {
		return nil, errkind.Field(countField, "%d engines, but the address list names %d", count, len(slots))
	}
	return slots, nil
}

// Router is how the driver assigns requests to (prefill, decode) pairs.
type Router string

// Routers.
const (
	// RouterRoundRobin cycles through every pair: prefill i % N, decode
	// (i / N) % M, so each pair gets a share.
	RouterRoundRobin Router = "round-robin"
	// RouterLeastLoaded picks the pair whose decode has the fewest
	// requests in flight, then whose prefill has; ties go round robin.
	RouterLeastLoaded Router = "least-loaded"
)

// Routers lists the routers.
var Routers = []Router{RouterRoundRobin, RouterLeastLoaded}

func (r Router) String() string { return string(r) }

// router assigns requests to pairs and tracks what each engine has in
// flight. Safe for concurrent use.
type router struct {
	mu       sync.Mutex
	kind     Router
	n, m     int
	next     int
	pin, din []int
	pdead    []bool // engines that died (--on-endpoint-death drain)
	ddead    []bool
}

func newRouter(kind Router, n, m int) *router {
	return &router{kind: kind, n: n, m: m, pin: make([]int, n), din: make([]int, m), pdead: make([]bool, n), ddead: make([]bool, m)}
}

// remove takes a dead engine out of the rotation and reports whether any
// pair of live engines is left.
func (r *router) remove(role string, i int) (pairsLeft bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch role {
	case "prefill":
		r.pdead[i] = true
	case "decode":
		r.ddead[i] = true
	}
	return slices.Contains(r.pdead, false) && slices.Contains(r.ddead, false)
}

// pick assigns the next request a pair of live engines and counts it in
// flight there until done; ok is false when no such pair is left.
func (r *router) pick() (p, d int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pairs := r.n * r.m
	live := func(cp, cd int) bool { return !r.pdead[cp] && !r.ddead[cd] }
	found := false
	for j := 0; j < pairs && !found; j++ {
		k := (r.next + j) % pairs
		p, d = k%r.n, k/r.n%r.m
		if live(p, d) {
			r.next += j + 1
			found = true
		}
	}
	if !found {
		return 0, 0, false
	}
	if r.kind == RouterLeastLoaded {
		k := (r.next - 1) % pairs
		for j := 1; j < pairs; j++ {
			kk := (k + j) % pairs
			cp, cd := kk%r.n, kk/r.n%r.m
			if !live(cp, cd) {
				continue
			}
			if r.din[cd] < r.din[d] || (r.din[cd] == r.din[d] && r.pin[cp] < r.pin[p]) {
				p, d = cp, cd
			}
		}
	}
	r.pin[p]++
	r.din[d]++
	return p, d, true
}

// done says a request of pair (p, d) finished.
func (r *router) done(p, d int) {
	r.mu.Lock()
	r.pin[p]--
	r.din[d]--
	r.mu.Unlock()
}

// engineName is how results and errors name engine i of n of a role:
// "prefill" alone, "prefill-1" among several (its engine id).
func engineName(role string, i, n int) string {
	if n == 1 {
		return role
	}
	return fmt.Sprintf("%s-%d", role, i)
}

// DeathPolicy is what a handoff run does when one of its endpoints dies.
type DeathPolicy string

// Death policies.
const (
	// DeathStop stops the run at once: requests in flight are cancelled
	// and nothing new is sent.
	DeathStop DeathPolicy = "stop"
	// DeathDrain takes the dead engine out of the router: its requests in
	// flight end by themselves (they fail), and the run goes on with the
	// engines left until no live (prefill, decode) pair remains.
	DeathDrain DeathPolicy = "drain"
)

// DeathPolicies lists the policies.
var DeathPolicies = []DeathPolicy{DeathStop, DeathDrain}

func (p DeathPolicy) String() string { return string(p) }

// emptyAddrs names the engines ("decode 1") whose "addr" is given and
// empty, which the decoded EngineSlot cannot tell from a missing one.
func emptyAddrs(name string, b []byte) (map[string]bool, error) {
	type slot struct {
		Addr *string `json:"addr" yaml:"addr"`
	}
	var raw struct {
		Prefill []slot `json:"prefill" yaml:"prefill"`
		Decode  []slot `json:"decode" yaml:"decode"`
	}
	var err error
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		err = yaml.Unmarshal(b, &raw)
	default:
		err = json.Unmarshal(b, &raw)
	}
	if err != nil {
		return nil, fmt.Errorf("not a topology: %v", err)
	}
	out := map[string]bool{}
	for role, slots := range map[string][]slot{"prefill": raw.Prefill, "decode": raw.Decode} {
		for i, s := range slots {
			if s.Addr != nil && strings.TrimSpace(*s.Addr) == "" {
				out[fmt.Sprintf("%s %d", role, i)] = true
			}
		}
	}
	return out, nil
}
