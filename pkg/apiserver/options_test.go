package apiserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	"mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/etcd"
)

var seq atomic.Int32

// shortDir is a data directory whose etcd socket path fits a unix socket.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "mizar-opt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestFlagsTellTheTruth: flags that cannot work, or would do nothing, in the
// chosen mode stop the server before it starts anything, with a message.
func TestFlagsTellTheTruth(t *testing.T) {
	aggregated := []string{"--authentication-kubeconfig", "/nonexistent", "--authorization-kubeconfig", "/nonexistent", "--kubeconfig", "/nonexistent"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"standalone, all interfaces", []string{"--standalone", "--bind-address", "0.0.0.0"}, "--bind-address 0.0.0.0 is not a loopback address"},
		{"standalone, routable address", []string{"--standalone", "--bind-address", "10.1.2.3"}, "--bind-address 10.1.2.3 is not a loopback address"},
		{"standalone, delegation flags", []string{"--standalone", "--authentication-kubeconfig", "/x", "--authorization-kubeconfig", "/x"},
			"--authentication-kubeconfig, --authorization-kubeconfig have no effect: --standalone uses its own CA"},
		{"standalone, own certificates", []string{"--standalone", "--cert-dir", "/x"}, "--cert-dir has no effect"},
		{"standalone, admission", []string{"--standalone", "--enable-admission-plugins", "NamespaceLifecycle"}, "--enable-admission-plugins has no effect"},
		{"external etcd, embedded flag", []string{"--standalone", "--etcd-servers", "http://127.0.0.1:1", "--embedded-etcd-unsafe-no-fsync"},
			"--embedded-etcd-unsafe-no-fsync has no effect: it applies to the embedded etcd"},
		{"aggregated, port 0", append([]string{"--secure-port", "0"}, aggregated...), "--secure-port 0 picks a free port only with --standalone"},
		{"aggregated, alternate-dns with own certificate", append([]string{"--alternate-dns", "x.svc", "--tls-cert-file", "/c", "--tls-private-key-file", "/k"}, aggregated...),
			"--alternate-dns has no effect"},
		{"negative shutdown delay", []string{"--standalone", "--shutdown-delay-duration", "-1s"}, "--shutdown-delay-duration must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortDir(t)
			o := apiserver.NewOptions()
			fs := pflag.NewFlagSet("mizar-apiserver", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--data-dir", dir}, tc.args...)); err != nil {
				t.Fatalf("parsing %v: %v", tc.args, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := o.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("mizar-apiserver %v: got error %v, want one containing %q", tc.args, err, tc.want)
			}
			// Refused before anything started: no etcd data, no PKI.
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("the refused start left %d entries in the data directory", len(entries))
			}
		})
	}
}

// TestEtcdPrefix: by default every key lives under /mizar, none under
// kube-apiserver's /registry; a data directory of an older release (objects
// under /registry/mizar) is refused with the flag that keeps serving it.
func TestEtcdPrefix(t *testing.T) {
	if got := apiserver.NewOptions().EtcdPrefix(); got != "/mizar" {
		t.Fatalf("default EtcdPrefix() = %q, want /mizar", got)
	}
	name := fmt.Sprintf("prefix%d", seq.Add(1))
	vpc := &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VpcSpec{CIDR: "10.77.0.0/16"}}
	ctx := context.Background()

	current := shortDir(t)
	s := apiservertest.Start(t, current)
	if _, err := s.Client.NetworkingV1alpha1().Vpcs().Create(ctx, vpc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	keys := etcdKeys(t, current)
	if len(keys) == 0 {
		t.Fatal("no keys in etcd after creating a VPC")
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "/mizar/") {
			t.Errorf("etcd key %s is outside /mizar/", k)
		}
	}

	old := shortDir(t)
	s = apiservertest.Start(t, old, "--etcd-prefix", "/registry/mizar")
	if _, err := s.Client.NetworkingV1alpha1().Vpcs().Create(ctx, vpc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := apiservertest.New(old); err == nil || !strings.Contains(err.Error(), "pass --etcd-prefix /registry/mizar") {
		t.Fatalf("starting on objects under the old prefix: got %v, want a refusal naming --etcd-prefix /registry/mizar", err)
	}
	s = apiservertest.Start(t, old, "--etcd-prefix", "/registry/mizar")
	if _, err := s.Client.NetworkingV1alpha1().Vpcs().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("with --etcd-prefix /registry/mizar the old VPC is not served: %v", err)
	}
}

// etcdKeys lists every key in the embedded etcd of a stopped server's data dir.
func etcdKeys(t *testing.T, dataDir string) []string {
	t.Helper()
	e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: filepath.Join(dataDir, "etcd"), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}
