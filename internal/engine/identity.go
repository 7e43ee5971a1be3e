package engine

import (
	"encoding/json"
	"fmt"
)

// Identity is the vLLM compatibility identity an endpoint was started
// with (serve prefill|decode --compat-factors, --compat-hash,
// --no-compat-check): the endpoint stands for a vLLM engine whose hash
// the operator knows, so its own command line decides it, not whichever
// driver connects. The zero value leaves it to the driver. Source names
// where it came from, for errors ("serve --compat-hash").
type Identity struct {
	Factors json.RawMessage
	HashHex string
	NoCheck bool
	Source  string
}

func (id Identity) set() bool { return len(id.Factors) > 0 || id.HashHex != "" || id.NoCheck }

// driverCompatSource names the options a driver's setup carried.
func driverCompatSource(cfg Config) string {
	switch {
	case len(cfg.CompatFactors) > 0:
		return "the driver's --compat-factors"
	case cfg.CompatHashHex != "":
		return "the driver's --compat-hash"
	}
	return "the driver's derived hash"
}

// apply gives cfg the endpoint's identity. A driver that sent none takes
// it; one that sent another (another hash, or another mind about checking
// peers' hashes) fails the setup naming both, rather than the endpoint
// quietly being what the operator did not start it as.
func (id Identity) apply(cfg *Config) error {
	if !id.set() {
		return nil
	}
	mine := *cfg
	mine.CompatFactors, mine.CompatHashHex, mine.NoCompatCheck = id.Factors, id.HashHex, id.NoCheck
	if len(cfg.CompatFactors) == 0 && cfg.CompatHashHex == "" && !cfg.NoCompatCheck {
		*cfg = mine
		return nil
	}
	want, err := mine.CompatHash()
	if err != nil {
		return fmt.Errorf("%s: %w", id.Source, err)
	}
	got, err := cfg.CompatHash()
	if err != nil {
		return fmt.Errorf("%s: %w", driverCompatSource(*cfg), err)
	}
	if got != want {
		return fmt.Errorf("compatibility hash: %s gives %s, this endpoint's %s gives %s", driverCompatSource(*cfg), got, id.Source, want)
	}
	if cfg.NoCompatCheck != id.NoCheck {
		return fmt.Errorf("compatibility check: the driver's --no-compat-check=%t, this endpoint's %s has --no-compat-check=%t", cfg.NoCompatCheck, id.Source, id.NoCheck)
	}
	return nil
}
