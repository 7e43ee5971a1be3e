// Command nixlctl benchmarks and diagnoses KV-cache transfers in
// disaggregated LLM serving. This package is only the command-line shell:
// it parses flags, environment and config file into one options struct per
// command, calls that command's run function, and maps the error it
// returns to an exit code in one place (exitCode).
package main

import "os"

func main() { os.Exit(Main()) }
