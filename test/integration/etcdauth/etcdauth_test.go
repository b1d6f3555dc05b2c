// Package etcdauth runs mizar-apiserver against an etcd with authentication
// enabled, as the etcd role in artifacts/etcd/mizar-role.sh allows it: a TLS
// client certificate whose CN is a user holding only mizar's prefixes.
package etcdauth

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	networkingv1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/pki"
)

// rolePrefixes reads the prefixes the shipped script grants, so the test checks
// the artifact, not a copy of it.
func rolePrefixes(t *testing.T) []string {
	_, file, _, _ := runtime.Caller(0)
	f, err := os.Open(filepath.Join(filepath.Dir(file), "../../../artifacts/etcd/mizar-role.sh"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^etcdctl role grant-permission "\$ROLE" --prefix=true readwrite (\S+)$`)
	var out []string
	for s := bufio.NewScanner(f); s.Scan(); {
		if m := re.FindStringSubmatch(s.Text()); m != nil {
			out = append(out, m[1])
		}
	}
	if len(out) == 0 {
		t.Fatal("mizar-role.sh grants no prefix")
	}
	return out
}

type pair struct{ cert, key string }

func issue(t *testing.T, ca *pki.CA, dir, cn string, usage ...x509.ExtKeyUsage) pair {
	p := pair{filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")}
	tmpl := x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: usage,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	if err := ca.EnsureCert(p.cert, p.key, tmpl); err != nil {
		t.Fatal(err)
	}
	return p
}

func client(t *testing.T, endpoint, caFile string, p pair) *clientv3.Client {
	cert, err := tls.LoadX509KeyPair(p.cert, p.key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestApiserverWithinItsEtcdRole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	server := issue(t, ca, dir, "etcd-server", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	root := issue(t, ca, dir, "root", x509.ExtKeyUsageClientAuth)
	mizar := issue(t, ca, dir, "mizar-apiserver", x509.ExtKeyUsageClientAuth)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	u := url.URL{Scheme: "https", Host: addr}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{u}, []url.URL{u}
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: "localhost:2380"}}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = server.cert, server.key
	cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = filepath.Join(dir, "ca.crt"), true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("etcd not ready")
	}

	// What mizar-role.sh does, through the API (etcdctl is not installed here).
	endpoint := "https://" + addr
	rc := client(t, endpoint, filepath.Join(dir, "ca.crt"), root)
	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rc.UserAddWithOptions(ctx, "root", "", noPassword))
	must(rc.UserGrantRole(ctx, "root", "root"))
	must(rc.RoleAdd(ctx, "mizar"))
	for _, p := range rolePrefixes(t) {
		must(rc.RoleGrantPermission(ctx, "mizar", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)))
	}
	must(rc.UserAddWithOptions(ctx, "mizar-apiserver", "", noPassword))
	must(rc.UserGrantRole(ctx, "mizar-apiserver", "mizar"))
	must(rc.Put(ctx, "/registry/other-app/secret", "not for mizar"))
	must(rc.AuthEnable(ctx))

	s := apiservertest.Start(t, filepath.Join(dir, "mizar"), "--etcd-servers", endpoint,
		"--etcd-cafile", filepath.Join(dir, "ca.crt"), "--etcd-certfile", mizar.cert, "--etcd-keyfile", mizar.key)
	name := "vpc-" + utilrand.String(6)
	if _, err := s.Client.NetworkingV1alpha1().Vpcs().Create(ctx, &networkingv1.Vpc{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.VpcSpec{CIDR: "10.8.0.0/16"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a VPC (allocation takes a lock too) within the role: %v", err)
	}
	if _, err := s.Client.NetworkingV1alpha1().Vpcs().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	mc := client(t, endpoint, filepath.Join(dir, "ca.crt"), mizar)
	if _, err := mc.Get(ctx, "/registry/other-app/secret"); err == nil {
		t.Error("mizar's identity read another application's key")
	}
	if _, err := mc.Put(ctx, "/registry/mizarx", "x"); err == nil {
		t.Error("mizar's identity wrote outside its prefixes")
	}
}
