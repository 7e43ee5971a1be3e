package testkit

import (
	"net"
	"testing"
)

// FreeAddr is a loopback address ("127.0.0.1:PORT") that nothing listens
// on when it returns: the kernel's pick of a free port, for a server a
// test starts in another process. Something else may take the port
// before that server binds it; the test then fails loudly, not silently.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
