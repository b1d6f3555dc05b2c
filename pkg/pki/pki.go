// Package pki is a small file-backed certificate authority: it creates a CA once
// and issues leaf certificates from it, reusing files across restarts and
// reissuing leaves that near expiry. The standalone server uses it for its
// serving and admin certificates; tests use it for TLS etcd.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

const (
	leafValidity = 365 * 24 * time.Hour
	// renewBefore reissues a leaf certificate this long before it expires.
	renewBefore = 30 * 24 * time.Hour
)

// CA is a certificate authority whose certificate and key live in files.
type CA struct {
	Cert *x509.Certificate
	// PEM is the encoded certificate, as clients need it in a CA bundle.
	PEM []byte
	key crypto.Signer
}

// LoadOrCreateCA reads the CA in certFile/keyFile, or creates one there.
func LoadOrCreateCA(certFile, keyFile, commonName string) (*CA, error) {
	certs, err := cert.CertsFromFile(certFile)
	if err == nil {
		key, err := keyutil.PrivateKeyFromFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA key: %w", err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("CA key in %s cannot sign", keyFile)
		}
		pem, err := os.ReadFile(certFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA: %w", err)
		}
		return &CA{Cert: certs[0], PEM: pem, key: signer}, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: commonName}, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA: %w", err)
	}
	ca := &CA{Cert: c, PEM: encodeCert(c), key: key}
	return ca, writeKeyPair(certFile, keyFile, ca.PEM, key)
}

// EnsureCert issues template from the CA into certFile/keyFile unless a valid
// certificate of this CA, not near expiry, is already there. The template names
// the subject, SANs and extended key usages; serial, validity and key are filled in.
func (ca *CA) EnsureCert(certFile, keyFile string, template x509.Certificate) error {
	if certs, err := cert.CertsFromFile(certFile); err == nil {
		c := certs[0]
		if c.CheckSignatureFrom(ca.Cert) == nil && time.Until(c.NotAfter) > renewBefore {
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
	der, err := x509.CreateCertificate(rand.Reader, &template, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return fmt.Errorf("signing %s: %w", template.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parsing issued certificate: %w", err)
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
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(certFile), err)
	}
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
