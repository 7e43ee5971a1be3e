// Package ec re-creates vLLM's encoder-cache connector (ECCPUConnector,
// PR #47941): the msgspec wire messages, the shared-memory region and its
// block cache, the producer (encoder) and the consumers that fetch
// encoder outputs over a transfer agent, and the encoder's control
// channel. bench ec drives it.
package ec
