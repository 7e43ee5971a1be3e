package main

import "github.com/nixlctl/nixlctl/internal/errkind"

// zeroFlag is a flag whose 0 the code below it reads as "not given": the
// default (a preset's value, upstream's, one engine). Negatives were
// refused while an explicit 0 silently became that default, so a run
// the user asked to be different ran as if nothing had been asked.
type zeroFlag struct {
	flag   string
	isZero bool   // the resolved value is 0
	want   string // the values that mean something, e.g. "at least 1"
	dflt   string // what leaving the flag out gives
}

// refuseExplicitZero refuses each flag the user set (flag, environment or
// config file) to 0 where 0 means its default, naming the valid range.
func refuseExplicitZero(set explicitOptions, flags ...zeroFlag) error {
	for _, f := range flags {
		if f.isZero && set(f.flag) {
			return errkind.BadInputf("--%s 0: want %s (leave it out for %s)", f.flag, f.want, f.dflt)
		}
	}
	return nil
}
