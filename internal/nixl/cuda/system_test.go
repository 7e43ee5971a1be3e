package cuda_test

import (
	"os"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

// QuerySystem answers for the host's libcuda.so.1 whatever driver this
// process loaded for its GPU memory (the tests usually load the fake).
func TestQuerySystem(t *testing.T) {
	if mode == "fake" {
		_ = cuda.Err() // load the fake first: the system query must still not see it
	}
	d, err := cuda.QuerySystem()
	t.Logf("mode %s (%s=%q): %+v, %v", mode, cuda.EnvLib, os.Getenv(cuda.EnvLib), d, err)
	if err != nil {
		if !strings.Contains(err.Error(), "libcuda.so.1") && !strings.Contains(err.Error(), "cuInit") {
			t.Errorf("no driver and no clear reason: %v", err)
		}
		if d.Version != 0 || d.GPUs != nil {
			t.Errorf("an error with an answer: %+v", d)
		}
		return
	}
	for _, g := range d.GPUs {
		if strings.Contains(g.Name, "FAKE") {
			t.Errorf("the system query saw the fake driver: %+v", g)
		}
	}
	if d2, err := cuda.QuerySystem(); err != nil || len(d2.GPUs) != len(d.GPUs) {
		t.Errorf("a second query differs: %+v, %v", d2, err)
	}
}
