package apiserver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"mizar.dev/pkg/apis/networking"
)

// standaloneIgnores says whether a flag does nothing with --standalone: the mode
// has its own CA and authorizer and no kube-apiserver to delegate to or read from.
func standaloneIgnores(name string) bool {
	for _, prefix := range []string{"authentication-", "authorization-", "requestheader-", "admission-", "enable-admission-plugins", "disable-admission-plugins"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	switch name {
	case "kubeconfig", "client-ca-file", "cert-dir", "alternate-dns",
		"tls-cert-file", "tls-private-key-file", "tls-sni-cert-key":
		return true
	}
	return false
}

// checkModeFlags refuses flags that would do nothing in the chosen mode, so a
// setting never looks applied when it is not.
func (o *Options) checkModeFlags() error {
	if o.flags == nil {
		return nil
	}
	var problems []string
	refuse := func(flags []string, why string) {
		if len(flags) == 0 {
			return
		}
		sort.Strings(flags)
		verb := "has"
		if len(flags) > 1 {
			verb = "have"
		}
		problems = append(problems, fmt.Sprintf("%s %s no effect: %s", strings.Join(flags, ", "), verb, why))
	}
	if o.Standalone {
		var ignored []string
		o.flags.Visit(func(f *pflag.Flag) {
			if standaloneIgnores(f.Name) {
				ignored = append(ignored, "--"+f.Name)
			}
		})
		refuse(ignored, "--standalone uses its own CA, client certificates and serving certificate, and no kube-apiserver")
	} else if o.set("alternate-dns") && o.Recommended.SecureServing.ServerCert.CertKey.CertFile != "" {
		refuse([]string{"--alternate-dns"}, "it names a self-signed certificate, and --tls-cert-file replaces that")
	}
	if len(o.Recommended.Etcd.StorageConfig.Transport.ServerList) > 0 && o.set("embedded-etcd-unsafe-no-fsync") {
		refuse([]string{"--embedded-etcd-unsafe-no-fsync"}, "it applies to the embedded etcd, unused with --etcd-servers")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s; drop them", strings.Join(problems, "; "))
}

// checkOldPrefix refuses to start on the default prefix when the objects of an
// older mizar sit under the old default and none under the new: serving an
// empty API over them would look like data loss.
func (o *Options) checkOldPrefix(ctx context.Context, c *clientv3.Client) error {
	if o.set("etcd-prefix") || o.EtcdPrefix() != DefaultEtcdPrefix {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Objects only: the old lock records already sat under /mizar/locks/.
	count := func(prefix string) (int64, error) {
		r, err := c.Get(ctx, prefix+"/"+networking.GroupName+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if errors.Is(err, rpctypes.ErrPermissionDenied) {
			// An etcd role limited to the new prefix (artifacts/etcd): nothing old to serve.
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("looking for objects under %s in etcd: %w", prefix, err)
		}
		return r.Count, nil
	}
	old, err := count(oldEtcdPrefix)
	if err != nil || old == 0 {
		return err
	}
	cur, err := count(DefaultEtcdPrefix)
	if err != nil || cur > 0 {
		return err
	}
	return fmt.Errorf("etcd holds %d objects under %s, where earlier mizar releases stored objects, and none under the new default prefix %s: "+
		"pass --etcd-prefix %s to keep serving them", old, oldEtcdPrefix, DefaultEtcdPrefix, oldEtcdPrefix)
}
