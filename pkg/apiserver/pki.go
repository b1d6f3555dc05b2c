package apiserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore reissues a leaf certificate this long before it expires.
	renewBefore = 30 * 24 * time.Hour
)

// pki is the standalone server's own certificate authority in <data-dir>/pki: it
// signs the serving certificate kubectl verifies and the admin client certificate
// the kubeconfig presents. Files are reused across restarts so a kubeconfig keeps
// working; leaves are reissued when they near expiry.
type pki struct {
	dir   string
	ca    *x509.Certificate
	caKey crypto.Signer
	caPEM []byte
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// CAFile, ServingCert/Key and AdminCert/Key name the files in the directory.
func (p *pki) CAFile() string          { return p.path("ca.crt") }
func (p *pki) ServingCertFile() string { return p.path("serving.crt") }
func (p *pki) ServingKeyFile() string  { return p.path("serving.key") }
func (p *pki) AdminCertFile() string   { return p.path("admin.crt") }
func (p *pki) AdminKeyFile() string    { return p.path("admin.key") }

// loadOrCreatePKI makes sure dir holds a CA, a serving certificate for the
// loopback names and an admin client certificate in group system:masters.
func loadOrCreatePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	p := &pki{dir: dir}
	if err := p.loadOrCreateCA(); err != nil {
		return nil, err
	}
	serving := x509.Certificate{
		Subject:     pkix.Name{CommonName: "mizar-apiserver"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := p.ensureLeaf(p.ServingCertFile(), p.ServingKeyFile(), serving); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	admin := x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := p.ensureLeaf(p.AdminCertFile(), p.AdminKeyFile(), admin); err != nil {
		return nil, fmt.Errorf("admin client certificate: %w", err)
	}
	return p, nil
}

func (p *pki) loadOrCreateCA() error {
	certs, err := cert.CertsFromFile(p.CAFile())
	if err == nil {
		key, kerr := keyutil.PrivateKeyFromFile(p.path("ca.key"))
		if kerr != nil {
			return fmt.Errorf("reading CA key: %w", kerr)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return fmt.Errorf("CA key in %s cannot sign", p.path("ca.key"))
		}
		p.ca, p.caKey = certs[0], signer
		p.caPEM, err = os.ReadFile(p.CAFile())
		return err
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating CA key: %w", err)
	}
	ca, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "mizar-apiserver-ca"}, key)
	if err != nil {
		return fmt.Errorf("creating CA: %w", err)
	}
	p.ca, p.caKey = ca, key
	p.caPEM = encodeCert(ca)
	return writeKeyPair(p.CAFile(), p.path("ca.key"), p.caPEM, key)
}

// ensureLeaf issues template from the CA unless a valid, unexpiring one is on disk.
func (p *pki) ensureLeaf(certFile, keyFile string, template x509.Certificate) error {
	if certs, err := cert.CertsFromFile(certFile); err == nil {
		c := certs[0]
		if c.CheckSignatureFrom(p.ca) == nil && time.Until(c.NotAfter) > renewBefore {
			if _, err := keyutil.PrivateKeyFromFile(keyFile); err == nil {
				return nil
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("generating serial: %w", err)
	}
	now := time.Now()
	template.SerialNumber = serial
	template.NotBefore = now.Add(-time.Minute)
	template.NotAfter = now.Add(leafValidity)
	template.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, &template, p.ca, key.Public(), p.caKey)
	if err != nil {
		return fmt.Errorf("signing: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	return writeKeyPair(certFile, keyFile, encodeCert(c), key)
}

func encodeCert(c *x509.Certificate) []byte {
	pem, err := cert.EncodeCertificates(c)
	if err != nil {
		// Encoding a parsed certificate cannot fail.
		panic(err)
	}
	return pem
}

func writeKeyPair(certFile, keyFile string, certPEM []byte, key *ecdsa.PrivateKey) error {
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encoding key: %w", err)
	}
	if err := keyutil.WriteKey(keyFile, keyPEM); err != nil {
		return fmt.Errorf("writing %s: %w", keyFile, err)
	}
	if err := cert.WriteCert(certFile, certPEM); err != nil {
		return fmt.Errorf("writing %s: %w", certFile, err)
	}
	return nil
}
