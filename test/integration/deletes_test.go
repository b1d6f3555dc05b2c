package integration

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/test/integration/fixtures"
)

// TestStandaloneRefusesCollectorDeletes: standalone runs no garbage collector,
// so a delete with Orphan or Foreground propagation (whose finalizer only a
// collector removes) is refused with 400 and changes nothing, instead of
// leaving the object Terminating for ever.
func TestStandaloneRefusesCollectorDeletes(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	name := "gc-vpc" + u
	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc(name, "10.82.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	orphan := true
	for policy, opts := range map[string]metav1.DeleteOptions{
		"Orphan":           {PropagationPolicy: ptr(metav1.DeletePropagationOrphan)},
		"Foreground":       {PropagationPolicy: ptr(metav1.DeletePropagationForeground)},
		"orphanDependents": {OrphanDependents: &orphan},
	} {
		err := c.Vpcs().Delete(ctx, name, opts)
		if !apierrors.IsBadRequest(err) {
			t.Errorf("delete with %s: got %v, want 400", policy, err)
		}
		if err := c.Vpcs().DeleteCollection(ctx, opts, metav1.ListOptions{FieldSelector: "metadata.name=" + name}); !apierrors.IsBadRequest(err) {
			t.Errorf("delete collection with %s: got %v, want 400", policy, err)
		}
	}
	vpc, err := c.Vpcs().Get(ctx, name, metav1.GetOptions{})
	if err != nil || vpc.DeletionTimestamp != nil || len(vpc.Finalizers) > 0 {
		t.Fatalf("after refused deletes: %v, deletionTimestamp %v, finalizers %v; want it untouched", err, vpc.DeletionTimestamp, vpc.Finalizers)
	}
	if err := c.Vpcs().Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatalf("delete with Background: %v", err)
	}
	if _, err := c.Vpcs().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after a Background delete: got %v, want NotFound", err)
	}
}

// TestNumericQueryParameters: a numeric query parameter that is not a number
// is a 400 naming it, not strconv's bare message.
func TestNumericQueryParameters(t *testing.T) {
	ctx := testContext(t)
	for _, q := range [][2]string{{"limit", "abc"}, {"limit", "-1"}, {"timeoutSeconds", "x"}} {
		body, err := client().Discovery().RESTClient().Get().AbsPath("/apis/networking.mizar.dev/v1alpha1/vpcs").Param(q[0], q[1]).DoRaw(ctx)
		if !apierrors.IsBadRequest(err) {
			t.Errorf("?%s=%s: got %v, want 400", q[0], q[1], err)
			continue
		}
		if !strings.Contains(string(body), "query parameter "+q[0]) {
			t.Errorf("?%s=%s: answer %s does not name the parameter", q[0], q[1], body)
		}
	}
}

func ptr[T any](v T) *T { return &v }
