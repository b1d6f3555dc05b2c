package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/kube-openapi/pkg/validation/spec"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/openapi"
)

// age is kubectl's AGE cell for an object made seconds or minutes ago.
var age = regexp.MustCompile(`^[0-9]+(s|m[0-9]*s?)$`)

func TestApplyAndGetColumns(t *testing.T) {
	begin(t)
	o := newObjects("cols", 41)
	applyManifest(t, o)

	// Allocated by the server: read them back to know what the tables must show.
	vni := mustKubectl(t, "get", "vpc", o.vpc, "-o", "jsonpath={.spec.vni}")
	if n, err := strconv.Atoi(vni); err != nil || n < 1 || n > 1<<24-1 {
		t.Fatalf("vpc %s has spec.vni %q, want an allocated VNI in 1..16777215", o.vpc, vni)
	}
	if ip := mustKubectl(t, "get", "endpoint", o.endp, "-n", o.namespace, "-o", "jsonpath={.spec.ip}"); ip != o.firstEndpointIP() {
		t.Fatalf("endpoint %s got spec.ip %q, want %s (the lowest free host after the gateway)", o.endp, ip, o.firstEndpointIP())
	}

	for _, c := range []struct {
		kind, namespace string
		header, row     []string // row without AGE
		// wideHeader and wideRow are what -o wide adds after AGE.
		wideHeader, wideRow []string
	}{{
		kind:   "vpc",
		header: []string{"NAME", "CIDR", "VNI", "DIVIDERS", "PHASE", "AGE"},
		row:    []string{o.vpc, o.vpcCIDR(), vni, "1", "Init"},
	}, {
		kind:       "subnet",
		header:     []string{"NAME", "VPC", "CIDR", "BOUNCERS", "PHASE", "AGE"},
		row:        []string{o.subnet, o.vpc, o.subnetCIDR(), "1", "Init"},
		wideHeader: []string{"GATEWAY"},
		wideRow:    []string{o.gateway()},
	}, {
		kind:       "endpoint",
		namespace:  o.namespace,
		header:     []string{"NAME", "SUBNET", "IP", "DROPLET", "PHASE", "AGE"},
		row:        []string{o.endp, o.subnet, o.firstEndpointIP(), o.droplet, "Init"},
		wideHeader: []string{"POD", "INTERFACE", "MAC"},
		wideRow:    []string{o.endp + "-pod", "eth0", o.endpointMAC()},
	}, {
		kind:   "divider",
		header: []string{"NAME", "VPC", "DROPLET", "PHASE", "AGE"},
		row:    []string{o.divider, o.vpc, o.droplet, "Init"},
	}, {
		kind:   "bouncer",
		header: []string{"NAME", "SUBNET", "DROPLET", "PHASE", "AGE"},
		row:    []string{o.bouncer, o.subnet, o.droplet, "Init"},
	}, {
		kind:       "droplet",
		header:     []string{"NAME", "NODE", "IP", "INTERFACE", "PHASE", "AGE"},
		row:        []string{o.droplet, o.droplet, o.dropletIP(), "eth0", "Init"},
		wideHeader: []string{"MAC"},
		wideRow:    []string{o.dropletMAC()},
	}} {
		t.Run(c.kind, func(t *testing.T) {
			args := []string{"get", c.kind}
			if c.namespace != "" {
				args = append(args, "-n", c.namespace)
			}
			check := func(args []string, header, row, wide []string) {
				t.Helper()
				out := mustKubectl(t, args...)
				tb := parseTable(t, out)
				if !slices.Equal(tb.header, header) {
					t.Errorf("kubectl %s header is %q, want %q\n%s", strings.Join(args, " "), tb.header, header, out)
				}
				got, ok := tb.rows[row[0]]
				if !ok {
					t.Fatalf("kubectl %s does not list %s:\n%s", strings.Join(args, " "), row[0], out)
				}
				if len(got) != len(row)+1+len(wide) {
					t.Fatalf("kubectl %s row %q, want %q, AGE, %q", strings.Join(args, " "), got, row, wide)
				}
				if !slices.Equal(got[:len(row)], row) || !age.MatchString(got[len(row)]) || !slices.Equal(got[len(row)+1:], wide) {
					t.Errorf("kubectl %s row is %q, want %q, an AGE, then %q", strings.Join(args, " "), got, row, wide)
				}
			}
			check(args, c.header, c.row, nil)
			check(append(args, "-o", "wide"), append(slices.Clone(c.header), c.wideHeader...), c.row, c.wideRow)
		})
	}
}

func TestExplain(t *testing.T) {
	begin(t)
	// The documentation kubectl must show is the API's own: the generated OpenAPI
	// definitions the server publishes, taken from the Go doc comments.
	defs := openapi.GetOpenAPIDefinitions(func(path string) spec.Ref { return spec.MustCreateRef(path) })
	for _, c := range []struct {
		path, kind, typ, model string
	}{
		{"vpc.spec", "Vpc", "VpcSpec", v1.VpcSpec{}.OpenAPIModelName()},
		{"subnet.spec", "Subnet", "SubnetSpec", v1.SubnetSpec{}.OpenAPIModelName()},
		{"endpoint.spec", "Endpoint", "EndpointSpec", v1.EndpointSpec{}.OpenAPIModelName()},
	} {
		t.Run(c.path, func(t *testing.T) {
			def, ok := defs[c.model]
			if !ok {
				t.Fatalf("no OpenAPI definition %s", c.model)
			}
			schema := def.Schema
			out := mustKubectl(t, "explain", c.path)
			for _, re := range []string{
				`(?m)^GROUP:\s+networking\.mizar\.dev$`,
				`(?m)^KIND:\s+` + c.kind + `$`,
				`(?m)^VERSION:\s+v1alpha1$`,
				`(?m)^FIELD: spec <` + c.typ + `>$`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					t.Errorf("kubectl explain %s does not match %s:\n%s", c.path, re, out)
				}
			}
			// kubectl wraps descriptions; compare with whitespace collapsed.
			flat := strings.Join(strings.Fields(out), " ")
			if d := strings.Join(strings.Fields(schema.Description), " "); d == "" || !strings.Contains(flat, d) {
				t.Errorf("kubectl explain %s lacks the type's description %q:\n%s", c.path, d, out)
			}

			fieldLine := regexp.MustCompile(`(?m)^  ([A-Za-z]+)\t<([a-z]+)>( -required-)?$`)
			shown := map[string]bool{}
			for _, m := range fieldLine.FindAllStringSubmatch(out, -1) {
				name, typ, required := m[1], m[2], m[3] != ""
				shown[name] = true
				prop, ok := schema.Properties[name]
				if !ok {
					t.Errorf("kubectl explain %s shows field %s that the API does not have", c.path, name)
					continue
				}
				if len(prop.Type) != 1 {
					t.Errorf("field %s of %s has OpenAPI type %q; this test knows only scalar fields", name, c.model, prop.Type)
				} else if want := prop.Type[0]; typ != want {
					t.Errorf("kubectl explain %s shows %s as <%s>, want <%s>", c.path, name, typ, want)
				}
				if want := slices.Contains(schema.Required, name); required != want {
					t.Errorf("kubectl explain %s: %s -required- is %v, want %v", c.path, name, required, want)
				}
				if d := strings.Join(strings.Fields(prop.Description), " "); d == "" || !strings.Contains(flat, name+" <"+typ+">") || !strings.Contains(flat, d) {
					t.Errorf("kubectl explain %s lacks the description of %s (%q):\n%s", c.path, name, d, out)
				}
			}
			for name := range schema.Properties {
				if !shown[name] {
					t.Errorf("kubectl explain %s does not list field %s:\n%s", c.path, name, out)
				}
			}
		})
	}
}

// managedObject is what the server-side apply test reads back of each object.
type managedObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name            string                      `json:"name"`
		ResourceVersion string                      `json:"resourceVersion"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields"`
	} `json:"metadata"`
}

func getManaged(t *testing.T, path string) map[string]managedObject {
	t.Helper()
	out := mustKubectl(t, "get", "-f", path, "-o", "json", "--show-managed-fields")
	var list struct {
		Items []managedObject `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decoding kubectl get -o json: %v\n%s", err, out)
	}
	objs := map[string]managedObject{}
	for _, o := range list.Items {
		objs[o.Kind+"/"+o.Metadata.Name] = o
	}
	if len(objs) != 6 {
		t.Fatalf("kubectl get -f %s returned %d objects, want 6:\n%s", path, len(objs), out)
	}
	return objs
}

func TestServerSideApply(t *testing.T) {
	begin(t)
	o := newObjects("ssa", 42)
	path := writeFile(t, "ssa.yaml", o.manifest())
	var want []string
	for _, r := range o.refs() {
		want = append(want, r+" serverside-applied")
	}

	apply := func() map[string]managedObject {
		t.Helper()
		out := mustKubectl(t, "apply", "--server-side", "-f", path)
		if got := lines(out); !slices.Equal(got, want) {
			t.Fatalf("kubectl apply --server-side printed\n%s\nwant\n%s", out, strings.Join(want, "\n"))
		}
		return getManaged(t, path)
	}
	first := apply()
	second := apply()

	for key, o := range second {
		if rv := first[key].Metadata.ResourceVersion; o.Metadata.ResourceVersion != rv {
			t.Errorf("re-applying the same manifest changed %s: resourceVersion %s -> %s", key, rv, o.Metadata.ResourceVersion)
		}
		if !slices.ContainsFunc(o.Metadata.ManagedFields, func(e metav1.ManagedFieldsEntry) bool {
			return e.Manager == "kubectl" && e.Operation == metav1.ManagedFieldsOperationApply
		}) {
			t.Errorf("%s has no Apply entry of field manager kubectl: %+v", key, o.Metadata.ManagedFields)
		}
	}

	// Another manager may not take over spec.droplet, which kubectl's apply owns.
	conflicting := writeFile(t, "conflict.yaml", fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Divider
metadata:
  name: %s
spec:
  vpc: %s
  droplet: %s-elsewhere
`, o.divider, o.vpc, o.prefix))
	r := kubectlMustFail(t, "apply", "--server-side", "--field-manager", "e2e-intruder", "-f", conflicting)
	for _, s := range []string{"Apply failed with 1 conflict", `conflict with "kubectl"`, ".spec.droplet"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("the conflicting apply's error lacks %q: %v", s, r)
		}
	}
	after := getManaged(t, path)
	key := "Divider/" + o.divider
	if got, want := after[key].Metadata.ResourceVersion, second[key].Metadata.ResourceVersion; got != want {
		t.Errorf("the rejected apply changed %s: resourceVersion %s -> %s", key, want, got)
	}
	if got := mustKubectl(t, "get", "divider", o.divider, "-o", "jsonpath={.spec.droplet}"); got != o.droplet {
		t.Errorf("divider %s has spec.droplet %q after the rejected apply, want %q", o.divider, got, o.droplet)
	}
}

func TestCategoryMizar(t *testing.T) {
	begin(t)
	o := newObjects("cat", 43)
	applyManifest(t, o)

	got := lines(mustKubectl(t, "get", "mizar", "-A", "-o", "name"))
	for _, ref := range o.refs() {
		if !slices.Contains(got, ref) {
			t.Errorf("kubectl get mizar -A does not list %s; it lists:\n%s", ref, strings.Join(got, "\n"))
		}
	}
	// Every listed object is of a kind in the category.
	kinds := map[string]bool{}
	for _, ref := range got {
		kind, _, _ := strings.Cut(ref, "/")
		kinds[kind] = true
	}
	// The broker's kinds are in the category too; other tests of this package
	// leave orders on the shared server.
	want := map[string]bool{"serviceclass.broker.mizar.dev": true, "serviceinstance.broker.mizar.dev": true,
		"servicebinding.broker.mizar.dev": true}
	for _, ref := range o.refs() {
		kind, _, _ := strings.Cut(ref, "/")
		want[kind] = true
	}
	for kind := range kinds {
		if !want[kind] {
			t.Errorf("kubectl get mizar lists a %s, which is not a mizar kind", kind)
		}
	}
}

func TestShortNamesAndDiscovery(t *testing.T) {
	begin(t)
	o := newObjects("disc", 44)
	applyManifest(t, o)

	shortNames := map[string]string{"vpcs": "mvpc", "subnets": "msn", "dividers": "mdiv", "bouncers": "mbnc", "endpoints": "mep", "droplets": "mdrop"}

	t.Run("mep", func(t *testing.T) {
		ref := "endpoint.networking.mizar.dev/" + o.endp
		if got := lines(mustKubectl(t, "get", "mep", "-n", o.namespace, "-o", "name")); !slices.Equal(got, []string{ref}) {
			t.Errorf("kubectl get mep -n %s lists %q, want [%s]", o.namespace, got, ref)
		}
		tb := parseTable(t, mustKubectl(t, "get", "mep", "-A"))
		if row, ok := tb.rows[o.endp]; !ok || row[indexOf(tb.header, "NAMESPACE")] != o.namespace || row[indexOf(tb.header, "IP")] != o.firstEndpointIP() {
			t.Errorf("kubectl get mep -A: row of %s is %q (header %q), want namespace %s and IP %s", o.endp, row, tb.header, o.namespace, o.firstEndpointIP())
		}
	})

	t.Run("short names resolve", func(t *testing.T) {
		for i, short := range []string{"mvpc", "msn", "mdrop", "mdiv", "mbnc", "mep"} {
			ref := o.refs()[i]
			args := []string{"get", short, ref[strings.Index(ref, "/")+1:], "-o", "name"}
			if short == "mep" {
				args = append(args, "-n", o.namespace)
			}
			if got := strings.TrimSpace(mustKubectl(t, args...)); got != ref {
				t.Errorf("kubectl %s printed %q, want %s", strings.Join(args, " "), got, ref)
			}
		}
	})

	t.Run("group discovery", func(t *testing.T) {
		out := mustKubectl(t, "get", "--raw", "/apis/networking.mizar.dev/v1alpha1")
		var list metav1.APIResourceList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("decoding discovery: %v\n%s", err, out)
		}
		seen := map[string]bool{}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") {
				continue // subresources carry neither short names nor categories
			}
			seen[r.Name] = true
			// Behind kube-apiserver the bare words must keep meaning core endpoints.
			for _, s := range append(slices.Clone(r.ShortNames), r.Categories...) {
				if s == "endpoints" || s == "ep" {
					t.Errorf("%s advertises %q, which would shadow core endpoints", r.Name, s)
				}
			}
			if !slices.Equal(r.Categories, []string{"mizar"}) {
				t.Errorf("%s has categories %q, want exactly [mizar]", r.Name, r.Categories)
			}
			if want, ok := shortNames[r.Name]; !ok || !slices.Equal(r.ShortNames, []string{want}) {
				t.Errorf("%s has short names %q, want [%s]", r.Name, r.ShortNames, want)
			}
			if got, want := r.Namespaced, r.Name == "endpoints"; got != want {
				t.Errorf("%s namespaced=%v, want %v", r.Name, got, want)
			}
		}
		for name := range shortNames {
			if !seen[name] {
				t.Errorf("discovery lacks %s:\n%s", name, out)
			}
		}
	})

	t.Run("api-resources", func(t *testing.T) {
		// kubectl's own view, through aggregated discovery.
		out := mustKubectl(t, "api-resources", "-o", "wide", "--api-group", "networking.mizar.dev")
		tb := parseTable(t, out)
		if want := []string{"NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND", "VERBS", "CATEGORIES"}; !slices.Equal(tb.header, want) {
			t.Fatalf("kubectl api-resources -o wide header is %q, want %q", tb.header, want)
		}
		if len(tb.rows) != len(shortNames) {
			t.Errorf("kubectl api-resources lists %d resources, want %d:\n%s", len(tb.rows), len(shortNames), out)
		}
		for name, short := range shortNames {
			row, ok := tb.rows[name]
			if !ok {
				t.Errorf("kubectl api-resources does not list %s:\n%s", name, out)
				continue
			}
			if row[1] != short || row[6] != "mizar" {
				t.Errorf("kubectl api-resources: %s has short names %q and categories %q, want %s and mizar", name, row[1], row[6], short)
			}
		}
		byCategory := lines(mustKubectl(t, "api-resources", "--categories", "mizar", "-o", "name"))
		sort.Strings(byCategory)
		// Both groups' kinds: `kubectl get mizar` shows the network and the broker's orders.
		want := []string{"bouncers.networking.mizar.dev", "dividers.networking.mizar.dev", "droplets.networking.mizar.dev", "endpoints.networking.mizar.dev",
			"servicebindings.broker.mizar.dev", "serviceclasses.broker.mizar.dev", "serviceinstances.broker.mizar.dev",
			"subnets.networking.mizar.dev", "vpcs.networking.mizar.dev"}
		if !slices.Equal(byCategory, want) {
			t.Errorf("kubectl api-resources --categories mizar lists %q, want %q", byCategory, want)
		}
		if all := lines(mustKubectl(t, "api-resources", "--categories", "all", "-o", "name")); len(all) != 0 {
			t.Errorf("kubectl api-resources --categories all lists %q; mizar kinds must not be in category all", all)
		}
	})
}

// background is a kubectl command left running while the test does something else.
type background struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	exited         chan struct{}
	err            error
}

func startKubectl(t *testing.T, args ...string) *background {
	t.Helper()
	return startKubectlOn(t, srv.kubeconfig, args...)
}

// startKubectlOn is startKubectl against the server kubeconfig names.
func startKubectlOn(t *testing.T, kubeconfig string, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	b := &background{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	b.cmd = exec.CommandContext(ctx, kubectlBin, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", kubectlCache}, args...)...)
	b.cmd.Stdout, b.cmd.Stderr = b.stdout, b.stderr
	if err := b.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting kubectl %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		b.err = b.cmd.Wait()
		close(b.exited)
	}()
	// Never leave it behind, whatever the test did.
	t.Cleanup(func() {
		cancel()
		<-b.exited
	})
	return b
}

func (b *background) String() string {
	return fmt.Sprintf("kubectl %s\n--- stdout:\n%s\n--- stderr:\n%s", strings.Join(b.cmd.Args[5:], " "), b.stdout.From(0), b.stderr.From(0))
}

func TestWaitForPhase(t *testing.T) {
	begin(t)
	p := unique("wait")
	vpc, never := p+"-vpc", p+"-never"
	vpcs := fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata:
  name: %s
spec:
  cidr: 10.45.0.0/16
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata:
  name: %s
spec:
  cidr: 10.46.0.0/16
`, vpc, never)
	mustKubectl(t, "apply", "-f", writeFile(t, "vpcs.yaml", vpcs))

	t.Run("returns after the status patch", func(t *testing.T) {
		// -v=6 logs each request; the watch request's line tells us kubectl is
		// waiting on a watch, so the patch below is seen as an event.
		w := startKubectl(t, "wait", "--for=jsonpath={.status.phase}=Provisioned", "vpc/"+vpc, "--timeout=30s", "-v=6")
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			select {
			case <-w.exited:
				return false, fmt.Errorf("kubectl wait exited before the status was patched: %v", w.err)
			default:
			}
			return w.stderr.Contains("watch=true"), nil
		})
		if err != nil {
			t.Fatalf("kubectl wait did not start watching: %v\n%v", err, w)
		}

		out := mustKubectl(t, "patch", "vpc", vpc, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`)
		if want := "vpc.networking.mizar.dev/" + vpc + " patched"; strings.TrimSpace(out) != want {
			t.Errorf("kubectl patch printed %q, want %q", out, want)
		}
		select {
		case <-w.exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("kubectl wait still running 20s after the patch:\n%v", w)
		}
		if w.err != nil {
			t.Fatalf("kubectl wait failed after the patch: %v\n%v", w.err, w)
		}
		if want := "vpc.networking.mizar.dev/" + vpc + " condition met"; strings.TrimSpace(w.stdout.From(0)) != want {
			t.Errorf("kubectl wait printed %q, want %q", w.stdout.From(0), want)
		}
		if got := mustKubectl(t, "get", "vpc", vpc, "-o", "jsonpath={.status.phase}"); got != "Provisioned" {
			t.Errorf("vpc %s has phase %q after the patch", vpc, got)
		}
	})

	t.Run("times out on an object never patched", func(t *testing.T) {
		start := time.Now()
		r := kubectlMustFail(t, "wait", "--for=jsonpath={.status.phase}=Provisioned", "vpc/"+never, "--timeout=2s")
		if elapsed := time.Since(start); elapsed < 2*time.Second {
			t.Errorf("kubectl wait --timeout=2s gave up after %v", elapsed)
		}
		if want := "timed out waiting for the condition on vpcs/" + never; !strings.Contains(r.stderr, want) {
			t.Errorf("kubectl wait's error lacks %q: %v", want, r)
		}
		if got := mustKubectl(t, "get", "vpc", never, "-o", "jsonpath={.status.phase}"); got != "Init" {
			t.Errorf("vpc %s has phase %q, want Init", never, got)
		}
	})
}

func TestInvalidObjectsRejected(t *testing.T) {
	begin(t)
	o := newObjects("inv", 48)
	applyManifest(t, o)

	for _, c := range []struct {
		name, kind, namespace, manifest string
		// field is the path the error must name; message a part of its reason.
		field, message string
	}{{
		name: "subnet outside its vpc", kind: "subnet", field: "spec.cidr", message: "must lie inside VPC " + o.vpc,
		manifest: fmt.Sprintf("kind: Subnet\nmetadata:\n  name: inv-outside\nspec:\n  vpc: %s\n  cidr: 10.99.1.0/24\n", o.vpc),
	}, {
		name: "subnet overlapping a sibling", kind: "subnet", field: "spec.cidr", message: "overlaps subnet " + o.subnet,
		manifest: fmt.Sprintf("kind: Subnet\nmetadata:\n  name: inv-overlap\nspec:\n  vpc: %s\n  cidr: 10.%d.1.128/25\n", o.vpc, o.octet),
	}, {
		name: "vpc cidr with host bits", kind: "vpc", field: "spec.cidr", message: "Invalid value",
		manifest: "kind: Vpc\nmetadata:\n  name: inv-hostbits\nspec:\n  cidr: 10.0.0.1/16\n",
	}, {
		name: "endpoint with a bad mac", kind: "endpoint", namespace: o.namespace, field: "spec.mac", message: "Invalid value",
		manifest: fmt.Sprintf("kind: Endpoint\nmetadata:\n  name: inv-mac\n  namespace: %s\nspec:\n  subnet: %s\n  droplet: %s\n  mac: zz\n", o.namespace, o.subnet, o.droplet),
	}, {
		name: "endpoint in a missing subnet", kind: "endpoint", namespace: o.namespace, field: "spec.subnet", message: "Not found",
		manifest: fmt.Sprintf("kind: Endpoint\nmetadata:\n  name: inv-nosubnet\n  namespace: %s\nspec:\n  subnet: inv-nowhere\n  droplet: %s\n  mac: \"02:00:00:00:00:09\"\n", o.namespace, o.droplet),
	}} {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, "bad.yaml", "apiVersion: networking.mizar.dev/v1alpha1\n"+c.manifest)
			r := kubectlMustFail(t, "apply", "-f", path)
			if !strings.Contains(r.stderr, "is invalid: "+c.field+": ") || !strings.Contains(r.stderr, c.message) {
				t.Errorf("the error does not name %s with %q: %v", c.field, c.message, r)
			}
			name := regexp.MustCompile(`(?m)^  name: (\S+)$`).FindStringSubmatch(c.manifest)[1]
			args := []string{"get", c.kind, name}
			if c.namespace != "" {
				args = append(args, "-n", c.namespace)
			}
			g := kubectlMustFail(t, args...)
			if !strings.Contains(g.stderr, "(NotFound)") {
				t.Errorf("the rejected %s %s exists or cannot be read: %v", c.kind, name, g)
			}
		})
	}
}

func TestFieldSelectors(t *testing.T) {
	begin(t)
	o := newObjects("fs", 49)
	applyManifest(t, o)

	near, far := o.prefix+"-near", o.prefix+"-far"
	div := func(i int) string { return fmt.Sprintf("%s-div-%d", o.prefix, i) }
	farEp := o.prefix + "-ep-far"

	// Dividers on two droplets, plus the manifest's one on o.droplet.
	var b strings.Builder
	for i, droplet := range []string{near, far, near, far, far} {
		fmt.Fprintf(&b, "---\napiVersion: networking.mizar.dev/v1alpha1\nkind: Divider\nmetadata:\n  name: %s\nspec:\n  vpc: %s\n  droplet: %s\n", div(i), o.vpc, droplet)
	}
	// And an endpoint of the same subnet on another droplet, in another namespace.
	fmt.Fprintf(&b, "---\napiVersion: networking.mizar.dev/v1alpha1\nkind: Endpoint\nmetadata:\n  name: %s\n  namespace: %s-other\nspec:\n  subnet: %s\n  droplet: %s\n  mac: \"02:00:00:00:31:01\"\n", farEp, o.prefix, o.subnet, far)
	mustKubectl(t, "apply", "-f", writeFile(t, "more.yaml", b.String()))

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"dividers on one droplet", []string{"get", "dividers", "--field-selector", "spec.droplet=" + near}, []string{"divider.networking.mizar.dev/" + div(0), "divider.networking.mizar.dev/" + div(2)}},
		{"dividers of a vpc not on a droplet", []string{"get", "dividers", "--field-selector", "spec.vpc=" + o.vpc + ",spec.droplet!=" + far}, []string{"divider.networking.mizar.dev/" + o.divider, "divider.networking.mizar.dev/" + div(0), "divider.networking.mizar.dev/" + div(2)}},
		{"dividers on no droplet", []string{"get", "dividers", "--field-selector", "spec.droplet=" + o.prefix + "-nowhere"}, nil},
		{"endpoints on one droplet", []string{"get", "mep", "-A", "--field-selector", "spec.droplet=" + far}, []string{"endpoint.networking.mizar.dev/" + farEp}},
		{"endpoints of a subnet across namespaces", []string{"get", "mep", "-A", "--field-selector", "spec.subnet=" + o.subnet}, []string{"endpoint.networking.mizar.dev/" + o.endp, "endpoint.networking.mizar.dev/" + farEp}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := lines(mustKubectl(t, append(c.args, "-o", "name")...))
			sort.Strings(got)
			sort.Strings(c.want)
			if !slices.Equal(got, c.want) {
				t.Errorf("kubectl %s lists %q, want %q", strings.Join(c.args, " "), got, c.want)
			}
		})
	}

	t.Run("table", func(t *testing.T) {
		out := mustKubectl(t, "get", "dividers", "--field-selector", "spec.droplet="+near)
		tb := parseTable(t, out)
		if len(tb.rows) != 2 {
			t.Errorf("the table lists %d dividers, want 2:\n%s", len(tb.rows), out)
		}
		for name, row := range tb.rows {
			if row[indexOf(tb.header, "DROPLET")] != near {
				t.Errorf("divider %s on %s listed for spec.droplet=%s", name, row[indexOf(tb.header, "DROPLET")], near)
			}
		}
	})

	t.Run("unsupported field", func(t *testing.T) {
		r := kubectlMustFail(t, "get", "dividers", "--field-selector", "spec.bogus=x")
		if !strings.Contains(r.stderr, "field label not supported: spec.bogus") {
			t.Errorf("the error does not say spec.bogus is not a field label: %v", r)
		}
	})
}
