// Package etcd is mizar's own etcd: the single member a standalone server embeds,
// the client the server's own components use beside the apiserver storage, and
// the etcd client behind claims (package claim).
package etcd

import (
	"fmt"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apiserver/pkg/storage/storagebackend"
)

// NewClient connects to the etcd cluster the apiserver stores objects in, with the
// same endpoints and TLS client identity (--etcd-servers, --etcd-cafile, ...).
func NewClient(tc storagebackend.TransportConfig) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   tc.ServerList,
		DialTimeout: 20 * time.Second,
		Logger:      zap.NewNop(),
	}
	if tc.CertFile != "" || tc.KeyFile != "" || tc.TrustedCAFile != "" {
		tlsInfo := transport.TLSInfo{CertFile: tc.CertFile, KeyFile: tc.KeyFile, TrustedCAFile: tc.TrustedCAFile}
		tlsConfig, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd client TLS: %w", err)
		}
		cfg.TLS = tlsConfig
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", tc.ServerList, err)
	}
	return c, nil
}
