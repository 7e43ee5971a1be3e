package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
)

// strictHook converts only what is unambiguous: each case is a value as
// YAML, JSON or the environment gives it, and the field type it meets.
func TestStrictHook(t *testing.T) {
	type target struct {
		Int   int           `mapstructure:"int"`
		Uint  uint64        `mapstructure:"uint"`
		Float float64       `mapstructure:"float"`
		Bool  bool          `mapstructure:"bool"`
		Str   string        `mapstructure:"str"`
		Dur   time.Duration `mapstructure:"dur"`
		List  []string      `mapstructure:"list"`
	}
	tests := []struct {
		key  string
		in   any
		want any    // the field's value, when err is ""
		err  string // part of the error
	}{
		{"int", 4, 4, ""},
		{"int", 4.0, 4, ""}, // JSON's numbers are floats
		{"int", "010", 10, ""},
		{"int", 4.7, nil, "want a whole number"},
		{"int", true, nil, "not a bool"},
		{"int", "0x10", nil, "base 10"},
		{"uint", -1, nil, "cannot be negative"},
		{"uint", "7", uint64(7), ""},
		{"float", 2, 2.0, ""},
		{"float", "0.5", 0.5, ""},
		{"float", false, nil, "not a bool"},
		{"bool", "true", true, ""},
		{"bool", 2, nil, "want true or false"},
		{"bool", "2", nil, "want true or false"},
		{"str", 4096, "4096", ""},
		{"str", 1e6, "1000000", ""},
		{"dur", "60s", time.Minute, ""},
		{"dur", 60, nil, "a duration needs a unit"},
		{"list", "a,b", []string{"a", "b"}, ""},
		{"list", 4096, []string{"4096"}, ""},
		{"list", "a,b,", nil, "empty item"},
	}
	for _, tc := range tests {
		var got target
		err := decodeForTest(map[string]any{tc.key: tc.in}, &got)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %#v: error %v, want one containing %q", tc.key, tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %#v: %v", tc.key, tc.in, err)
			continue
		}
		f := reflect.ValueOf(got).FieldByNameFunc(func(n string) bool { return strings.EqualFold(n, tc.key) })
		if !reflect.DeepEqual(f.Interface(), reflect.ValueOf(tc.want).Convert(f.Type()).Interface()) {
			t.Errorf("%s: %#v decoded to %#v, want %#v", tc.key, tc.in, f.Interface(), tc.want)
		}
	}
}

// Integer flags read base 10: pflag alone reads 020 as 16 and 0x10 as 16.
func TestDecimalFlags(t *testing.T) {
	tests := []struct {
		typ, in, want string
		ok            bool
	}{
		{"int", "020", "20", true},
		{"int", "-7", "-7", true},
		{"int", "0x10", "", false},
		{"int", "1e3", "", false},
		{"uint64", "010", "10", true},
		{"uint64", "-1", "", false},
		{"intSlice", "01,020", "[1,20]", true},
		{"intSlice", "1,0x2", "", false},
	}
	for _, tc := range tests {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		switch tc.typ {
		case "int":
			fs.Int("n", 0, "")
		case "uint64":
			fs.Uint64("n", 0, "")
		case "intSlice":
			fs.IntSlice("n", nil, "")
		}
		f := fs.Lookup("n")
		f.Value = decimalValue{f.Value}
		err := fs.Set("n", tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%s %q: error %v, want ok %v", tc.typ, tc.in, err, tc.ok)
			continue
		}
		if tc.ok && f.Value.String() != tc.want {
			t.Errorf("%s %q = %s, want %s", tc.typ, tc.in, f.Value.String(), tc.want)
		}
	}
}

// decodeForTest decodes as bind does (viper.Unmarshal with decodeHook,
// weak typing off).
func decodeForTest(in map[string]any, out any) error {
	d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{DecodeHook: decodeHook(), Result: out})
	if err != nil {
		return err
	}
	return d.Decode(in)
}

// `--tui off` failed "unknown command \"off\"": pflag takes a flag that may
// stand alone only as --tui=off.
func TestJoinOptionalValues(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"bench", "pull", "--tui", "off", "--requests", "2"}, []string{"bench", "pull", "--tui=off", "--requests", "2"}},
		{[]string{"bench", "pull", "--tui", "--requests", "2"}, []string{"bench", "pull", "--tui", "--requests", "2"}},
		{[]string{"bench", "pull", "--tui"}, []string{"bench", "pull", "--tui"}},
		{[]string{"bench", "pull", "--tui=auto"}, []string{"bench", "pull", "--tui=auto"}},
		{[]string{"x", "--", "--tui", "on"}, []string{"x", "--", "--tui", "on"}},
	} {
		if got := joinOptionalValues(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%q -> %q, want %q", tc.in, got, tc.want)
		}
	}
}
