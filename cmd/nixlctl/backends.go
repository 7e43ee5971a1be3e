package main

// The transfer backends this binary can open by name.
import (
	_ "github.com/nixlctl/nixlctl/internal/nixl/cudaipc"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
)
