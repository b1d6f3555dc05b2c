package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
)

// TestDeepPatchRefused: merge, strategic-merge and JSON patches nested 9,000
// deep are refused with 400 naming the limit, before they are applied
// (applying one cost seconds of CPU, quadratic in its depth); a patch at the
// limit is applied as before.
func TestDeepPatchRefused(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "deep-" + rand5()
	d := s.Client.NetworkingV1alpha1().Droplets()
	if _, err := d.Create(ctx, droplet(name, "192.168.92.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// nested is an object nested depth deep under "x", with brackets inside a
	// string on the way, which must not count.
	nested := func(depth int) string {
		return strings.Repeat(`{"x":`, depth-1) + `{"s":"{[{["}` + strings.Repeat("}", depth-1)
	}
	deep := nested(9000)
	for _, c := range []struct {
		pt    types.PatchType
		patch string
	}{
		{types.MergePatchType, `{"metadata":{"annotations":{"a":"b"}},"spec":` + deep + `}`},
		{types.StrategicMergePatchType, `{"spec":` + deep + `}`},
		{types.JSONPatchType, `[{"op":"add","path":"/metadata/annotations","value":` + deep + `}]`},
	} {
		start := time.Now()
		_, err := d.Patch(ctx, name, c.pt, []byte(c.patch), metav1.PatchOptions{})
		took := time.Since(start)
		if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "more than 100 levels deep") {
			t.Errorf("%s patch nested 9,000 deep: %v (after %v), want 400 naming the limit", c.pt, err, took)
		}
		t.Logf("%s patch nested 9,000 deep (%d bytes) answered in %v", c.pt, len(c.patch), took)
	}
	// Brackets inside strings are text, not nesting.
	atLimit := `{"metadata":{"annotations":{"a":"` + strings.Repeat("{", 200) + `"}}}`
	if apiserver.MaxPatchDepth != 100 {
		t.Fatalf("MaxPatchDepth is %d; this test's messages assume 100", apiserver.MaxPatchDepth)
	}
	if _, err := d.Patch(ctx, name, types.MergePatchType, []byte(atLimit), metav1.PatchOptions{}); err != nil {
		t.Errorf("a shallow patch with brackets in a string: %v", err)
	}
}
