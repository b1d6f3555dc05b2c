package apiserver_test

import (
	"bytes"
	"context"
	"testing"

	"mizar.dev/pkg/apiserver/apiservertest"
)

// TestCreateAnswersWhatAGetReads: a create is answered with a copy of the
// object it wrote, not with the stored bytes decoded again; clients must not
// see the difference. Each body has what a decode would change in memory:
// an empty map, fields left to defaulting, a quantity not in canonical form,
// raw JSON with spaces, and (every object) timestamps below the second.
func TestCreateAnswersWhatAGetReads(t *testing.T) {
	s := apiservertest.Start(t, shortDir(t))
	ctx := context.Background()
	rc := s.Client.Discovery().RESTClient()
	for _, tc := range []struct{ path, name, body string }{
		{"/apis/networking.mizar.dev/v1alpha1/vpcs", "eq-vpc",
			`{"apiVersion":"networking.mizar.dev/v1alpha1","kind":"Vpc","metadata":{"name":"eq-vpc","labels":{},"annotations":{"a":"<&>"}},"spec":{"cidr":"10.77.0.0/16"}}`},
		{"/apis/networking.mizar.dev/v1alpha1/droplets", "eq-droplet",
			`{"apiVersion":"networking.mizar.dev/v1alpha1","kind":"Droplet","metadata":{"name":"eq-droplet","finalizers":[]},"spec":{"node":"n1","ip":"192.168.77.1","mac":"02:00:00:00:77:01","interface":"eth0"}}`},
		{"/apis/broker.mizar.dev/v1alpha1/serviceclasses", "eq-class",
			`{"apiVersion":"broker.mizar.dev/v1alpha1","kind":"ServiceClass","metadata":{"name":"eq-class"},"spec":{"id":"4d9c2a3e-6b1f-4f0e-9d8a-1f6f0a5b7c77","description":"d","bindable":true,"image":"mysql:8.4",
			  "plans":[{"name":"small","id":"4d9c2a3e-6b1f-4f0e-9d8a-1f6f0a5b7c78","description":"d","replicas":1,"cpu":"1.5","memory":"1024Mi","storage":"5Gi",
			  "parametersSchema":{ "type" : "object",  "properties": {"database": {"type": "string"}}}}]}}`},
	} {
		created, err := rc.Post().AbsPath(tc.path).SetHeader("Content-Type", "application/json").Body([]byte(tc.body)).DoRaw(ctx)
		if err != nil {
			t.Fatalf("create %s: %v: %s", tc.name, err, created)
		}
		got, err := rc.Get().AbsPath(tc.path, tc.name).DoRaw(ctx)
		if err != nil {
			t.Fatalf("get %s: %v", tc.name, err)
		}
		if !bytes.Equal(bytes.TrimSpace(created), bytes.TrimSpace(got)) {
			t.Errorf("%s: the create answered\n%s\nand a get reads\n%s", tc.name, created, got)
		}
	}
}
