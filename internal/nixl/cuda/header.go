package cuda

import _ "embed"

// Header is shim.h: nixlctl's declarations of the driver's types and of
// the result codes it acts on. The tests' fake driver (cudatest) is built
// against it, so that what the fake implements and what this package
// calls are declared once.
//
//go:embed shim.h
var Header string
