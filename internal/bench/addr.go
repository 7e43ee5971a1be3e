package bench

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// checkAddr checks a host:port before anything dials it: a typo such as a
// missing port or port 99999 is the user's to fix (bad input), where a
// well-formed address nobody listens on is a failed run.
func checkAddr(s string) error {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(s, "tcp://"))
	if err != nil {
		return fmt.Errorf("%q: want host:port", s)
	}
	if host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1..65535", s)
	}
	return nil
}
