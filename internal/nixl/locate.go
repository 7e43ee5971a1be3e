package nixl

import "fmt"

// Locate finds the region that holds each descriptor of a list being
// prepared: holds(j, d) says whether region j (of n) does. Descriptors
// come in runs over one region, so the previous descriptor's region is
// tried first. at, where not nil, is given each descriptor's index and
// its region's, and may refuse (its error is returned). A descriptor no
// region holds is an error wrapping ErrNotRegistered that names it, as a
// local descriptor (remote "") or one of the remote agent's.
func Locate(remote string, descs []Desc, n int, holds func(region int, d Desc) bool, at func(desc, region int) error) error {
	last := -1
	for i, d := range descs {
		if last < 0 || !holds(last, d) {
			last = -1
			for j := range n {
				if holds(j, d) {
					last = j
					break
				}
			}
			if last < 0 {
				if remote == "" {
					return fmt.Errorf("local descriptor %d (%#x+%d): %w", i, d.Addr, d.Len, ErrNotRegistered)
				}
				return fmt.Errorf("remote descriptor %d (%#x+%d) of %s: %w", i, d.Addr, d.Len, remote, ErrNotRegistered)
			}
		}
		if at != nil {
			if err := at(i, last); err != nil {
				return err
			}
		}
	}
	return nil
}
