package rendezvous

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/launcher"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestDecodeHello(t *testing.T) {
	good := Hello{V: 1, Run: "job-42", Role: "prefill", Rank: 0, World: 2, Host: "node-a", Ctl: "10.0.0.1:7400"}
	for _, tc := range []struct {
		name, line string
		want       Hello
		err        string // a substring of the error; "" for none
	}{
		{"tcp address", `{"v":1,"run":"job-42","role":"prefill","rank":0,"world":2,"host":"node-a","ctl":"10.0.0.1:7400"}`, good, ""},
		{"newline and spaces", " {\"v\":1,\"run\":\"job-42\",\"role\":\"prefill\",\"rank\":0,\"world\":2,\"host\":\"node-a\",\"ctl\":\"10.0.0.1:7400\"} \r\n", good, ""},
		{"reverse, empty run", `{"v":1,"run":"","role":"decode","rank":1,"world":2,"host":"b","ctl":"reverse"}`,
			Hello{V: 1, Role: "decode", Rank: 1, World: 2, Host: "b", Ctl: Reverse}, ""},
		{"unspecified host", `{"v":1,"run":"r","role":"decode","rank":1,"world":2,"host":"b","ctl":"[::]:7400"}`,
			Hello{V: 1, Run: "r", Role: "decode", Rank: 1, World: 2, Host: "b", Ctl: "[::]:7400"}, ""},
		{"empty", ``, Hello{}, "not a JSON object"},
		{"not json", `hello driver`, Hello{}, "not a JSON object"},
		{"array", `[1,2]`, Hello{}, "not a JSON object"},
		{"null", `null`, Hello{}, `no "v"`},
		{"truncated", `{"v":1,"run":"r","role":"prefill"`, Hello{}, "not a JSON object"},
		{"two objects", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"reverse"}{}`, Hello{}, "data after"},
		{"typo in a field", `{"v":1,"run":"r","role":"prefill","rnk":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "unknown field"},
		{"missing rank", `{"v":1,"run":"r","role":"prefill","world":1,"host":"a","ctl":"reverse"}`, Hello{}, `no "rank"`},
		{"rank as string", `{"v":1,"run":"r","role":"prefill","rank":"0","world":1,"host":"a","ctl":"reverse"}`, Hello{}, "not a JSON object"},
		{"fractional rank", `{"v":1,"run":"r","role":"prefill","rank":0.5,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "not a JSON object"},
		{"version 2", `{"v":2,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "version 2"},
		{"rank past world", `{"v":1,"run":"r","role":"prefill","rank":2,"world":2,"host":"a","ctl":"reverse"}`, Hello{}, "outside world size"},
		{"negative rank", `{"v":1,"run":"r","role":"prefill","rank":-1,"world":2,"host":"a","ctl":"reverse"}`, Hello{}, "outside world size"},
		{"zero world", `{"v":1,"run":"r","role":"prefill","rank":0,"world":0,"host":"a","ctl":"reverse"}`, Hello{}, "at least one"},
		{"upper-case role", `{"v":1,"run":"r","role":"Prefill","rank":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "role"},
		{"role with a slash", `{"v":1,"run":"r","role":"a/b","rank":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "role"},
		{"run with a slash", `{"v":1,"run":"a/b","role":"prefill","rank":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "run id"},
		{"run with a space", `{"v":1,"run":"a b","role":"prefill","rank":0,"world":1,"host":"a","ctl":"reverse"}`, Hello{}, "run id"},
		{"no host", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"","ctl":"reverse"}`, Hello{}, "host"},
		{"host with a newline", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a\nb","ctl":"reverse"}`, Hello{}, "host"},
		{"ctl without port", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"10.0.0.1"}`, Hello{}, "neither"},
		{"ctl port zero", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"10.0.0.1:0"}`, Hello{}, "no port"},
		{"ctl port name", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"h:http"}`, Hello{}, "no port"},
		{"ctl url", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"a","ctl":"tcp://h:1"}`, Hello{}, "neither"},
		{"too long", `{"v":1,"run":"r","role":"prefill","rank":0,"world":1,"host":"` + strings.Repeat("a", MaxHello) + `","ctl":"reverse"}`, Hello{}, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeHello([]byte(tc.line))
			testkit.WantResult(t, got, err, tc.want, tc.err)
		})
	}
}

// FuzzHello: DecodeHello never panics, and what it accepts encodes back
// to a line that decodes to the same hello.
func FuzzHello(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"run":"job-42","role":"prefill","rank":0,"world":2,"host":"node-a","ctl":"10.0.0.1:7400"}`,
		`{"v":1,"run":"","role":"decode","rank":1,"world":2,"host":"b","ctl":"reverse"}`,
		`{"v":1,"run":"r","role":"decode","rank":1,"world":2,"host":"b","ctl":"[::]:7400"}`,
		`{"v":1}`, `null`, `[]`, "{\"v\":1}\n{}", `{"rank":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		h, err := DecodeHello(line)
		if err != nil {
			return
		}
		b, err := h.Encode()
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", line, err)
		}
		back, err := DecodeHello(b)
		if err != nil {
			t.Fatalf("encoded %q does not decode: %v", b, err)
		}
		if back != h {
			t.Fatalf("round trip: %+v became %+v", h, back)
		}
	})
}

func TestFromLauncher(t *testing.T) {
	host, _ := os.Hostname()
	env := map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "777"}
	info, err := launcher.Detect(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, launcher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := FromLauncher(info, "", "decode", "0.0.0.0:7400")
	if err != nil {
		t.Fatal(err)
	}
	want := Hello{V: 1, Run: "777", Role: "decode", Rank: 1, World: 2, Host: host, Ctl: "0.0.0.0:7400"}
	if d := cmp.Diff(want, h); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	h, err = FromLauncher(info, "mine", "decode", Reverse)
	if err != nil || h.Run != "mine" {
		t.Fatalf("an explicit run id: %+v %v", h, err)
	}
	if _, err := FromLauncher(info, "", "Decode", Reverse); err == nil {
		t.Fatal("a bad role was accepted")
	}
}

func TestRosterAndErrors(t *testing.T) {
	r := PrefillDecode("x", 2, 2)
	want := []Slot{{"decode", 2}, {"decode", 3}, {"prefill", 0}, {"prefill", 1}}
	if d := cmp.Diff(want, r.Slots()); d != "" {
		t.Fatalf("slots -want +got\n%s", d)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Roster{
		{Run: "x"},
		{Run: "x", Ranks: map[string][]int{"prefill": {0}, "decode": {0}}},
		{Run: "x", Ranks: map[string][]int{"prefill": {-1}}},
		{Run: "x/y", Ranks: map[string][]int{"prefill": {0}}},
		{Run: "x", Ranks: map[string][]int{"Prefill": {0}}},
	} {
		if bad.Validate() == nil {
			t.Errorf("roster %+v accepted", bad)
		}
	}
	e := &IncompleteError{Waited: 1500e6, Missing: []Slot{{"decode", 1}, {"decode", 3}, {"prefill", 0}},
		Gone:     []Departure{{Slot{"decode", 2}, "node-b", "connection closed"}},
		Rejected: map[string]int{RejectDuplicate: 1, RejectGarbage: 2}}
	const msg = "rendezvous: roster incomplete after 1.5s: missing decode ranks 1,3, prefill rank 0; " +
		"gone: decode rank 2 (host node-b: connection closed); rejected 3 hello(s) (duplicate 1, garbage 2)"
	if e.Error() != msg {
		t.Fatalf("got  %s\nwant %s", e.Error(), msg)
	}
}

func TestParseRoster(t *testing.T) {
	for _, tc := range []struct {
		spec, want string // want: the String of the result, or "error"
	}{
		{"prefill=0,decode=1", "decode=1,prefill=0"},
		{"prefill=0-3,decode=4-7", "decode=4-7,prefill=0-3"},
		{" decode=1, decode=3 ,prefill=0", "decode=1,decode=3,prefill=0"},
		{"prefill=0,decode=0", "error"}, // a rank is one member's
		{"prefill=0,prefill=0", "error"},
		{"prefill", "error"},
		{"prefill=", "error"},
		{"prefill=3-1", "error"},
		{"prefill=-1", "error"},
		{"prefill=a", "error"},
		{"Prefill=0", "error"},
		{"prefill=0-99999999", "error"},
		{"", "error"},
	} {
		r, err := ParseRoster("run", tc.spec)
		got := "error"
		if err == nil {
			got = r.String()
		}
		if got != tc.want {
			t.Errorf("ParseRoster(%q) = %q (%v), want %q", tc.spec, got, err, tc.want)
		}
	}
	if PrefillDecode("r", 1, 1).String() != "decode=1,prefill=0" {
		t.Error(PrefillDecode("r", 1, 1).String())
	}
}
