// Package kv models the paged KV cache of a transformer as serving engines
// lay it out: how many bytes one token costs, how the cache is split across
// tensor- and pipeline-parallel ranks, how it is carved into fixed-size
// blocks and registered as memory regions, and therefore how many transfer
// descriptors of what size moving one request's cache takes.
//
// The package is a leaf: it does no I/O beyond parsing bytes it is handed
// (see ParseHFConfig), so the same numbers drive `nixlctl kv layout`, the
// endpoints that allocate real KV pools, and the simulators.
package kv
