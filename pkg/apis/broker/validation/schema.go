package validation

import (
	"fmt"
	"regexp"
	"sort"

	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
)

// checkSchema walks a parsed schema and says what in it cannot validate
// anything sensibly. It looks at the parsed form, not the bytes: JSON may
// spell "$ref" as "\u0024ref", and only the parse sees one key.
func checkSchema(s *spec.Schema, at string) []string {
	var bad []string
	add := func(format string, args ...any) { bad = append(bad, at+": "+fmt.Sprintf(format, args...)) }
	if s.Ref.String() != "" {
		add("$ref is not supported (schemas must be self-contained)")
	}
	if s.Pattern != "" {
		if _, err := regexp.Compile(s.Pattern); err != nil {
			add("pattern %q is not a regular expression: %v", s.Pattern, err)
		}
	}
	if s.MultipleOf != nil && *s.MultipleOf <= 0 {
		add("multipleOf must be greater than 0")
	}
	if s.Enum != nil && len(s.Enum) == 0 {
		add("enum must list at least one value")
	}
	if s.Minimum != nil && s.Maximum != nil && *s.Minimum > *s.Maximum {
		add("minimum %v is greater than maximum %v", *s.Minimum, *s.Maximum)
	}
	for _, b := range []struct {
		name     string
		min, max *int64
	}{{"Length", s.MinLength, s.MaxLength}, {"Items", s.MinItems, s.MaxItems}, {"Properties", s.MinProperties, s.MaxProperties}} {
		if b.min != nil && *b.min < 0 || b.max != nil && *b.max < 0 {
			add("min%s and max%s must not be negative", b.name, b.name)
		} else if b.min != nil && b.max != nil && *b.min > *b.max {
			add("min%s %d is greater than max%s %d", b.name, *b.min, b.name, *b.max)
		}
	}
	if s.Format != "" && !strfmt.Default.ContainsName(s.Format) {
		add("format %q is not known", s.Format)
	}
	for _, k := range sortedKeys(s.PatternProperties) {
		if _, err := regexp.Compile(k); err != nil {
			add("patternProperties key %q is not a regular expression: %v", k, err)
		}
	}
	sub := func(where string, c *spec.Schema) {
		if c != nil {
			bad = append(bad, checkSchema(c, at+where)...)
		}
	}
	if s.Items != nil {
		sub(".items", s.Items.Schema)
		for i := range s.Items.Schemas {
			sub(fmt.Sprintf(".items[%d]", i), &s.Items.Schemas[i])
		}
	}
	for name, list := range map[string][]spec.Schema{"allOf": s.AllOf, "anyOf": s.AnyOf, "oneOf": s.OneOf} {
		for i := range list {
			sub(fmt.Sprintf(".%s[%d]", name, i), &list[i])
		}
	}
	sub(".not", s.Not)
	for name, m := range map[string]map[string]spec.Schema{"properties": s.Properties, "patternProperties": s.PatternProperties, "definitions": s.Definitions} {
		for _, k := range sortedKeys(m) {
			c := m[k]
			sub(fmt.Sprintf(".%s[%q]", name, k), &c)
		}
	}
	if s.AdditionalProperties != nil {
		sub(".additionalProperties", s.AdditionalProperties.Schema)
	}
	if s.AdditionalItems != nil {
		sub(".additionalItems", s.AdditionalItems.Schema)
	}
	for _, k := range sortedKeys(s.Dependencies) {
		sub(fmt.Sprintf(".dependencies[%q]", k), s.Dependencies[k].Schema)
	}
	return bad
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
