package cuda

import "os"

// LoadAsCommand loads the driver the way a non-test binary would (the
// fake must be refused); only meaningful in a fresh process.
func LoadAsCommand() error { return open(os.Getenv, false).err }
