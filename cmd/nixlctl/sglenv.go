package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/handoff"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// SGLang's environment variables for the settings bench sglang has flags
// for, read as upstream reads them (python/sglang/srt/environ.py): the
// timeouts as whole seconds, the heartbeat interval as seconds (float) and
// raised to 2, the failures as an integer raised to 1. So a bench run in an
// SGLang deployment's environment behaves as that deployment would; a flag
// given on the command line wins.
const (
	envSGLBootstrapTimeout = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
	envSGLWaitingTimeout   = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
	envSGLHeartbeatIntvl   = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"
	envSGLHeartbeatMax     = "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"
)

// maxEnvSeconds is the most seconds a variable may give: a Duration holds
// about 292 years; this is ten.
const maxEnvSeconds = 10 * 365 * 24 * 3600

// applySGLEnv sets each SGLang setting whose flag was not given from its
// environment variable, when that is set.
// A variable set to blanks counts as unset, as SGLang's get_*_env_var
// helpers have it.
func applySGLEnv(h *handoff.HandoffOptions, set explicitOptions, getenv func(string) (string, bool)) error {
	lookup := func(env string) (string, bool) {
		v, ok := getenv(env)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	seconds := func(flag, env string, dst *runcore.Duration) error {
		v, ok := lookup(env)
		if !ok || set(flag) {
			return nil
		}
		// Past maxEnvSeconds, n seconds wrapped as a Duration.
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxEnvSeconds {
			return errkind.BadInputf("$%s %q: want a positive whole number of seconds, at most %d (or give --%s)", env, v, maxEnvSeconds, flag)
		}
		*dst = runcore.Duration(time.Duration(n) * time.Second)
		return nil
	}
	if err := seconds("sglang-bootstrap-timeout", envSGLBootstrapTimeout, &h.SGLBootstrapTimeout); err != nil {
		return err
	}
	if err := seconds("sglang-waiting-timeout", envSGLWaitingTimeout, &h.SGLWaitingTimeout); err != nil {
		return err
	}
	if v, ok := lookup(envSGLHeartbeatIntvl); ok && !set("sglang-heartbeat-interval") {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f > 1e6 {
			return errkind.BadInputf("$%s %q: want seconds (or give --sglang-heartbeat-interval)", envSGLHeartbeatIntvl, v)
		}
		h.SGLHeartbeatInterval = runcore.Duration(max(time.Duration(f*float64(time.Second)), engine.SGLMinHeartbeatInterval))
		if d := time.Duration(f * float64(time.Second)); d < engine.SGLMinHeartbeatInterval {
			// Raised as upstream raises it, but said: the run's interval
			// is not what the variable asks.
			h.Warnings = append(h.Warnings, fmt.Sprintf("$%s %s: below SGLang's floor, raised to %v as SGLang does (--sglang-heartbeat-interval sets it)",
				envSGLHeartbeatIntvl, v, h.SGLHeartbeatInterval))
		}
	}
	if v, ok := lookup(envSGLHeartbeatMax); ok && !set("sglang-heartbeat-max-failures") {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errkind.BadInputf("$%s %q: want an integer (or give --sglang-heartbeat-max-failures)", envSGLHeartbeatMax, v)
		}
		h.SGLHeartbeatMaxFailures = max(n, 1)
		if n < 1 {
			h.Warnings = append(h.Warnings, fmt.Sprintf("$%s %s: raised to 1 as SGLang does (--sglang-heartbeat-max-failures sets it)", envSGLHeartbeatMax, v))
		}
	}
	return nil
}
