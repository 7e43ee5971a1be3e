package errkind

import (
	"errors"
	"fmt"
)

// FieldError is a problem with one field of an options struct. Field is
// the Go field's path ("ISL.Fixed"), not a flag name: internal packages do
// not know their flags, and the CLI, which does, names the flag instead
// (it derives the flag from the field's mapstructure tag).
type FieldError struct {
	Field string
	Err   error
}

func (e FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e FieldError) Unwrap() error { return e.Err }

// Field makes a FieldError with a formatted message.
func Field(field, format string, a ...any) error {
	return FieldError{Field: field, Err: fmt.Errorf(format, a...)}
}

// FieldIn finds the FieldError for field anywhere in err's tree (Validate
// joins one per bad field, and errors.As stops at the first FieldError
// whatever its field).
func FieldIn(err error, field string) (FieldError, bool) {
	switch e := err.(type) {
	case nil:
		return FieldError{}, false
	case FieldError:
		if e.Field == field {
			return e, true
		}
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if fe, ok := FieldIn(inner, field); ok {
				return fe, true
			}
		}
		return FieldError{}, false
	}
	return FieldIn(errors.Unwrap(err), field)
}

// Fields lists the field of every FieldError in err's tree, in the order
// Validate joined them: which fields a validation blamed.
func Fields(err error) []string {
	switch e := err.(type) {
	case nil:
		return nil
	case FieldError:
		return []string{e.Field}
	case interface{ Unwrap() []error }:
		var out []string
		for _, inner := range e.Unwrap() {
			out = append(out, Fields(inner)...)
		}
		return out
	}
	return Fields(errors.Unwrap(err))
}
