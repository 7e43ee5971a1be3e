// Package nixltest is the conformance suite every transfer backend passes
// (register, metadata, prepared lists, make/create, post, status, release,
// notifications after the data, telemetry, faults), in one process and
// across processes, with a memory kit per backend; and the post/wait
// benchmarks. It holds only tests.
package nixltest
