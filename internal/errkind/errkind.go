// Package errkind classifies errors so that the command line can map each
// kind to one exit code in one place, while the packages that detect the
// problem stay free of any CLI dependency.
package errkind

import (
	"errors"
	"fmt"
)

// badInput marks an error caused by what the user asked for: a flag value,
// a config file, a model name. The CLI exits 2 and may show usage.
type badInput struct{ err error }

func (e badInput) Error() string { return e.err.Error() }
func (e badInput) Unwrap() error { return e.err }

// BadInput marks err as the user's input being wrong. nil stays nil.
func BadInput(err error) error {
	if err == nil {
		return nil
	}
	return badInput{err}
}

// BadInputf formats a bad-input error.
func BadInputf(format string, a ...any) error { return badInput{fmt.Errorf(format, a...)} }

// IsBadInput reports whether err (or anything it wraps) is bad input.
func IsBadInput(err error) bool {
	var b badInput
	return errors.As(err, &b)
}

// checkFailed marks a run that completed and printed its results but whose
// results fail a check the user asked for (a regression, a failed chaos
// expectation, corrupt blocks). The CLI exits 1 without an extra message
// beyond the error itself.
type checkFailed struct{ err error }

func (e checkFailed) Error() string { return e.err.Error() }
func (e checkFailed) Unwrap() error { return e.err }

// CheckFailedf formats a failed-check error.
func CheckFailedf(format string, a ...any) error { return checkFailed{fmt.Errorf(format, a...)} }

// IsCheckFailed reports whether err is a failed check.
func IsCheckFailed(err error) bool {
	var c checkFailed
	return errors.As(err, &c)
}
