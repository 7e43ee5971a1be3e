package capi

import (
	"fmt"
	"os"
	"testing"
)

// A child started by TestUnavailableReasons prints why the backend is
// unavailable in its own environment: the library is loaded once per
// process, so each setting needs a process of its own.
func TestMain(m *testing.M) {
	if os.Getenv("NIXLCTL_CAPI_TEST_REASON") == "1" {
		fmt.Print(Unavailable())
		os.Exit(0)
	}
	os.Exit(m.Run())
}
