// Package blocktag writes and checks the tag patterns that let a receiver
// prove every block landed where it belongs: a tag is derived from a key
// (request, layer, block, head...), so a misaddressed, stale or torn
// block is caught, not just a missing one. Spans of host or GPU memory
// are tagged and checked with the same calls.
package blocktag
