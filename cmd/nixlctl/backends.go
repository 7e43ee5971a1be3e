package main

// The transfer backends nixlctl can open with --backend (and "auto").
// They register themselves when imported.
import (
	_ "github.com/nixlctl/nixlctl/internal/nixl/capi"
	_ "github.com/nixlctl/nixlctl/internal/nixl/cudaipc"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
)
