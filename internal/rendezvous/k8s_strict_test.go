package rendezvous

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// decodeK8sStrict decodes a multi-document manifest with Kubernetes' own Go
// types, as the API server's strict field validation would: an unknown
// field, a wrong type or an unknown kind is an error naming the document.
func decodeK8sStrict(manifest []byte) ([]any, error) {
	var out []any
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(manifest), -1) {
		if strings.TrimSpace(stripYAMLComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Service":
			obj = &corev1.Service{}
		case "batch/v1 Job":
			obj = &batchv1.Job{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		default:
			return nil, fmt.Errorf("document %d: kind %q of %q is not one this test knows", i, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

func stripYAMLComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// The manifest decodes strictly with the official types, and the strict
// decoder does catch what it must (else the first check proves nothing).
func TestK8sManifestStrict(t *testing.T) {
	manifest, err := os.ReadFile("../../deploy/k8s/nixlctl-pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeK8sStrict(manifest)
	if err != nil {
		t.Fatalf("deploy/k8s/nixlctl-pd.yaml: %v", err)
	}
	var jobs, services int
	for _, o := range objs {
		switch o := o.(type) {
		case *batchv1.Job:
			jobs++
			if len(o.Spec.Template.Spec.Containers) == 0 {
				t.Errorf("Job %s has no container", o.Name)
			}
			if o.Spec.Template.Spec.RestartPolicy == "" {
				t.Errorf("Job %s: a Job's pods need a restartPolicy (Never or OnFailure)", o.Name)
			}
		case *corev1.Service:
			services++
		}
	}
	if jobs != 2 || services != 2 {
		t.Errorf("%d Jobs and %d Services, want 2 of each", jobs, services)
	}

	for _, tc := range []struct{ name, from, to, want string }{
		{"unknown field", "completionMode: Indexed", "completionMode: Indexed\n  completionModes: Indexed", `unknown field "completionModes"`},
		{"wrong type", "completions: 2", "completions: two", "cannot unmarshal string"},
	} {
		bad := bytes.Replace(manifest, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, manifest) {
			t.Fatalf("%s: the manifest has no %q to change", tc.name, tc.from)
		}
		if _, err := decodeK8sStrict(bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: the strict decoder said %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
