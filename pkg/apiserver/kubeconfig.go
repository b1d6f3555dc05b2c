package apiserver

import (
	"fmt"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes an admin kubeconfig for a standalone server at addr:
// it trusts mizar's CA (no insecure TLS) and presents the admin client certificate.
func writeKubeconfig(path, addr string, p *pki) error {
	cert, err := os.ReadFile(p.AdminCertFile())
	if err != nil {
		return fmt.Errorf("reading admin certificate: %w", err)
	}
	key, err := os.ReadFile(p.AdminKeyFile())
	if err != nil {
		return fmt.Errorf("reading admin key: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["mizar"] = &clientcmdapi.Cluster{Server: "https://" + addr, CertificateAuthorityData: p.caPEM}
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
