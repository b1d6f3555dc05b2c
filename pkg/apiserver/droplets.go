package apiserver

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"mizar.dev/pkg/admission/dropletrestriction"
	"mizar.dev/pkg/apis/networking"
)

// IssueDropletKubeconfig writes to out a kubeconfig for a standalone server in
// dataDir that authenticates as droplet name (user mizar:droplet:<name>, group
// mizar:droplets), with a client certificate from the server's CA. The server
// address is taken from the admin kubeconfig, so the server must have run once.
func IssueDropletKubeconfig(dataDir, name, out string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("droplet name %q: %v", name, errs)
	}
	admin, err := clientcmd.LoadFromFile(filepath.Join(dataDir, kubeconfigName))
	if err != nil {
		return fmt.Errorf("reading the admin kubeconfig (has the standalone server run in %s?): %w", dataDir, err)
	}
	cluster := admin.Clusters["mizar"]
	if cluster == nil {
		return fmt.Errorf("admin kubeconfig in %s names no cluster \"mizar\"", dataDir)
	}
	p, err := loadStandalonePKI(filepath.Join(dataDir, "pki"))
	if err != nil {
		return err
	}
	certFile, keyFile := p.file("droplet-"+name+".crt"), p.file("droplet-"+name+".key")
	tmpl := x509.Certificate{
		Subject:     pkix.Name{CommonName: dropletrestriction.UserPrefix + name, Organization: []string{dropletrestriction.Group}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := p.ca.EnsureCert(certFile, keyFile, tmpl); err != nil {
		return fmt.Errorf("droplet %s certificate: %w", name, err)
	}
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["mizar"] = &clientcmdapi.Cluster{Server: cluster.Server, CertificateAuthorityData: p.ca.PEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["mizar"] = &clientcmdapi.Context{Cluster: "mizar", AuthInfo: name}
	cfg.CurrentContext = "mizar"
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}

// dropletAuthorizer lets droplet identities read networking.mizar.dev and write
// the resources an agent writes; dropletrestriction then narrows every write to
// the droplet's own objects.
type dropletAuthorizer struct{}

var readVerbs = map[string]bool{"get": true, "list": true, "watch": true}

var agentWrites = map[string]bool{
	"droplets": true, "droplets/status": true, "bouncers/status": true, "dividers/status": true, "endpoints": true,
}

func (dropletAuthorizer) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if _, ok := dropletrestriction.DropletOf(a.GetUser()); !ok || !a.IsResourceRequest() || a.GetAPIGroup() != networking.GroupName {
		return authorizer.DecisionNoOpinion, "", nil
	}
	res := a.GetResource()
	if a.GetSubresource() != "" {
		res += "/" + a.GetSubresource()
	}
	if readVerbs[a.GetVerb()] || agentWrites[res] {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "droplets may not " + a.GetVerb() + " " + res, nil
}
