package bench

import (
	"io"
	"os"
)

// childStderr is where a child process's stderr goes: w when the caller
// gave one (the CLI's live view sends it to a log file, also for children
// started before the view came up), else this process's stderr, which
// the child then inherits as it is.
func childStderr(w io.Writer) io.Writer {
	if w == nil {
		return os.Stderr
	}
	return w
}
