package rendezvous

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"unicode/utf8"

	"github.com/nixlctl/nixlctl/internal/launcher"
)

// Version is the hello format this package speaks.
const Version = 1

// Reverse as a hello's Ctl asks the driver to use the connection the hello
// came on as the member's control channel (TCP only).
const Reverse = "reverse"

// MaxHello bounds one hello line; real ones are a few hundred bytes.
const MaxHello = 4096

// Hello is what a member announces.
type Hello struct {
	V     int    `json:"v"`
	Run   string `json:"run"`   // the run id; members of other runs are turned away
	Role  string `json:"role"`  // prefill, decode, ...
	Rank  int    `json:"rank"`  // this member's rank in the world
	World int    `json:"world"` // how many members the run has
	Host  string `json:"host"`  // the member's host name, for reports
	// Ctl is where the member serves its control channel (HOST:PORT; an
	// unspecified host such as 0.0.0.0 is replaced by an address the
	// driver can reach) or Reverse.
	Ctl string `json:"ctl"`
}

// wireHello tells a missing field from a zero: a hello with "rnk" instead
// of "rank" must not silently be rank 0.
type wireHello struct {
	V     *int    `json:"v"`
	Run   *string `json:"run"`
	Role  *string `json:"role"`
	Rank  *int    `json:"rank"`
	World *int    `json:"world"`
	Host  *string `json:"host"`
	Ctl   *string `json:"ctl"`
}

// DecodeHello parses and validates one hello line (without or with its
// trailing newline). Unknown fields, missing fields, trailing data and
// anything Validate refuses are errors.
func DecodeHello(line []byte) (Hello, error) {
	if len(line) > MaxHello {
		return Hello{}, fmt.Errorf("hello is %d bytes, more than %d", len(line), MaxHello)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var w wireHello
	if err := dec.Decode(&w); err != nil {
		return Hello{}, fmt.Errorf("hello is not a JSON object of known fields: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Hello{}, errors.New("hello has data after its JSON object")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"v", w.V != nil}, {"run", w.Run != nil}, {"role", w.Role != nil}, {"rank", w.Rank != nil},
		{"world", w.World != nil}, {"host", w.Host != nil}, {"ctl", w.Ctl != nil}} {
		if !f.set {
			return Hello{}, fmt.Errorf("hello has no %q", f.name)
		}
	}
	h := Hello{V: *w.V, Run: *w.Run, Role: *w.Role, Rank: *w.Rank, World: *w.World, Host: *w.Host, Ctl: *w.Ctl}
	return h, h.Validate()
}

// Encode is the hello's line, newline included; V is set to Version.
func (h Hello) Encode() ([]byte, error) {
	h.V = Version
	if err := h.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Validate says what is wrong with a hello, or nil.
func (h Hello) Validate() error {
	if h.V != Version {
		return fmt.Errorf("hello version %d, this driver speaks %d", h.V, Version)
	}
	if err := validRun(h.Run); err != nil {
		return err
	}
	if err := validRole(h.Role); err != nil {
		return err
	}
	switch {
	case h.World < 1:
		return fmt.Errorf("world size %d: a world has at least one member", h.World)
	case h.Rank < 0 || h.Rank >= h.World:
		return fmt.Errorf("rank %d is outside world size %d", h.Rank, h.World)
	case h.Host == "" || len(h.Host) > 255 || !printable(h.Host, false):
		return fmt.Errorf("host %.64q is not a host name", h.Host)
	}
	if h.Ctl == Reverse {
		return nil
	}
	if _, err := splitCtl(h.Ctl); err != nil {
		return err
	}
	return nil
}

// splitCtl checks a control address, HOST:PORT, and returns its port.
func splitCtl(ctl string) (string, error) {
	host, port, err := net.SplitHostPort(ctl)
	if err != nil || len(ctl) > 300 || !printable(host, false) {
		return "", fmt.Errorf("control address %.64q is neither HOST:PORT nor %q", ctl, Reverse)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("control address %.64q has no port", ctl)
	}
	return port, nil
}

// validRun: a run id is a path segment of an etcd key, so no '/', nothing
// unprintable and no spaces. TCP runs may leave it empty.
func validRun(run string) error {
	if len(run) > 128 || !printable(run, true) {
		return fmt.Errorf("run id %.64q: up to 128 printable characters, no '/' or spaces", run)
	}
	return nil
}

// validRole: a lower-case word, also a key segment.
func validRole(role string) error {
	ok := role != "" && len(role) <= 32 && role[0] >= 'a' && role[0] <= 'z'
	for i := 0; ok && i < len(role); i++ {
		c := role[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("role %.64q: a lower-case word of up to 32 letters, digits, '-' or '_'", role)
	}
	return nil
}

// printable: valid UTF-8 with no control characters or spaces; with
// keySafe, ASCII only and no '/'.
func printable(s string, keySafe bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || keySafe && (r == '/' || r > 0x7e) {
			return false
		}
	}
	return true
}

// FromLauncher is this process's hello, rank and world size taken from
// the launcher (launcher.FromEnviron): run defaults to the launcher's job
// id, the host is os.Hostname. The caller may override any field.
func FromLauncher(info launcher.Info, run, role, ctl string) (Hello, error) {
	if run == "" {
		run = info.JobID
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	h := Hello{V: Version, Run: run, Role: role, Rank: info.Rank, World: info.WorldSize, Host: host, Ctl: ctl}
	return h, h.Validate()
}

// Self is FromLauncher on this process's environment.
func Self(run, role, ctl string, opt launcher.Options) (Hello, error) {
	info, err := launcher.FromEnviron(opt)
	if err != nil {
		return Hello{}, err
	}
	return FromLauncher(info, run, role, ctl)
}
