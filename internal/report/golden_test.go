package report

import (
	"testing"

	goldenfile "github.com/nixlctl/nixlctl/internal/golden"
)

func golden(t *testing.T, name string, got []byte) { t.Helper(); goldenfile.Check(t, name, got) }
