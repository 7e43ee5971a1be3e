package main

import (
	"context"

	"github.com/spf13/cobra"
)

// runFunc is a cobra RunE.
type runFunc = func(cmd *cobra.Command, args []string) error

// explicitChecker is an options struct that refuses some values only
// when the user set them (a flag the chosen mode ignores, a 0 that reads
// as the default): the values alone cannot tell.
type explicitChecker interface {
	checkExplicit(set explicitOptions) error
}

// bindLeaf is the one way a leaf command gets its options: every flag
// bound into a fresh O (bind, aliases resolved), then O's own checks of
// what the user set, so that no command can forget them.
func bindLeaf[O any](cmd *cobra.Command) (O, explicitOptions, error) {
	var o O
	set, err := bind(cmd, &o, true)
	if err != nil {
		return o, nil, err
	}
	if c, ok := any(o).(explicitChecker); ok {
		if err := c.checkExplicit(set); err != nil {
			return o, nil, err
		}
	}
	return o, set, nil
}

// bound is the RunE of a leaf command that needs only its options.
func bound[O any](run func(ctx context.Context, o O) error) runFunc {
	return boundExplicit(func(ctx context.Context, o O, _ explicitOptions) error { return run(ctx, o) })
}

// boundExplicit is bound for a command that also asks which options the
// user set.
func boundExplicit[O any](run func(ctx context.Context, o O, set explicitOptions) error) runFunc {
	return func(cmd *cobra.Command, _ []string) error {
		o, set, err := bindLeaf[O](cmd)
		if err != nil {
			return err
		}
		return run(cmd.Context(), o, set)
	}
}

// boundArgs is bound for a command that takes positional arguments
// (checked by its Args).
func boundArgs[O any](run func(ctx context.Context, args []string, o O) error) runFunc {
	return func(cmd *cobra.Command, args []string) error {
		o, _, err := bindLeaf[O](cmd)
		if err != nil {
			return err
		}
		return run(cmd.Context(), args, o)
	}
}
