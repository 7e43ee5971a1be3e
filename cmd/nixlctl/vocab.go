package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// aliasAnnotation marks a flag as a deprecated spelling; its value is the
// canonical flag's name.
const aliasAnnotation = "nixlctl/alias-of"

// aliasFlag declares old as a deprecated spelling of the canonical flag,
// which must already be declared. One concept has one flag name across
// commands (docs/reports.md, "Flag names"); the old spellings keep
// working so that scripts and config files written for them do not break.
//
// The alias shares the canonical flag's Value, so a command-line alias
// writes the canonical value directly; bindLeaf then marks the
// canonical flag changed (so viper ranks it as a flag), moves an alias
// set by environment or config file onto the canonical key, and prints
// the deprecation note. pflag's MarkDeprecated is not used: cobra prints
// its note on the command's output stream, which is stdout here and must
// carry nothing but the result.
func aliasFlag(f *pflag.FlagSet, old, canonical string) {
	c := f.Lookup(canonical)
	if c == nil {
		panic("aliasFlag: no flag --" + canonical)
	}
	a := *c
	a.Name, a.Shorthand, a.Hidden = old, "", true
	a.Usage = "deprecated: use --" + canonical
	a.Annotations = map[string][]string{aliasAnnotation: {canonical}}
	f.AddFlag(&a)
}

// optionSource says where an option's value came from, in precedence order.
type optionSource int

const (
	fromDefault optionSource = iota
	fromFile
	fromEnv
	fromFlag
)

func envName(flag string) string {
	return "NIXLCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func sourceOf(v *viper.Viper, flags *pflag.FlagSet, name string) optionSource {
	switch {
	case flags.Lookup(name).Changed:
		return fromFlag
	case os.Getenv(envName(name)) != "":
		return fromEnv
	case v.InConfig(name):
		return fromFile
	}
	return fromDefault
}

// spelling is how a user wrote the option at that source.
func spelling(src optionSource, name string) string {
	switch src {
	case fromEnv:
		return envName(name)
	case fromFile:
		return "config key " + name
	}
	return "--" + name
}

// resolveAliases makes every deprecated spelling set anywhere count as its
// canonical flag, with a one-line note on stderr each. The same option
// spelled both ways at the same level (two flags, two variables, two
// keys) is ambiguous and refused; across levels the usual precedence
// decides.
func resolveAliases(v *viper.Viper, flags *pflag.FlagSet, errOut io.Writer) error {
	var err error
	flags.VisitAll(func(a *pflag.Flag) {
		canon := a.Annotations[aliasAnnotation]
		if err != nil || len(canon) == 0 {
			return
		}
		c := flags.Lookup(canon[0])
		sa, sc := sourceOf(v, flags, a.Name), sourceOf(v, flags, c.Name)
		if sa == fromDefault {
			return
		}
		if sa == sc {
			err = errkind.BadInputf("%s and %s are the same option: give one", spelling(sa, a.Name), spelling(sc, c.Name))
			return
		}
		fmt.Fprintf(errOut, "nixlctl: %s is deprecated, use %s\n", spelling(sa, a.Name), strings.TrimPrefix(spelling(sa, c.Name), "config key "))
		switch {
		case sa == fromFlag:
			c.Changed = true // the shared Value already holds the alias's value
		case sa > sc:
			v.Set(c.Name, v.Get(a.Name))
		}
	})
	return err
}

// ignoredErrors refuses each option that the chosen mode does not read
// (ignored, from the options' own rules) but the user set anyway, by
// flag, environment or config file: silently dropping it would make a
// result look as if the setting had been measured. The errors name the
// flag and the mode; the result is bad input.
func ignoredErrors(set explicitOptions, opts any, ignored []runcore.IgnoredField) error {
	var errs []error
	for _, ig := range ignored {
		if flag, ok := flagOf(reflect.TypeOf(opts), ig.Field); ok && set(flag) {
			errs = append(errs, errkind.Field(ig.Field, "%s", ig.Why))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return flagErrors(errors.Join(errs...), opts)
}
