package osb

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Any id the spec allows names an order and a binding: GUIDs of every
// leading character and case, the other unreserved characters, and bytes a
// platform percent-encodes. Lower-case label ids keep their name.
func TestObjectNameTakesAnyID(t *testing.T) {
	ids := []string{"a", "A", "0", "~", "_x_", "a.b", "ABC-def", strings.Repeat("a", 52), strings.Repeat("a", 53), "a/b", "ä", "a b", "%41"}
	for c := range "0123456789abcdefABCDEF" {
		g := fmt.Sprintf("%c%07x-%04x-4%03x-8%03x-%012x", "0123456789abcdefABCDEF"[c], rand.Uint32()>>4, rand.Uint32()>>16, rand.Uint32()>>20, rand.Uint32()>>20, rand.Uint64()>>16)
		ids = append(ids, g, strings.ToUpper(g), "{"+g+"}")
	}
	names := map[string]string{}
	for _, id := range ids {
		n := ObjectName(id)
		if msgs := apimachineryvalidation.NameIsDNSLabel(n, false); len(msgs) > 0 || len(n) > 52 {
			t.Errorf("id %q: name %q is not a DNS label of at most 52: %v", id, n, msgs)
		}
		if prev, ok := names[n]; ok {
			t.Errorf("ids %q and %q share the name %q", prev, id, n)
		}
		names[n] = id
		if ObjectName(id) != n {
			t.Errorf("id %q: name not stable", id)
		}
		verbatim := len(id) <= 52 && strings.ToLower(id) == id && len(apimachineryvalidation.NameIsDNSLabel(id, false)) == 0
		if verbatim != (n == id) {
			t.Errorf("id %q: name %q (verbatim %v)", id, n, verbatim)
		}
		m := &metav1.ObjectMeta{Name: n, Annotations: map[string]string{AnnotationID: id}}
		if !isFor(m, id) || isFor(m, id+"x") {
			t.Errorf("id %q: isFor wrong", id)
		}
	}
}
