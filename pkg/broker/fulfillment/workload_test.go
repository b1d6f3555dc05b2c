package fulfillment

import (
	"os"
	"strings"
	"testing"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
)

// Every order gets workload names that every kind the saga makes accepts,
// whatever the order and its class are called: a Service name must be a
// DNS-1035 label (no leading digit), a StatefulSet name at most 52
// characters. The names are stable for the order and differ between orders.
func TestWorkloadNamesAreValidForAnyOrder(t *testing.T) {
	seen := map[string]bool{}
	classes := []string{"mysql", "9mysql", strings.Repeat("m", 63), "my-sql-", "x"}
	for i := 0; i < 2000; i++ {
		uid := uuid.NewUUID()
		class := classes[i%len(classes)]
		in := &brokerv1.ServiceInstance{}
		in.Name, in.UID, in.Spec.Class = string(uuid.NewUUID()), uid, class
		n := namesOf(in)
		if msgs := utilvalidation.IsDNS1035Label(n.service); len(msgs) > 0 {
			t.Fatalf("class %q uid %s: Service name %q: %v", class, uid, n.service, msgs)
		}
		if len(n.statefulSet) > 52 || len(apimachineryvalidation.NameIsDNSLabel(n.statefulSet, false)) > 0 {
			t.Fatalf("StatefulSet name %q is not a DNS label of at most 52", n.statefulSet)
		}
		if msgs := apimachineryvalidation.NameIsDNSSubdomain(n.secret, false); len(msgs) > 0 {
			t.Fatalf("Secret name %q: %v", n.secret, msgs)
		}
		if again := NewWorkloadName(class, types.UID(uid)); again != n.service {
			t.Fatalf("not stable: %q then %q", n.service, again)
		}
		if seen[n.service] {
			t.Fatalf("two orders share the workload name %q", n.service)
		}
		seen[n.service] = true
	}
	// The name the status keeps wins; an order that made objects before the
	// status had one keeps its own name (what they were made under).
	in := &brokerv1.ServiceInstance{}
	in.Name, in.UID, in.Spec.Class = "db", "u1", "mysql"
	in.Status.WorkloadName = "mysql-kept"
	if got := namesOf(in).statefulSet; got != "mysql-kept" {
		t.Errorf("with status.workloadName: %q", got)
	}
	in.Status.WorkloadName = ""
	in.Status.Steps = []brokerv1.Step{{Name: StepValidating, State: brokerv1.StepDone}, {Name: StepSecret, State: brokerv1.StepDone}}
	if got := namesOf(in).statefulSet; got != "db" {
		t.Errorf("an order from before status.workloadName: %q, want its name", got)
	}
}

// The StatefulSet speaks what the MariaDB image built here reads
// (hack/kind/mariadb-image.sh, run with podman and in the kind e2e): every
// MYSQL_* variable the container gets is one its entrypoint reads, the
// volume is mounted where the server keeps its data, and the probes' tools
// are in the image's packages.
func TestStatefulSetSpeaksTheMariaDBImage(t *testing.T) {
	script, err := os.ReadFile("../../../hack/kind/mariadb-image.sh")
	if err != nil {
		t.Fatal(err)
	}
	in := &brokerv1.ServiceInstance{}
	in.Name, in.Namespace, in.UID = "db", "ns", types.UID(uuid.NewUUID())
	plan := &brokerv1.ServicePlan{Name: "small", Replicas: 1}
	c := statefulSet(in, &brokerv1.ServiceClass{}, plan).Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		if !strings.Contains(string(script), "$"+e.Name) && !strings.Contains(string(script), "${"+e.Name) {
			t.Errorf("the container gets %s; the image's entrypoint never reads it", e.Name)
		}
	}
	if len(c.VolumeMounts) != 1 || !strings.Contains(string(script), "DATADIR=${MYSQL_DATADIR:-"+c.VolumeMounts[0].MountPath+"}") {
		t.Errorf("data volume mounted at %v; the image keeps its data elsewhere", c.VolumeMounts)
	}
	probes := strings.Join(c.StartupProbe.Exec.Command, " ") + " " + strings.Join(c.ReadinessProbe.Exec.Command, " ")
	for tool, pkg := range map[string]string{"mysqladmin": "mariadb-client", "mysql ": "mariadb-client", "sh ": "dash"} {
		if strings.Contains(probes, tool) && !strings.Contains(string(script), " "+pkg+" ") {
			t.Errorf("the probes run %q; the image lacks the package %s", tool, pkg)
		}
	}
}
