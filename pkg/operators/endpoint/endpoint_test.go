package endpoint

import "testing"

func TestApplied(t *testing.T) {
	for _, c := range []struct {
		watermark, rv string
		want          bool
	}{
		{"10", "9", true},
		{"10", "10", true},
		{"9", "10", false},
		{"100", "99", true}, // numeric, not lexical
		{"99", "100", false},
		{"", "1", false}, // never acknowledged
		{"x", "1", false},
		{"5", "", false},
	} {
		if got := Applied(c.watermark, c.rv); got != c.want {
			t.Errorf("Applied(%q, %q) = %v, want %v", c.watermark, c.rv, got, c.want)
		}
	}
}
