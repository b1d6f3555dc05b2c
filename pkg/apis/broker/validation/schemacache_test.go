package validation

import (
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"

	"mizar.dev/pkg/apis/broker"
)

func plan(schema string) *broker.ServicePlan {
	return &broker.ServicePlan{Name: "small", ParametersSchema: &runtime.RawExtension{Raw: []byte(schema)}}
}

func params(s string) *runtime.RawExtension { return &runtime.RawExtension{Raw: []byte(s)} }

// A plan's schema is parsed once, and a changed schema is never checked by the
// validator of the old one.
func TestSchemaValidatorsFollowTheSchemaBytes(t *testing.T) {
	path := field.NewPath("spec", "parameters")
	loose := `{"type":"object","properties":{"size":{"type":"integer","maximum":10}}}`
	strict := `{"type":"object","properties":{"size":{"type":"integer","maximum":3}}}`
	a, err := schemaValidators.get(plan(loose).ParametersSchema)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := schemaValidators.get(plan(loose).ParametersSchema); b != a {
		t.Error("the same schema was parsed twice")
	}
	if errs := ValidateParameters(plan(loose), params(`{"size":5}`), path); len(errs) != 0 {
		t.Fatalf("size 5 under maximum 10: %v", errs)
	}
	if errs := ValidateParameters(plan(strict), params(`{"size":5}`), path); len(errs) != 1 || errs[0].Field != "spec.parameters.size" {
		t.Fatalf("size 5 under maximum 3: %v; want one error at spec.parameters.size", errs)
	}
	// A class stored before a rule existed refuses its orders (422), it does not serve them.
	if errs := ValidateParameters(plan(`{"type":"array"}`), params(`{}`), path); len(errs) != 1 || errs[0].Type != field.ErrorTypeInvalid {
		t.Fatalf("an unusable schema: %v; want one invalid-value error", errs)
	}
	if errs := ValidateParameters(plan(`{"type":"object","properties":{"a":{"\u0024ref":"#/x"}}}`), params(`{"a":1}`), path); len(errs) != 1 || errs[0].Type != field.ErrorTypeInvalid {
		t.Fatalf("a stored schema with an escaped $ref: %v; want one invalid-value error, no panic", errs)
	}
}

// One validator serves concurrent orders (run with -race).
func TestSchemaValidatorConcurrent(t *testing.T) {
	p := plan(`{"type":"object","required":["name"],"properties":{"name":{"type":"string","maxLength":4},"size":{"type":"integer","minimum":1}}}`)
	path := field.NewPath("spec", "parameters")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				good, bad := ValidateParameters(p, params(`{"name":"ab","size":2}`), path), ValidateParameters(p, params(`{"name":"abcdef","size":0}`), path)
				if len(good) != 0 || len(bad) != 2 {
					t.Errorf("worker %d: good %v, bad %v", i, good, bad)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestSchemaCacheIsBounded(t *testing.T) {
	c := &schemaCache{byRaw: map[string]*validate.SchemaValidator{}}
	for i := range maxCachedSchemas + 5 {
		raw := params(fmt.Sprintf(`{"type":"object","title":"schema %d"}`, i))
		if _, err := c.get(raw); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.byRaw) > maxCachedSchemas {
		t.Fatalf("%d schemas kept; at most %d", len(c.byRaw), maxCachedSchemas)
	}
}

// BenchmarkValidateParameters compares checking an order against the mysql
// plan's schema parsed for each order (as before the cache) with the cache.
func BenchmarkValidateParameters(b *testing.B) {
	p := plan(`{"$schema":"http://json-schema.org/draft-04/schema#","type":"object","additionalProperties":false,` +
		`"properties":{"database":{"type":"string","description":"Name of the database created for the application.","pattern":"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$"},` +
		`"characterSet":{"type":"string","enum":["utf8mb4","latin1"]},"maxConnections":{"type":"integer","minimum":10,"maximum":5000}}}`)
	in := params(`{"database":"app","characterSet":"utf8mb4","maxConnections":100}`)
	path := field.NewPath("spec", "parameters")
	b.Run("parsed-each-time", func(b *testing.B) {
		for b.Loop() {
			s, err := ParseSchema(p.ParametersSchema)
			if err != nil {
				b.Fatal(err)
			}
			data, _ := decodeParameters(in)
			if res := validate.NewSchemaValidator(s, nil, "", strfmt.Default).Validate(data); len(res.Errors) != 0 {
				b.Fatal(res.Errors)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if errs := ValidateParameters(p, in, path); len(errs) != 0 {
				b.Fatal(errs)
			}
		}
	})
}
