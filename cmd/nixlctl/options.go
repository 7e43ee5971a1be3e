package main

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// decodeHook turns the strings viper resolves (flag, environment, file)
// into option fields: durations and comma-separated lists as viper does
// by default, then any type that parses itself (encoding.TextUnmarshaler:
// the engine's and bench's enums), then the few types whose package
// offers only a Parse function; last, strictHook for what is left (bind
// turns mapstructure's weak typing off).
func decodeHook() mapstructure.DecodeHookFunc {
	return mapstructure.ComposeDecodeHookFunc(
		mapstructure.StringToTimeDurationHookFunc(),
		weakSliceHook(","),
		mapstructure.TextUnmarshallerHookFunc(),
		parseHook(map[reflect.Type]func(string) (any, error){
			reflect.TypeFor[nixl.MemType](): func(s string) (any, error) { return nixl.ParseMemType(s) },
			reflect.TypeFor[nixl.Op]():      func(s string) (any, error) { return nixl.ParseOp(s) },
			reflect.TypeFor[kv.Grid]():      func(s string) (any, error) { return kv.ParseGrid(s) },
		}),
		strictHook(),
	)
}

// weakSliceHook is viper's default for lists (which a custom hook
// replaces): "a,b" is two items and "" none. An empty item ("a,,b",
// "a,b,") is refused: a stray comma, never an item meant.
func weakSliceHook(sep string) mapstructure.DecodeHookFuncType {
	return func(f, t reflect.Type, data any) (any, error) {
		if f.Kind() != reflect.String || t.Kind() != reflect.Slice {
			return data, nil
		}
		s := reflect.ValueOf(data).String()
		if s == "" {
			return []string{}, nil
		}
		items := strings.Split(s, sep)
		if slices.ContainsFunc(items, func(it string) bool { return strings.TrimSpace(it) == "" }) {
			return nil, fmt.Errorf("%q: %w", s, errEmptyItem)
		}
		return items, nil
	}
}

// errEmptyItem is every list's error for "1,2," or "1,,2".
var errEmptyItem = errors.New("an empty item in the list (a stray comma?)")

func parseHook(parsers map[reflect.Type]func(string) (any, error)) mapstructure.DecodeHookFuncType {
	return func(f, t reflect.Type, data any) (any, error) {
		parse, ok := parsers[t]
		if !ok || f.Kind() != reflect.String {
			return data, nil
		}
		return parse(reflect.ValueOf(data).String())
	}
}

// decodeErrors names the flag of each field that did not decode (the
// field's key is the flag's name), one error per field.
func decodeErrors(err error) error {
	var out []error
	for _, e := range leafErrors(err) {
		var de *mapstructure.DecodeError
		if errors.As(e, &de) {
			name, _, _ := strings.Cut(de.Name(), "[") // a list's element: the flag is the list's
			out = append(out, fmt.Errorf("--%s: %w", name, de.Unwrap()))
			continue
		}
		out = append(out, fmt.Errorf("options: %w", e))
	}
	return errors.Join(out...)
}

// leafErrors flattens joined errors, looking through wrappers around a
// join (mapstructure's "decoding failed" and errkind's marks).
func leafErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leafErrors(e)...)
		}
		return out
	}
	if u := errors.Unwrap(err); u != nil {
		if _, isJoin := u.(interface{ Unwrap() []error }); isJoin {
			return leafErrors(u)
		}
	}
	return []error{err}
}

// flagErrors rewrites an options struct's validation errors for the
// command line: a field's error (errkind.FieldError) names the field's
// flag, found from the mapstructure tags of opts, so no table maps fields
// to flags. Other errors pass unchanged; the result is bad input.
func flagErrors(err error, opts any) error {
	if err == nil {
		return nil
	}
	var out []error
	for _, e := range leafErrors(err) {
		var fe errkind.FieldError
		if errors.As(e, &fe) {
			if flag, ok := flagOf(reflect.TypeOf(opts), fe.Field); ok {
				e = fmt.Errorf("--%s: %w", flag, fe.Err)
			}
		}
		out = append(out, e)
	}
	return errkind.BadInput(errors.Join(out...))
}

// flagOf follows a field path ("ISL.Fixed") through t and returns the
// last field's mapstructure name; squashed structs are looked through,
// and a field without a name ("-") has no flag.
func flagOf(t reflect.Type, path string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return "", false
	}
	head, rest, nested := strings.Cut(path, ".")
	f, ok := t.FieldByName(head)
	if !ok {
		return "", false
	}
	if nested {
		return flagOf(f.Type, rest)
	}
	name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	if name == "" || name == "-" {
		return "", false
	}
	return name, true
}

// knobFlags declares a flag for each engine knob (engine.Knobs): its name
// is the field's mapstructure tag, its help the help tag, its default the
// field's value in d. A knob is declared once, in the engine package.
func knobFlags(f *pflag.FlagSet, d engine.Knobs) {
	v := reflect.ValueOf(d)
	for i, field := range reflect.VisibleFields(v.Type()) {
		name, help := field.Tag.Get("mapstructure"), field.Tag.Get("help")
		switch x := v.Field(i).Interface().(type) {
		case runcore.Duration:
			f.Duration(name, time.Duration(x), help)
		case int:
			f.Int(name, x, help)
		case string:
			f.String(name, x, help)
		case fmt.Stringer:
			f.String(name, x.String(), help)
		default: // parsed by the decode hook, as a text flag
			f.String(name, fmt.Sprint(x), help)
		}
	}
}
