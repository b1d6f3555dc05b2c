package v1alpha1

import (
	"maps"
	"testing"
)

func TestRecordDeparture(t *testing.T) {
	const k = EndpointDepartedFromAnnotation
	for _, c := range []struct {
		name     string
		was, now map[string]string
		from     string
		want     map[string]string
	}{
		{"no move, nothing recorded", nil, map[string]string{"a": "1"}, "", map[string]string{"a": "1"}},
		{"a move is recorded", nil, nil, "d1", map[string]string{k: "d1"}},
		{"a second move adds", map[string]string{k: "d1"}, map[string]string{k: "d1"}, "d2", map[string]string{k: "d1,d2"}},
		{"the same droplet once", map[string]string{k: "d1,d2"}, nil, "d1", map[string]string{k: "d1,d2"}},
		{"dropped by a client: kept", map[string]string{k: "d1"}, map[string]string{"a": "1"}, "", map[string]string{k: "d1", "a": "1"}},
		{"forged by a client: ignored", map[string]string{k: "d1"}, map[string]string{k: "evil"}, "", map[string]string{k: "d1"}},
		{"forged on a fresh object: ignored", nil, map[string]string{k: "evil"}, "", map[string]string{}},
		{"cleared with an empty value", map[string]string{k: "d1"}, map[string]string{k: ""}, "", map[string]string{}},
		{"cleared and moved in one update", map[string]string{k: "d1"}, map[string]string{k: ""}, "d3", map[string]string{k: "d3"}},
	} {
		before := maps.Clone(c.now)
		got := RecordDeparture(c.was, c.now, c.from)
		if len(got) != len(c.want) || !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		if !maps.Equal(before, c.now) {
			t.Errorf("%s: the update's own map changed to %v", c.name, c.now)
		}
	}
}
