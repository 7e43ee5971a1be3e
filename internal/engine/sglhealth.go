package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// SGLang decode's liveness check on its prefills, as nixl/conn.py's
// heartbeat_checker does it: every interval (a sleep, then one round over
// every prefill whose server info decode holds, one after the other),
// GET http://{bootstrap_addr}/health with a 2 s connect and 3 s read
// timeout. A 200 resets that prefill's count of failures; anything else (a
// status, a refused or timed-out connection) adds one. At the limit,
// _handle_node_failure: decode forgets the prefill's server info and its
// cached sockets, and fails every room still waiting on it. Without it a
// dead prefill is noticed only by the waiting timeout, 300 s upstream.

// Upstream's defaults (python/sglang/srt/environ.py) and the floors its
// decode puts under the heartbeat settings: max(interval, 2.0),
// max(max_failure, 1).
const (
	SGLDefaultBootstrapTimeout     = 300 * time.Second
	SGLDefaultWaitingTimeout       = 300 * time.Second
	SGLDefaultHeartbeatInterval    = 5 * time.Second
	SGLDefaultHeartbeatMaxFailures = 2
	SGLMinHeartbeatInterval        = 2 * time.Second
)

// SGLDefaultKVCacheDType is SGLang's ServerArgs.kv_cache_dtype default. A
// prefill registers the setting itself, not the dtype it resolves to
// (common/conn.py CommonKVManager.register_to_bootstrap @0094505d), and a
// decode refuses a prefill whose string differs from its own
// (try_ensure_parallel_info: "KV cache dtype mismatch"), so nixlctl
// speaks the default unless told what a peer sets.
const SGLDefaultKVCacheDType = "auto"

// The connect and read timeouts of upstream's health GET (timeout=(2, 3)).
const (
	sglHealthConnectTimeout = 2 * time.Second
	sglHealthReadTimeout    = 3 * time.Second
)

// sglDefaults fills SGLang's unset timeouts with upstream's defaults and
// floors the heartbeat settings where upstream floors them.
func (c *Config) sglDefaults() error {
	for name, d := range map[string]runcore.Duration{"sglang_bootstrap_timeout": c.SGLBootstrapTimeout,
		"sglang_waiting_timeout": c.SGLWaitingTimeout, "sglang_heartbeat_interval": c.SGLHeartbeatInterval} {
		if d < 0 {
			return fmt.Errorf("%s %v must not be negative", name, d)
		}
	}
	if c.SGLHeartbeatMaxFailures < 0 {
		return fmt.Errorf("sglang_heartbeat_max_failures %d must not be negative", c.SGLHeartbeatMaxFailures)
	}
	c.SGLKVCacheDType = cmp.Or(c.SGLKVCacheDType, SGLDefaultKVCacheDType)
	c.SGLBootstrapTimeout = cmp.Or(c.SGLBootstrapTimeout, runcore.Duration(SGLDefaultBootstrapTimeout))
	c.SGLWaitingTimeout = cmp.Or(c.SGLWaitingTimeout, runcore.Duration(SGLDefaultWaitingTimeout))
	c.SGLHeartbeatInterval = max(cmp.Or(c.SGLHeartbeatInterval, runcore.Duration(SGLDefaultHeartbeatInterval)), runcore.Duration(SGLMinHeartbeatInterval))
	c.SGLHeartbeatMaxFailures = max(cmp.Or(c.SGLHeartbeatMaxFailures, SGLDefaultHeartbeatMaxFailures), 1)
	return nil
}

// sglLiveness counts each prefill's consecutive failed checks. Like
// upstream's heartbeat_failures it is not reset when a prefill is given
// up on: decode stops checking it (its server info is gone) until a new
// request fetches the info again, and then its first check decides, a
// success clearing the count and a failure giving it up at once.
type sglLiveness struct {
	max   int
	fails map[string]int
}

func newSGLLiveness(maxFailures int) *sglLiveness {
	return &sglLiveness{max: maxFailures, fails: map[string]int{}}
}

// observe records one check of addr (err nil: a 200) and says how many
// checks have failed in a row and whether the prefill is to be given up.
func (l *sglLiveness) observe(addr string, err error) (fails int, lost bool) {
	if err == nil {
		delete(l.fails, addr)
		return 0, false
	}
	l.fails[addr]++
	return l.fails[addr], l.fails[addr] >= l.max
}

// heartbeat is decode's liveness loop; it ends with the engine.
func (s *sglState) heartbeat(ctx context.Context) {
	e := s.e
	live := newSGLLiveness(e.cfg.SGLHeartbeatMaxFailures)
	// One keep-alive session per prefill, as upstream's session_pool.
	sessions := map[string]*http.Client{}
	drop := func(addr string) {
		if c := sessions[addr]; c != nil {
			c.CloseIdleConnections()
			delete(sessions, addr)
		}
	}
	defer func() {
		for addr := range sessions {
			drop(addr)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(e.cfg.SGLHeartbeatInterval)):
		}
		s.mu.Lock()
		addrs := make([]string, 0, len(s.info))
		for addr := range s.info {
			addrs = append(addrs, addr)
		}
		s.mu.Unlock()
		slices.Sort(addrs)
		for _, addr := range addrs {
			c := sessions[addr]
			if c == nil {
				c = newSGLHealthClient()
				sessions[addr] = c
			}
			e.c.sglHeartbeats.Add(1)
			err := sglCheckHealth(ctx, c, addr)
			if ctx.Err() != nil {
				return
			}
			fails, lost := live.observe(addr, err)
			if err != nil {
				e.c.sglHeartbeatFails.Add(1)
				e.log.Info("SGLang heartbeat failed; attempting to reconnect", "bootstrap_addr", addr, "failures", fails, "err", err)
				var st sglHealthStatus
				if errors.As(err, &st) {
					drop(addr) // upstream drops the session on a non-200 answer
				}
			}
			if lost {
				drop(addr)
				s.lostPrefill(addr, fails, err)
			}
		}
	}
}

// sglHealthStatus is a /health answer other than 200.
type sglHealthStatus struct{ status string }

func (e sglHealthStatus) Error() string { return "/health answered " + e.status }

func newSGLHealthClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: sglHealthConnectTimeout}).DialContext,
		ResponseHeaderTimeout: sglHealthReadTimeout,
		MaxIdleConnsPerHost:   1,
		DisableCompression:    true,
	}}
}

// sglCheckHealth is one GET /health. Upstream's read timeout bounds each
// wait for data; an overall bound of connect plus read keeps a server that
// trickles its body from holding the loop longer.
func sglCheckHealth(ctx context.Context, c *http.Client, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, sglHealthConnectTimeout+sglHealthReadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return sglHealthStatus{resp.Status}
	}
	return err
}

// lostPrefill is upstream's _handle_node_failure: forget the prefill's
// server info and sockets (a later request looks it up afresh), and fail
// the rooms still waiting on it, naming why.
func (s *sglState) lostPrefill(addr string, fails int, last error) {
	reason := fmt.Errorf("prefill %s lost: %d consecutive /health checks failed (last: %v)", addr, fails, last)
	prefix := addr + "/"
	var pushes []*sidechannel.Push
	rooms := map[uint64]bool{}
	s.e.c.sglPrefillsLost.Add(1)
	s.mu.Lock()
	delete(s.info, addr)
	for k := range s.registered {
		if strings.HasPrefix(k[1], prefix) {
			delete(s.registered, k)
		}
	}
	for _, sr := range s.ranks {
		for k, p := range sr.push {
			if strings.HasPrefix(k, prefix) {
				pushes = append(pushes, p)
				delete(sr.push, k)
			}
		}
	}
	for _, recv := range s.recv {
		for room, rc := range recv {
			if rc.addr == addr && rc.fail(reason) {
				rooms[room] = true
			}
		}
	}
	s.mu.Unlock()
	for _, p := range pushes {
		_ = p.Close()
	}
	s.e.log.Error("lost connection with prefill instance", "bootstrap_addr", addr, "transfers_affected", len(rooms), "reason", reason)
}

// fail marks a room that has not completed as failed (under sglState.mu);
// false if it already completed or failed.
func (rc *sglRecv) fail(reason error) bool {
	if rc.complete || rc.err != nil {
		return false
	}
	rc.err = reason
	close(rc.failed)
	return true
}
