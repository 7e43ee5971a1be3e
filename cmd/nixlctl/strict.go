package main

import (
	"encoding"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nixlctl/nixlctl/internal/errkind"
)

// strictHook makes an option's value from a config file or the
// environment mean what it says, or fail. Options are decoded without
// mapstructure's weak typing, which truncated `requests: 4.7` to 4, read
// `requests: true` as 1, `inproc: 2` as true, `join-window: 60` as 60 ns
// and wrapped `seed: -1`; and integers in strings parse in base 10, not
// as Go literals ("010" was 8). It converts only what is unambiguous:
// a string to the field's scalar type, a whole number to an integer, a
// number or a bool to a string field's text, and a scalar to a list of
// one.
func strictHook() func(f, t reflect.Type, data any) (any, error) {
	return func(f, t reflect.Type, data any) (any, error) {
		if items, ok := data.([]string); ok && slices.ContainsFunc(items, func(it string) bool { return strings.TrimSpace(it) == "" }) {
			// A list flag's "a,b," (pflag's string slices split before
			// weakSliceHook sees them).
			return nil, fmt.Errorf("%q: %w", strings.Join(items, ","), errEmptyItem)
		}
		if data == nil || f == t {
			return data, nil
		}
		v := reflect.ValueOf(data)
		fk := f.Kind()
		numeric := isInt(fk) || isUint(fk) || isFloat(fk)
		switch {
		case isDurationType(t):
			if f == reflect.PointerTo(t) {
				// Parsed by its own UnmarshalText (runcore.Duration, as
				// engine.Knobs has them), which wants a unit too.
				return v.Elem().Interface(), nil
			}
			if fk != reflect.String {
				return nil, fmt.Errorf("%v: a duration needs a unit (e.g. %vs or %vms)", data, data, data)
			}
			return data, nil
		case reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()):
			if numeric || fk == reflect.Bool {
				return nil, fmt.Errorf("%v: want a name, not a %s", data, kindWord(fk))
			}
			return data, nil
		}
		switch k := t.Kind(); {
		case isInt(k), isUint(k):
			if n, ok, err := wholeNumber(data, fk, t, isInt(k)); ok {
				return n, err
			}
		case isFloat(k):
			switch {
			case fk == reflect.String:
				x, err := strconv.ParseFloat(strings.TrimSpace(v.String()), t.Bits())
				if err != nil {
					return nil, fmt.Errorf("%q: want a number", v.String())
				}
				return x, nil
			case fk == reflect.Bool:
				return nil, fmt.Errorf("%v: want a number, not a bool", data)
			}
		case k == reflect.Bool:
			switch {
			case fk == reflect.String:
				b, err := strconv.ParseBool(strings.TrimSpace(v.String()))
				if err != nil {
					return nil, fmt.Errorf("%q: want true or false", v.String())
				}
				return b, nil
			case numeric:
				return nil, fmt.Errorf("%v: want true or false, not a number", data)
			}
		case k == reflect.String:
			switch {
			case isInt(fk):
				return strconv.FormatInt(v.Int(), 10), nil
			case isUint(fk):
				return strconv.FormatUint(v.Uint(), 10), nil
			case isFloat(fk):
				return strconv.FormatFloat(v.Float(), 'f', -1, 64), nil
			case fk == reflect.Bool:
				return strconv.FormatBool(v.Bool()), nil
			}
		case k == reflect.Slice:
			if numeric || fk == reflect.Bool {
				return []any{data}, nil
			}
		}
		return data, nil
	}
}

// wholeNumber converts data for an integer option (signed) or an
// unsigned one, which differ only in their range and words; ok is false
// where neither has a rule for data's kind.
func wholeNumber(data any, fk reflect.Kind, t reflect.Type, signed bool) (n any, ok bool, err error) {
	v := reflect.ValueOf(data)
	want, lo, hi := "a whole number from 0", 0.0, float64(math.MaxUint64/2)
	parse := func(s string) (any, error) { return strconv.ParseUint(s, 10, t.Bits()) }
	if signed {
		want, lo, hi = "a whole number", -math.MaxInt64/2, math.MaxInt64/2
		parse = func(s string) (any, error) { return strconv.ParseInt(s, 10, t.Bits()) }
	}
	switch {
	case fk == reflect.String:
		n, err := parse(strings.TrimSpace(v.String()))
		if err != nil {
			return nil, true, fmt.Errorf("%q: want %s in base 10", v.String(), want)
		}
		return n, true, nil
	case !signed && isInt(fk) && v.Int() < 0:
		return nil, true, fmt.Errorf("%v: cannot be negative", data)
	case isFloat(fk):
		x := v.Float()
		if x != math.Trunc(x) || x < lo || x > hi {
			return nil, true, fmt.Errorf("%v: want %s", data, want)
		}
		if signed {
			return int64(x), true, nil
		}
		return uint64(x), true, nil
	case fk == reflect.Bool:
		return nil, true, fmt.Errorf("%v: want a whole number, not a bool", data)
	}
	return nil, false, nil
}

func isDurationType(t reflect.Type) bool {
	return t == reflect.TypeFor[time.Duration]() || (t.Kind() == reflect.Int64 && t.Name() == "Duration")
}

func isInt(k reflect.Kind) bool  { return k >= reflect.Int && k <= reflect.Int64 }
func isUint(k reflect.Kind) bool { return k >= reflect.Uint && k <= reflect.Uintptr }
func isFloat(k reflect.Kind) bool {
	return k == reflect.Float32 || k == reflect.Float64
}

func kindWord(k reflect.Kind) string {
	if k == reflect.Bool {
		return "bool"
	}
	return "number"
}

// decimalFlags makes every integer flag of root and its subcommands parse
// in base 10: pflag reads "020" as the Go literal 16 and "0x10" as 16,
// which nobody typing --block-size 020 means.
func decimalFlags(root *cobra.Command) {
	var walk func(c *cobra.Command)
	wrap := func(f *pflag.Flag) {
		switch f.Value.Type() {
		case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64",
			"intSlice", "int32Slice", "int64Slice", "uintSlice":
			if _, done := f.Value.(decimalValue); !done {
				f.Value = decimalValue{f.Value}
			}
		}
	}
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(wrap)
		c.PersistentFlags().VisitAll(wrap)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// decimalValue checks each comma-separated item is a base-10 integer and
// hands the wrapped value the items without leading zeros.
type decimalValue struct{ pflag.Value }

func (d decimalValue) Set(s string) error {
	items := []string{s}
	if strings.HasSuffix(d.Type(), "Slice") {
		items = strings.Split(s, ",")
	}
	for i, item := range items {
		item = strings.TrimSpace(item)
		n, ok := new(big.Int).SetString(item, 10)
		if !ok {
			return fmt.Errorf("%q is not a whole number in base 10", item)
		}
		items[i] = n.String()
	}
	return d.Value.Set(strings.Join(items, ","))
}

// refuseUnknownSubcommands gives every command that only groups others
// (bench, probe, serve, report, kv) a RunE that refuses an argument:
// cobra checks a subcommand's name only at the root, so `nixlctl bench
// frobnicate` printed the help on stdout and exited 0. Without
// arguments such a command still prints its help.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
		if !c.HasSubCommands() || c.Runnable() {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return errkind.BadInputf("unknown command %q for %q", args[0], cmd.CommandPath())
		}
	}
}
