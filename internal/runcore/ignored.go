package runcore

// IgnoredField is an option that the chosen protocol or mode does not
// read: Field is its Go field path in the options (as errkind.FieldError
// names it), Why the mode that ignores it.
type IgnoredField struct {
	Field, Why string
}
