// Package xferbench is the bench xfer run kind: nixlbench's sweep of
// block and batch sizes between an initiator (this process) and a target
// process, over the chosen backend, with per-point bandwidth, latency
// percentiles and a same-run reference (memcpy, or the device-to-device
// copy for VRAM). Session holds a run open so that another run kind can
// measure single points between its own phases (the handoffs'
// interleaved references).
//
// What every run kind shares is internal/runcore.
package xferbench
