package engine

import (
	"fmt"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// moveList is one transfer's descriptors between a local pool and a
// remote one, with how many there were before contiguous runs merged.
type moveList struct {
	local, remote []nixl.Desc
	logical       int   // descriptors before merging: regions x blocks x chunks
	bytes         int64 // bytes moved
}

// moveOpts says where a request's blocks sit on both sides of a transfer.
type moveOpts struct {
	// Chunks is the TP plan's pieces of a block this pair moves.
	Chunks []kv.Chunk
	// LocalBlocks and RemoteBlocks pair up block for block.
	LocalBlocks, RemoteBlocks []int
	// LogicalStart is the request's logical block of the first pair (the
	// blocks before it are a prefix decode already holds); Tokens is the
	// request's length, which decides what sliding-window layers keep.
	LogicalStart, Tokens int
	// LocalIsPrefill says which side of the chunks (source = prefill
	// block) is local.
	LocalIsPrefill bool
	// Merge turns runs contiguous on both sides into one descriptor, as
	// NIXL merges them (Config.Merge; off for --no-merge).
	Merge bool
}

// buildMoves lays out the descriptors that move a request's blocks between
// a local pool and a remote rank described by its handshake metadata:
// for every region, for every block pair (the regions' own windows
// applied), for every chunk of the TP plan.
func buildMoves(lp *Pool, rm sidechannel.AgentMetadata, o moveOpts) (moveList, error) {
	var ml moveList
	regions := lp.Rank.Regions
	if len(rm.KVCachesBaseAddr) != len(regions) || len(rm.BlockLens) != len(regions) {
		return ml, fmt.Errorf("peer has %d regions, this rank %d: layouts differ", len(rm.KVCachesBaseAddr), len(regions))
	}
	if len(o.LocalBlocks) != len(o.RemoteBlocks) {
		return ml, fmt.Errorf("%d local blocks for %d remote blocks", len(o.LocalBlocks), len(o.RemoteBlocks))
	}
	for _, b := range o.RemoteBlocks {
		if b < 0 || b >= rm.NumBlocks {
			return ml, fmt.Errorf("remote block %d outside the peer's %d blocks", b, rm.NumBlocks)
		}
	}
	total := o.LogicalStart + len(o.LocalBlocks)
	add := func(l, r nixl.Desc) {
		ml.logical++
		ml.bytes += int64(l.Len)
		if n := len(ml.local); o.Merge && n > 0 {
			pl, pr := &ml.local[n-1], &ml.remote[n-1]
			if pl.Addr+pl.Len == l.Addr && pr.Addr+pr.Len == r.Addr {
				pl.Len += l.Len
				pr.Len += r.Len
				return
			}
		}
		ml.local = append(ml.local, l)
		ml.remote = append(ml.remote, r)
	}
	for i, reg := range regions {
		keep := lp.Spec.BlocksFor(reg.Kind, o.Tokens)
		rlen := uint64(rm.BlockLens[i])
		for j, lb := range o.LocalBlocks {
			if o.LogicalStart+j < total-keep {
				continue
			}
			laddr := lp.BlockAddr(i, lb)
			raddr := rm.KVCachesBaseAddr[i] + uint64(o.RemoteBlocks[j])*rlen
			for _, c := range o.Chunks {
				lo, ro := c.DstOffset, c.SrcOffset
				if o.LocalIsPrefill {
					lo, ro = c.SrcOffset, c.DstOffset
				}
				if uint64(ro)+uint64(c.Length) > rlen || lo+c.Length > reg.BlockBytes {
					return ml, fmt.Errorf("chunk %+v does not fit blocks of %d (local) and %d (remote) bytes", c, reg.BlockBytes, rlen)
				}
				add(nixl.Desc{Addr: laddr + uint64(lo), Len: uint64(c.Length)}, nixl.Desc{Addr: raddr + uint64(ro), Len: uint64(c.Length)})
			}
		}
	}
	return ml, nil
}

// remoteMem is the memory type of a peer's KV regions from its handshake.
func remoteMem(rm sidechannel.AgentMetadata, fallback nixl.MemType) nixl.MemType {
	if len(rm.RegionMemTypes) > 0 {
		if m, err := nixl.ParseMemType(rm.RegionMemTypes[0]); err == nil {
			return m
		}
	}
	return fallback
}
