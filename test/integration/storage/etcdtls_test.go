package storage

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"

	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/pki"
	"mizar.dev/test/integration/fixtures"
)

// TestExternalEtcdOverTLS runs the server against an etcd that demands client
// certificates, with --etcd-servers and the --etcd-cafile/certfile/keyfile identity.
func TestExternalEtcdOverTLS(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	f := func(name string) string { return filepath.Join(dir, name) }
	ca, err := pki.LoadOrCreateCA(f("ca.crt"), f("ca.key"), "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	server := x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		// Also a client certificate: RunEtcd's own client presents it.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := ca.EnsureCert(f("etcd.crt"), f("etcd.key"), server); err != nil {
		t.Fatal(err)
	}
	clientCert := x509.Certificate{Subject: pkix.Name{CommonName: "mizar-apiserver"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if err := ca.EnsureCert(f("client.crt"), f("client.key"), clientCert); err != nil {
		t.Fatal(err)
	}

	cfg := testserver.NewTestConfig(t)
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = f("etcd.crt"), f("etcd.key")
	cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = f("ca.crt"), true
	for _, urls := range [][]url.URL{cfg.ListenClientUrls, cfg.AdvertiseClientUrls} {
		for i := range urls {
			urls[i].Scheme = "https"
			urls[i].Host = net.JoinHostPort("127.0.0.1", urls[i].Port())
		}
	}
	endpoint := cfg.ListenClientUrls[0].String()
	testserver.RunEtcd(t, cfg)

	// The etcd really refuses a client without a certificate of the CA.
	anon, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, TLS: trustOnly(t, f("ca.crt"))})
	if err != nil {
		t.Fatal(err)
	}
	shortCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = anon.Put(shortCtx, "probe", "x")
	cancel()
	_ = anon.Close()
	if err == nil {
		t.Fatal("etcd accepted a client without a certificate; the test proves nothing")
	}

	s := apiservertest.Start(t, filepath.Join(dir, "apiserver"),
		"--etcd-servers", endpoint,
		"--etcd-cafile", f("ca.crt"), "--etcd-certfile", f("client.crt"), "--etcd-keyfile", f("client.key"))
	vpc, err := s.Client.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc("tls", "10.90.0.0/16", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create through TLS etcd: %v", err)
	}
	if vpc.Spec.VNI == 0 {
		t.Errorf("no VNI allocated")
	}
}

// trustOnly is a TLS client config that verifies the server but presents no certificate.
func trustOnly(t *testing.T, caFile string) *tls.Config {
	t.Helper()
	c, err := (transport.TLSInfo{TrustedCAFile: caFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
