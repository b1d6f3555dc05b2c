package apiserver

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"mizar.dev/pkg/pki"
)

// standalonePKI is <data-dir>/pki: mizar's own CA, the serving certificate
// kubectl verifies, and the admin client certificate the kubeconfig presents.
type standalonePKI struct {
	dir string
	ca  *pki.CA
}

func (p *standalonePKI) file(name string) string { return filepath.Join(p.dir, name) }

// loadStandalonePKI creates or renews everything in dir.
func loadStandalonePKI(dir string) (*standalonePKI, error) {
	p := &standalonePKI{dir: dir}
	ca, err := pki.LoadOrCreateCA(p.file("ca.crt"), p.file("ca.key"), "mizar-apiserver-ca")
	if err != nil {
		return nil, err
	}
	p.ca = ca
	serving := x509.Certificate{
		Subject:     pkix.Name{CommonName: "mizar-apiserver"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := ca.EnsureCert(p.file("serving.crt"), p.file("serving.key"), serving); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	// Group system:masters is what the standalone authorizer lets do everything.
	admin := x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := ca.EnsureCert(p.file("admin.crt"), p.file("admin.key"), admin); err != nil {
		return nil, fmt.Errorf("admin client certificate: %w", err)
	}
	return p, nil
}

// writeKubeconfig writes an admin kubeconfig for the server at addr: it trusts
// mizar's CA (no insecure TLS) and presents the admin client certificate.
func (p *standalonePKI) writeKubeconfig(path, addr string) error {
	cert, err := os.ReadFile(p.file("admin.crt"))
	if err != nil {
		return fmt.Errorf("reading admin certificate: %w", err)
	}
	key, err := os.ReadFile(p.file("admin.key"))
	if err != nil {
		return fmt.Errorf("reading admin key: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["mizar"] = &clientcmdapi.Cluster{Server: "https://" + addr, CertificateAuthorityData: p.ca.PEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["mizar"] = &clientcmdapi.Context{Cluster: "mizar", AuthInfo: "admin"}
	cfg.CurrentContext = "mizar"
	// Written to a temporary file and renamed, so a reader never sees half a file.
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}
