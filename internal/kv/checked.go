package kv

import (
	"math"
	"math/bits"
)

// mulChecked multiplies non-negative factors and reports whether the
// product fits in an int64. Byte counts here are products of sizes read
// from config files and flags, so an adversarial input must be refused,
// not wrapped into a small or negative size.
func mulChecked(factors ...int64) (int64, bool) {
	p := int64(1)
	for _, f := range factors {
		if f < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(p), uint64(f))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		p = int64(lo)
	}
	return p, true
}
