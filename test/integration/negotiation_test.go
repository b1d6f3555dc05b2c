package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned/scheme"
	"mizar.dev/test/integration/fixtures"
)

const (
	protobufType = "application/vnd.kubernetes.protobuf"
	// kcmAccept is what kube-controller-manager's typed and dynamic clients send.
	kcmAccept = protobufType + ",application/json"
	// metadataAccept is what its metadata client (namespace deleter, garbage
	// collector) sends for partial object metadata.
	metadataAccept = protobufType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)

// answers records the status and content type of every response a client got.
type answers struct {
	mu   sync.Mutex
	last struct {
		code        int
		contentType string
	}
}

func (a *answers) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			a.mu.Lock()
			a.last.code, a.last.contentType = resp.StatusCode, resp.Header.Get("Content-Type")
			a.mu.Unlock()
		}
		return resp, err
	})
}

func (a *answers) get() (int, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last.code, a.last.contentType
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestProtobufNegotiation: every kind of both groups answers list, get, watch and
// deletecollection to kube-controller-manager's Accept headers with 200 in
// protobuf (kubernetes#86666: a server without generated protobuf answered 406,
// and every namespace deletion in the cluster hung).
func TestProtobufNegotiation(t *testing.T) {
	ctx := testContext(t)
	c := client()
	s := "-" + utilrand.String(6)
	ns := "neg" + s

	vpc, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc("neg"+s, "10.61.0.0/16", 0), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Vpcs().Delete(context.Background(), vpc.Name, metav1.DeleteOptions{})
	})
	sn, err := c.NetworkingV1alpha1().Subnets().Create(ctx, fixtures.Subnet("neg"+s, vpc.Name, "10.61.1.0/24"), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Subnets().Delete(context.Background(), sn.Name, metav1.DeleteOptions{})
	})
	d, err := c.NetworkingV1alpha1().Droplets().Create(ctx, fixtures.Droplet("neg"+s, "192.168.61.1"), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Droplets().Delete(context.Background(), d.Name, metav1.DeleteOptions{})
	})
	div, err := c.NetworkingV1alpha1().Dividers().Create(ctx, fixtures.Divider("neg"+s, vpc.Name, ""), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Dividers().Delete(context.Background(), div.Name, metav1.DeleteOptions{})
	})
	b, err := c.NetworkingV1alpha1().Bouncers().Create(ctx, fixtures.Bouncer("neg"+s, sn.Name, ""), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Bouncers().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
	})
	ep, err := c.NetworkingV1alpha1().Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "pod", sn.Name, ""), metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.NetworkingV1alpha1().Endpoints(ns).Delete(context.Background(), ep.Name, metav1.DeleteOptions{})
	})

	data, err := os.ReadFile(filepath.Join("..", "..", "artifacts", "broker", "mysql-class.yaml"))
	must(t, err)
	class := &brokerv1.ServiceClass{}
	must(t, yaml.UnmarshalStrict(data, class))
	class.Name = "neg" + s
	class, err = c.BrokerV1alpha1().ServiceClasses().Create(ctx, class, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.BrokerV1alpha1().ServiceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	in, err := c.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, &brokerv1.ServiceInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: brokerv1.ServiceInstanceSpec{Class: class.Name, Plan: "small"},
	}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.BrokerV1alpha1().ServiceInstances(ns).Delete(context.Background(), in.Name, metav1.DeleteOptions{})
	})
	bd, err := c.BrokerV1alpha1().ServiceBindings(ns).Create(ctx, &brokerv1.ServiceBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "app"}, Spec: brokerv1.ServiceBindingSpec{Instance: in.Name},
	}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = c.BrokerV1alpha1().ServiceBindings(ns).Delete(context.Background(), bd.Name, metav1.DeleteOptions{})
	})

	cases := []struct {
		gv        schema.GroupVersion
		resource  string
		namespace string
		obj       metav1.Object
	}{
		{v1.SchemeGroupVersion, "vpcs", "", vpc},
		{v1.SchemeGroupVersion, "subnets", "", sn},
		{v1.SchemeGroupVersion, "droplets", "", d},
		{v1.SchemeGroupVersion, "dividers", "", div},
		{v1.SchemeGroupVersion, "bouncers", "", b},
		{v1.SchemeGroupVersion, "endpoints", ns, ep},
		{brokerv1.SchemeGroupVersion, "serviceclasses", "", class},
		{brokerv1.SchemeGroupVersion, "serviceinstances", ns, in},
		{brokerv1.SchemeGroupVersion, "servicebindings", ns, bd},
	}
	rec := &answers{}
	for _, tc := range cases {
		t.Run(tc.resource, func(t *testing.T) {
			cfg := rest.CopyConfig(shared.Config)
			cfg.GroupVersion = &tc.gv
			cfg.APIPath = "/apis"
			cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
			cfg.Wrap(rec.wrap)
			rc, err := rest.RESTClientFor(cfg)
			must(t, err)
			answered := func(what string) {
				t.Helper()
				code, ct := rec.get()
				if code != http.StatusOK || !strings.HasPrefix(ct, protobufType) {
					t.Errorf("%s: answered %d %q, want 200 in protobuf", what, code, ct)
				}
			}

			obj, err := rc.Get().SetHeader("Accept", kcmAccept).NamespaceIfScoped(tc.namespace, tc.namespace != "").
				Resource(tc.resource).Name(tc.obj.GetName()).Do(ctx).Get()
			answered("get")
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			if got := obj.(metav1.Object).GetUID(); got != tc.obj.GetUID() {
				t.Errorf("get decoded uid %q, want %q", got, tc.obj.GetUID())
			}

			// Cluster-wide, as the garbage collector lists; in the namespace, as its deleter does.
			for _, scope := range []string{"", tc.namespace} {
				list, err := rc.Get().SetHeader("Accept", kcmAccept).NamespaceIfScoped(scope, scope != "").
					Resource(tc.resource).Do(ctx).Get()
				answered("list " + scope)
				if err != nil {
					t.Fatalf("list %q: %v", scope, err)
				}
				if !listHolds(list, tc.obj.GetUID()) {
					t.Errorf("list %q decoded without %s", scope, tc.obj.GetName())
				}
				raw, err := rc.Get().SetHeader("Accept", metadataAccept).NamespaceIfScoped(scope, scope != "").
					Resource(tc.resource).DoRaw(ctx)
				answered("metadata list " + scope)
				if err != nil || !strings.Contains(string(raw), string(tc.obj.GetUID())) {
					t.Errorf("metadata list %q: %v, uid %s in answer: %v", scope, err, tc.obj.GetUID(), strings.Contains(string(raw), string(tc.obj.GetUID())))
				}
			}

			w, err := rc.Get().SetHeader("Accept", kcmAccept).NamespaceIfScoped(tc.namespace, tc.namespace != "").
				Resource(tc.resource).Param("watch", "true").Param("resourceVersion", "0").
				Param("fieldSelector", "metadata.name="+tc.obj.GetName()).Watch(ctx)
			answered("watch")
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
			ev := <-w.ResultChan()
			w.Stop()
			if o, ok := ev.Object.(metav1.Object); !ok || o.GetUID() != tc.obj.GetUID() {
				t.Errorf("watch: first event %s %T, want the object", ev.Type, ev.Object)
			}

			// A missing object is a 404 Status in protobuf, never a 406.
			err = rc.Get().SetHeader("Accept", kcmAccept).NamespaceIfScoped(tc.namespace, tc.namespace != "").
				Resource(tc.resource).Name("no-such-object").Do(ctx).Error()
			if code, ct := rec.get(); code != http.StatusNotFound || !strings.HasPrefix(ct, protobufType) {
				t.Errorf("get of a missing object: %d %q (%v), want 404 in protobuf", code, ct, err)
			}
		})
	}

	// The namespace deleter's last step: deletecollection per namespaced kind.
	for _, tc := range cases {
		if tc.namespace == "" {
			continue
		}
		cfg := rest.CopyConfig(shared.Config)
		cfg.GroupVersion = &tc.gv
		cfg.APIPath = "/apis"
		cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
		cfg.Wrap(rec.wrap)
		rc, err := rest.RESTClientFor(cfg)
		must(t, err)
		err = rc.Delete().SetHeader("Accept", metadataAccept).Namespace(ns).Resource(tc.resource).Do(ctx).Error()
		if code, ct := rec.get(); err != nil || code != http.StatusOK {
			t.Errorf("deletecollection %s: %d %q: %v, want 200", tc.resource, code, ct, err)
		}
	}
}

func listHolds(list runtime.Object, uid types.UID) bool {
	found := false
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if m, ok := o.(metav1.Object); ok && m.GetUID() == uid {
			found = true
		}
		return nil
	})
	return found
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
