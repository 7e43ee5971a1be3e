// Package runcoretest holds the checks the run kinds' tests share.
package runcoretest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// CheckLocalPath checks the network path of a run whose endpoints all ran
// on this host: nothing warns about the path, and each of roles has a
// verdict on the whole payload.
func CheckLocalPath(t testing.TB, np runcore.NetPath, warnings []string, payload int64, roles ...string) {
	t.Helper()
	for _, w := range warnings {
		if strings.HasPrefix(w, "net path") {
			t.Errorf("a local run warns: %s", w)
		}
	}
	for _, r := range roles {
		v, ok := np[r]
		if !ok || v.Error != "" || v.Payload != payload || payload <= 0 || v.Host == "" {
			t.Errorf("%s: verdict %+v (payload %d)", r, v, payload)
		}
	}
	if runcore.PathLine(np) == "" {
		t.Error("no path line")
	}
	t.Logf("path: %s", runcore.PathLine(np))
}

// EnumCase is one text given to an enum's UnmarshalText: Want is the value
// it must parse to, or, with WantErr set, the error must name the text and
// contain WantErr (the valid values).
type EnumCase struct {
	Dst     interface{ UnmarshalText([]byte) error }
	In      string
	Want    any
	WantErr string
}

// CheckEnumParses checks that enums parse themselves, naming the valid
// values when they cannot.
func CheckEnumParses(t testing.TB, cases []EnumCase) {
	t.Helper()
	for _, tc := range cases {
		err := tc.Dst.UnmarshalText([]byte(tc.In))
		if tc.WantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.WantErr) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.In)) {
				t.Errorf("%T %q: %v, want an error naming %s", tc.Dst, tc.In, err, tc.WantErr)
			}
			continue
		}
		got := reflect.ValueOf(tc.Dst).Elem().Interface()
		if err != nil || got != tc.Want {
			t.Errorf("%T %q: %v, %v; want %v", tc.Dst, tc.In, got, err, tc.Want)
		}
	}
}

// CheckIgnored checks an options' Ignored list: every field of want is in
// it and no field of not is; what names the case in failures.
func CheckIgnored(t testing.TB, what string, ig []runcore.IgnoredField, want, not []string) {
	t.Helper()
	var got []string
	for _, f := range ig {
		got = append(got, f.Field)
	}
	for _, f := range want {
		if !slices.Contains(got, f) {
			t.Errorf("%s: %s not ignored (%v)", what, f, got)
		}
	}
	for _, f := range not {
		if slices.Contains(got, f) {
			t.Errorf("%s: %s ignored, but it is used", what, f)
		}
	}
}

// SmallModel is llama-3.1-8b cut to four layers: real shapes, small pools.
func SmallModel(t testing.TB) kv.Model {
	t.Helper()
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	m.NumLayers = 4
	return m
}

// ChildEnv is the variable that makes a run kind's test binary serve as
// one of the child processes its runs start (the runs pass it in their
// children's environment).
const ChildEnv = "NIXLCTL_BENCH_TEST_CHILD"

// ServeChildIfAsked lets a test binary double as a run's child process:
// when ChildEnv is 1 it serves the role that role picks from the child's
// arguments (serve's: ROLE --stdio) on stdin and stdout and exits; else it
// returns and TestMain runs the tests.
func ServeChildIfAsked(role func(args []string, log *slog.Logger) (ctl.Role, error)) {
	if os.Getenv(ChildEnv) != "1" {
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	r, err := role(os.Args[1:], log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "child: %v (arguments %q)\n", err, os.Args[1:])
		os.Exit(2)
	}
	if err := ctl.ServeStdio(context.Background(), r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
