package main

import (
	"strings"
	"testing"
)

// Bad input to bench ec and serve encoder exits 2 with one line and the
// usage hint, before anything starts.
func TestBenchECBadInputExitCodes(t *testing.T) {
	t.Chdir(t.TempDir())
	tests := []struct {
		args   []string
		stderr string
	}{
		{[]string{"--direction", "up"}, `--direction: unknown op "up" (want READ or WRITE)`},
		{[]string{"--model", "nope"}, `unknown vision model "nope"`},
		{[]string{"--grid", "1x3x4"}, "multiples of the spatial merge size 2"},
		{[]string{"--grid", "0x4x4"}, "--grid: "},
		{[]string{"--grid", "1x3x4"}, "--grid: "},
		{[]string{"--consumer-region", "64K"}, "cannot hold one image"},
		{[]string{"--producer-region", "lots"}, "is not a size"},
		{[]string{"--unique-images", "1", "--images-per-request", "2"}, "--unique-images: 1 must be at least the images per request (2)"},
		{[]string{"--zipf-s", "11"}, "--zipf-s: must be between 0"},
		{[]string{"--consumers", "65"}, "--consumers: must be between 1 and 64"},
		{[]string{"--ack-timeout", "0s"}, "--ack-timeout: must be positive"},
		{[]string{"--backend", "rdma"}, `--backend "rdma": unknown (available: auto, `},
		{[]string{"--dtype", "int4"}, "--dtype: unknown dtype"},
		{[]string{"--hidden-size", "-1"}, "hidden size must be > 0"},
		{[]string{"--records", "no/such/dir/r.jsonl", "--requests", "1"}, "--records no/such/dir/r.jsonl: directory no/such/dir does not exist"},
		{[]string{"--requests", "x"}, "invalid argument"},
	}
	for _, tc := range tests {
		args := append([]string{"bench", "ec"}, tc.args...)
		code, _, stderr := runCLI(t, nil, args...)
		if code != exitUsage || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("%v: exit %d, stderr %q (want 2 and %q)", tc.args, code, stderr, tc.stderr)
		}
		if strings.Count(strings.TrimSpace(stderr), "\n") > 1 || strings.Contains(stderr, "panic") {
			t.Errorf("%v: want one line plus the hint, got %q", tc.args, stderr)
		}
	}
	if code, _, stderr := runCLI(t, nil, "serve", "encoder"); code != exitUsage || !strings.Contains(stderr, "exactly one of --stdio and --listen") {
		t.Errorf("serve encoder without a channel: %d %q", code, stderr)
	}
}
