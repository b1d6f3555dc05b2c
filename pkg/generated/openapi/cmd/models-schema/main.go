// Command models-schema prints the OpenAPI v2 definitions of mizar's types (and
// the apimachinery types they use) as one swagger document. applyconfiguration-gen
// reads it to give the generated apply configurations their structured-merge schema.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"mizar.dev/pkg/generated/openapi"
)

func main() {
	if err := output(); err != nil {
		fmt.Fprintf(os.Stderr, "models-schema: %v\n", err)
		os.Exit(1)
	}
}

func output() error {
	// Every generated key is already an OpenAPI model name (+k8s:openapi-model-package),
	// so references resolve to the keys unchanged.
	ref := func(name string) spec.Ref { return spec.MustCreateRef("#/definitions/" + name) }
	defs := openapi.GetOpenAPIDefinitions(ref)
	schemas := make(map[string]spec.Schema, len(defs))
	for name, def := range defs {
		// Types with a separate v2 form (e.g. IntOrString) carry it in an extension.
		if v2, ok := def.Schema.Extensions[common.ExtensionV2Schema].(spec.Schema); ok {
			schemas[name] = v2
			continue
		}
		schemas[name] = def.Schema
	}
	data, err := json.Marshal(&spec.Swagger{SwaggerProps: spec.SwaggerProps{
		Swagger:     "2.0",
		Info:        &spec.Info{InfoProps: spec.InfoProps{Title: "mizar", Version: "unversioned"}},
		Definitions: schemas,
	}})
	if err != nil {
		return fmt.Errorf("serializing definitions: %w", err)
	}
	_, err = os.Stdout.Write(data)
	return err
}
