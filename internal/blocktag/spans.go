package blocktag

import (
	"errors"
	"fmt"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

// Endpoints tag and verify blocks with the same calls whatever memory
// they live in: host memory is tagged in place, device memory through host
// copies of the spans (one batch per chunk of at most stageLimit bytes, so
// a long list costs few calls into the driver and bounded host memory).

// stageLimit bounds one staged host copy (a variable so tests can shrink it).
var stageLimit = 64 << 20

// FillSpans writes the tag pattern of key(i) into the i-th span of b.
func FillSpans(b *nixl.Buffer, spans []nixl.Span, key func(i int) uint64) error {
	return eachSpan(b, spans, true, func(i int, _ nixl.Span, data []byte) { Fill(data, key(i)) })
}

// SpanCheck is what CheckSpans found.
type SpanCheck struct {
	Bad   int    // spans with at least one wrong byte
	First string // the first of them, described
}

// CheckSpans verifies the i-th span of b against the pattern of key(i).
func CheckSpans(b *nixl.Buffer, spans []nixl.Span, key func(i int) uint64) (SpanCheck, error) {
	var c SpanCheck
	err := VisitSpans(b, spans, key, func(i int, s nixl.Span, m *Mismatch) {
		if c.Bad == 0 {
			c.First = fmt.Sprintf("span %d at offset %d: %v", i, s.Off, m)
		}
		c.Bad++
	})
	return c, err
}

// VisitSpans checks every span and calls bad for each wrong one.
func VisitSpans(b *nixl.Buffer, spans []nixl.Span, key func(i int) uint64, bad func(i int, s nixl.Span, m *Mismatch)) error {
	return eachSpan(b, spans, false, func(i int, s nixl.Span, data []byte) {
		if m := Check(data, key(i)); m != nil {
			bad(i, s, m)
		}
	})
}

// eachSpan calls fn with the bytes of each span of b, in order: in place
// in host memory; for VRAM through staged host copies, copied out before
// fn reads them, or (write) copied in after fn wrote them.
func eachSpan(b *nixl.Buffer, spans []nixl.Span, write bool, fn func(i int, s nixl.Span, data []byte)) error {
	if err := b.CheckSpans(spans); err != nil {
		return err
	}
	if b.Mem != nixl.VRAM {
		data, err := hostView(b)
		if err != nil {
			return err
		}
		for i, s := range spans {
			fn(i, s, data[s.Off:s.Off+s.Len])
		}
		return nil
	}
	return staged(spans, func(first int, part []nixl.Span, host []byte) error {
		if !write {
			if err := cuda.CopyOut(b, part, host); err != nil {
				return err
			}
		}
		at := 0
		for k, s := range part {
			fn(first+k, s, host[at:at+s.Len])
			at += s.Len
		}
		if write {
			return cuda.CopyIn(b, part, host)
		}
		return nil
	})
}

func hostView(b *nixl.Buffer) ([]byte, error) {
	data := b.Bytes()
	if data == nil && b.Len > 0 {
		return nil, errors.New("host buffer has no host view")
	}
	return data, nil
}

// staged calls fn for consecutive runs of spans of at most stageLimit
// bytes (a longer span alone), with a host buffer of the run's size.
func staged(spans []nixl.Span, fn func(first int, part []nixl.Span, host []byte) error) error {
	var buf []byte
	for i := 0; i < len(spans); {
		j, n := i, 0
		for j < len(spans) && (j == i || n+spans[j].Len <= stageLimit) {
			n += spans[j].Len
			j++
		}
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		if err := fn(i, spans[i:j], buf[:n]); err != nil {
			return err
		}
		i = j
	}
	return nil
}
