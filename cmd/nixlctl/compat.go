package main

import (
	"encoding/hex"
	"strings"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// compatFlags is what --compat-factors FILE or --compat-hash HEX say: the
// factors file (as given, and parsed) with the hash vLLM computes from it,
// or the hash itself; from names the flag for messages. Zero when neither
// was given.
type compatFlags struct {
	raw     []byte
	factors map[string]any
	hash    string
	from    string
}

// readCompatFlags checks the two flags (one or neither) before anything
// runs, for every command that takes them.
func readCompatFlags(factorsPath, hashHex string) (compatFlags, error) {
	var c compatFlags
	switch {
	case factorsPath != "" && hashHex != "":
		return c, errkind.BadInputf("--compat-hash: give --compat-factors or --compat-hash, not both")
	case hashHex != "":
		if _, err := hex.DecodeString(hashHex); err != nil || len(hashHex) != 64 {
			return c, errkind.BadInputf("--compat-hash: %q is not a sha256 in hex (64 characters)", hashHex)
		}
		c.hash, c.from = strings.ToLower(hashHex), "--compat-hash"
	case factorsPath != "":
		b, err := userfile.ReadFile(factorsPath, userfile.MaxSmall)
		if err != nil {
			return c, errkind.BadInputf("--compat-factors: %v", err)
		}
		if c.factors, c.hash, err = sidechannel.ParseCompatFactors(b); err != nil {
			return c, errkind.BadInputf("--compat-factors %s: %v", factorsPath, err)
		}
		c.raw, c.from = b, "--compat-factors "+factorsPath
	}
	return c, nil
}
