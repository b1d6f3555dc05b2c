package validation

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

// maxCachedSchemas bounds the validators kept: a catalog has a handful of plans,
// and a schema is at most MaxSchemaBytes.
const maxCachedSchemas = 256

// schemaValidators keeps a validator per plan schema, so an order is checked
// without parsing its plan's schema again (that parse was most of the
// validation's cost on every ServiceInstance create).
var schemaValidators = &schemaCache{byRaw: map[string]*validate.SchemaValidator{}}

// schemaCache maps a schema's exact bytes to its validator: a changed plan
// schema is other bytes, so it can never be checked by a stale validator. A
// SchemaValidator only reads its schema, so one serves concurrent requests
// (apiextensions-apiserver shares one per CRD version the same way).
type schemaCache struct {
	mu    sync.RWMutex
	byRaw map[string]*validate.SchemaValidator
}

func (c *schemaCache) get(raw *runtime.RawExtension) (*validate.SchemaValidator, error) {
	c.mu.RLock()
	v, ok := c.byRaw[string(raw.Raw)]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	schema, err := ParseSchema(raw)
	if err != nil {
		return nil, err
	}
	v = validate.NewSchemaValidator(schema, nil, "", strfmt.Default)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byRaw) >= maxCachedSchemas {
		// Plans come and go rarely: starting over is simpler than an LRU and
		// costs one parse per schema in use.
		clear(c.byRaw)
	}
	c.byRaw[string(raw.Raw)] = v
	return v, nil
}
