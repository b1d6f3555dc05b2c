package netpol_test

import (
	"fmt"
	"testing"
	"time"

	. "mizar.dev/pkg/netpol"
	. "mizar.dev/pkg/netpol/netpoltest"
)

// BenchmarkCompile: the agent's whole recompile after a change, at 10,000
// pods, by number of policies.
func BenchmarkCompile(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods-10000/policies-%d", n), func(b *testing.B) {
			in := Scale(10000, n)
			c := NewCompiler()
			var comp *Compiled
			for b.Loop() {
				var err error
				if comp, err = c.Compile(in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(comp.Rules)), "rules")
			b.ReportMetric(float64(len(comp.Endpoints)), "endpoints")
		})
	}
}

// TestCompileScale bounds the recompile at 10,000 pods and 100 policies:
// the agent has 1 s from an API write to every node's maps.
func TestCompileScale(t *testing.T) {
	in := Scale(10000, 100)
	start := time.Now()
	comp, err := NewCompiler().Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("10,000 pods, 100 policies: %d rules, %d endpoints compiled in %v", len(comp.Rules), len(comp.Endpoints), took)
	if took > 2*time.Second {
		t.Fatalf("compile took %v", took)
	}
}
