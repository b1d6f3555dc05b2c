// Package cluster runs a local Kubernetes control plane with mizar-apiserver
// aggregated into it, the way a cluster runs it: etcd (TLS, client
// certificates) and kube-apiserver (RBAC on, front-proxy CA and client
// certificate, --enable-aggregator-routing), and mizar-apiserver as a separate process on its own etcd over TLS with a client
// certificate, reached through an APIService with a real caBundle.
//
// kube-apiserver refuses loopback addresses in EndpointSlices, so mizar-apiserver
// and its etcd run in a network namespace the cluster creates, at an address on
// a veth pair; kube-apiserver listens on the host end. This needs root.
// Stop removes every process and the namespace, also after a failed Start.
package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/util/keyutil"

	"mizar.dev/pkg/pki"
)

const (
	// Namespace and Service are where the APIService points, as in artifacts/deploy.
	Namespace = "mizar-system"
	Service   = "mizar-apiserver"
	// ServiceAccountUser is the identity mizar-apiserver uses towards
	// kube-apiserver: the user name of the ServiceAccount artifacts/deploy binds.
	ServiceAccountUser = "system:serviceaccount:mizar-system:mizar-apiserver"
	mizarPort          = 8443
	stopTimeout        = 20 * time.Second
)

// Options names the binaries and where the cluster keeps its files.
type Options struct {
	// Dir holds certificates, kubeconfigs, data and logs. Keep it short.
	Dir string
	// Binaries. KubeControllerManager is optional (it runs the ClusterRole
	// aggregation and namespace controllers when given).
	Etcd, KubeAPIServer, KubeControllerManager, MizarAPIServer, Kubectl string
	// Manifests are applied after kube-apiserver is ready and before
	// mizar-apiserver starts (its namespace and RBAC, from artifacts/deploy).
	Manifests []string
	// MizarArgs are extra mizar-apiserver flags.
	MizarArgs []string
}

// Cluster is a running control plane.
type Cluster struct {
	opts Options
	// AdminKubeconfig talks to kube-apiserver as system:masters.
	AdminKubeconfig string
	// DirectKubeconfig talks to mizar-apiserver directly (same admin client
	// certificate, which mizar accepts through delegated authentication).
	DirectKubeconfig string
	// KubeURL and MizarURL are the two servers' addresses.
	KubeURL, MizarURL string
	// MizarCA is the CA of mizar-apiserver's serving certificate (the caBundle).
	MizarCA []byte

	netns            string
	hostIP, nsIP     string
	mizarKubeconfig  string
	mu               sync.Mutex
	procs            []*Proc
	mizar            *Proc
	mizarEtcdClients string
}

// Start brings the whole control plane up, or cleans up and returns the error.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	c := &Cluster{opts: opts}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	for _, d := range []string{"pki", "logs", "data"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := c.makeNetns(); err != nil {
		return nil, err
	}
	if err := c.makePKI(); err != nil {
		return nil, err
	}
	if err := c.startKube(ctx); err != nil {
		return nil, err
	}
	if len(opts.Manifests) > 0 {
		args := []string{"apply"}
		for _, m := range opts.Manifests {
			args = append(args, "-f", m)
		}
		if _, err := c.Kubectl(ctx, args...); err != nil {
			return nil, err
		}
	}
	if err := c.startMizarEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.StartMizar(ctx); err != nil {
		return nil, err
	}
	if err := c.ApplyAggregation(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// ApplyAggregation (re)creates the Service, EndpointSlice and APIService that
// route kube-apiserver to mizar-apiserver, and waits until it is Available.
func (c *Cluster) ApplyAggregation(ctx context.Context) error {
	if _, err := c.KubectlStdin(ctx, c.aggregationManifest(), "apply", "-f", "-"); err != nil {
		return err
	}
	return c.WaitAPIService(ctx, true)
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.opts.Dir}, elem...)...)
}

// removeStaleNetns deletes namespaces left by runs whose process is gone (a
// test binary killed before its cleanup ran; its servers died with it).
func removeStaleNetns() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		var pid, n int
		if _, err := fmt.Sscanf(e.Name(), "mizar-e2e-%d-%d", &pid, &n); err != nil {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// makeNetns creates a namespace joined to the host by a veth pair on a free /30.
func (c *Cluster) makeNetns() error {
	removeStaleNetns()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("listing host addresses: %w", err)
	}
	used := map[string]bool{}
	for _, a := range addrs {
		used[a.String()] = true
	}
	// 10.251.<n>.0/30 per cluster; the pid spreads concurrent runs apart.
	var n int
	for i := 0; i < 256; i++ {
		n = (os.Getpid() + i) % 256
		if !used[fmt.Sprintf("10.251.%d.1/30", n)] {
			break
		}
	}
	c.hostIP, c.nsIP = fmt.Sprintf("10.251.%d.1", n), fmt.Sprintf("10.251.%d.2", n)
	c.netns = fmt.Sprintf("mizar-e2e-%d-%d", os.Getpid(), n)
	host, peer := fmt.Sprintf("mze%dh%d", n, os.Getpid()%1000), fmt.Sprintf("mze%dn", n)
	steps := [][]string{
		{"netns", "add", c.netns},
		{"link", "add", host, "type", "veth", "peer", "name", peer, "netns", c.netns},
		{"addr", "add", c.hostIP + "/30", "dev", host},
		{"link", "set", host, "up"},
		{"-n", c.netns, "addr", "add", c.nsIP + "/30", "dev", peer},
		{"-n", c.netns, "link", "set", peer, "up"},
		{"-n", c.netns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			if s[1] == "add" && s[0] == "netns" {
				c.netns = "" // nothing to delete
			}
			return fmt.Errorf("ip %s: %w: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}

type leaf struct {
	name string
	ca   *pki.CA
	tmpl x509.Certificate
}

// makePKI issues every certificate the processes need. Separate CAs for
// clients, the front proxy (never the client CA), etcd and mizar's serving cert.
func (c *Cluster) makePKI() error {
	p := func(n string) string { return c.path("pki", n) }
	cas := map[string]*pki.CA{}
	for _, n := range []string{"ca", "front-proxy-ca", "etcd-ca", "kube-etcd-ca", "mizar-ca"} {
		ca, err := pki.LoadOrCreateCA(p(n+".crt"), p(n+".key"), "mizar-e2e-"+n)
		if err != nil {
			return fmt.Errorf("creating %s: %w", n, err)
		}
		cas[n] = ca
	}
	c.MizarCA = cas["mizar-ca"].PEM
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	loop := net.IPv4(127, 0, 0, 1)
	leaves := []leaf{
		{"kube-apiserver", cas["ca"], x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: server,
			IPAddresses: []net.IP{net.ParseIP(c.hostIP), loop}, DNSNames: []string{"kubernetes", "kubernetes.default.svc", "localhost"}}},
		{"admin", cas["ca"], x509.Certificate{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}}, ExtKeyUsage: client}},
		{"mizar-sa", cas["ca"], x509.Certificate{Subject: pkix.Name{CommonName: ServiceAccountUser}, ExtKeyUsage: client}},
		{"kcm", cas["ca"], x509.Certificate{Subject: pkix.Name{CommonName: "system:kube-controller-manager"}, ExtKeyUsage: client}},
		{"front-proxy-client", cas["front-proxy-ca"], x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: client}},
		{"etcd-server", cas["etcd-ca"], x509.Certificate{Subject: pkix.Name{CommonName: "etcd"}, ExtKeyUsage: append(server, client...),
			IPAddresses: []net.IP{loop}, DNSNames: []string{"localhost"}}},
		{"etcd-client", cas["etcd-ca"], x509.Certificate{Subject: pkix.Name{CommonName: "mizar-apiserver"}, ExtKeyUsage: client}},
		// kube-apiserver's etcd has its own CA: mizar's etcd client certificate must not open it.
		{"kube-etcd-server", cas["kube-etcd-ca"], x509.Certificate{Subject: pkix.Name{CommonName: "etcd"}, ExtKeyUsage: append(server, client...),
			IPAddresses: []net.IP{loop}, DNSNames: []string{"localhost"}}},
		{"kube-etcd-client", cas["kube-etcd-ca"], x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: client}},
		// The aggregator checks the name <service>.<namespace>.svc.
		{"mizar-serving", cas["mizar-ca"], x509.Certificate{Subject: pkix.Name{CommonName: Service}, ExtKeyUsage: server,
			DNSNames:    []string{Service + "." + Namespace + ".svc", "localhost"},
			IPAddresses: []net.IP{net.ParseIP(c.nsIP)}}},
	}
	for _, l := range leaves {
		if err := l.ca.EnsureCert(p(l.name+".crt"), p(l.name+".key"), l.tmpl); err != nil {
			return fmt.Errorf("issuing %s: %w", l.name, err)
		}
	}
	saKey, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return fmt.Errorf("generating the service account key: %w", err)
	}
	if err := os.WriteFile(p("sa.key"), saKey, 0o600); err != nil {
		return fmt.Errorf("writing the service account key: %w", err)
	}
	return nil
}

func (c *Cluster) writeKubeconfig(file, server, caFile, user string) error {
	p := func(n string) string { return c.path("pki", n) }
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: u
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, server, caFile, p(user+".crt"), p(user+".key"))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startKube(ctx context.Context) error {
	p := func(n string) string { return c.path("pki", n) }
	var ports [3]int
	for i := range ports {
		host := "127.0.0.1"
		if i == 2 {
			host = c.hostIP
		}
		var err error
		if ports[i], err = freePort(host); err != nil {
			return err
		}
	}
	// kube-apiserver's etcd takes TLS with client certificates, as production
	// clusters run it and as mizar's own etcd does: the CRD baseline of
	// bench-aggregated pays for the same transport as mizar.
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if _, err := c.start("etcd", false, c.opts.Etcd, "--name=kube", "--data-dir="+c.path("data", "kube-etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=kube="+peerURL,
		"--cert-file="+p("kube-etcd-server.crt"), "--key-file="+p("kube-etcd-server.key"),
		"--client-cert-auth", "--trusted-ca-file="+p("kube-etcd-ca.crt"),
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	c.KubeURL = fmt.Sprintf("https://%s:%d", c.hostIP, ports[2])
	if _, err := c.start("kube-apiserver", false, c.opts.KubeAPIServer,
		"--etcd-servers="+etcdURL,
		"--etcd-cafile="+p("kube-etcd-ca.crt"), "--etcd-certfile="+p("kube-etcd-client.crt"), "--etcd-keyfile="+p("kube-etcd-client.key"),
		"--bind-address="+c.hostIP, "--advertise-address="+c.hostIP, "--secure-port="+strconv.Itoa(ports[2]),
		"--cert-dir="+c.path("data", "kube-certs"),
		"--tls-cert-file="+p("kube-apiserver.crt"), "--tls-private-key-file="+p("kube-apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p("sa.key"), "--service-account-signing-key-file="+p("sa.key"),
		"--endpoint-reconciler-type=none",
		// Aggregation: kube-apiserver proxies as front-proxy-client and tells the
		// backend who the user is in these headers.
		"--requestheader-client-ca-file="+p("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p("front-proxy-client.crt"), "--proxy-client-key-file="+p("front-proxy-client.key"),
		"--enable-aggregator-routing=true",
		// The node agent's DaemonSet is privileged (it loads BPF programs), as CNI agents are.
		"--allow-privileged=true",
	); err != nil {
		return err
	}
	c.AdminKubeconfig = c.path("admin.kubeconfig")
	if err := c.writeKubeconfig(c.AdminKubeconfig, c.KubeURL, p("ca.crt"), "admin"); err != nil {
		return err
	}
	if err := c.waitReady(ctx, "kube-apiserver", c.KubeURL, p("ca.crt")); err != nil {
		return err
	}
	if c.opts.KubeControllerManager != "" {
		kcm := c.path("kcm.kubeconfig")
		if err := c.writeKubeconfig(kcm, c.KubeURL, p("ca.crt"), "kcm"); err != nil {
			return err
		}
		// Only what mizar's users meet: aggregated ClusterRoles, namespace deletion, GC.
		if _, err := c.start("kube-controller-manager", false, c.opts.KubeControllerManager,
			"--kubeconfig="+kcm, "--authentication-kubeconfig="+kcm, "--authorization-kubeconfig="+kcm,
			"--controllers=clusterrole-aggregation,namespace,garbagecollector",
			// Each controller acts as its own ServiceAccount (TokenRequest), with the
			// bootstrap RBAC roles kube-apiserver creates for them, as in kubeadm clusters.
			"--use-service-account-credentials=true",
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"); err != nil {
			return err
		}
	}
	return nil
}

// startMizarEtcd runs mizar's own etcd in the namespace, TLS with client certificates only.
func (c *Cluster) startMizarEtcd(ctx context.Context) error {
	p := func(n string) string { return c.path("pki", n) }
	c.mizarEtcdClients = "https://127.0.0.1:2379"
	peer := "http://127.0.0.1:2380"
	_, err := c.start("mizar-etcd", true, c.opts.Etcd, "--name=mizar", "--data-dir="+c.path("data", "mizar-etcd"),
		"--listen-client-urls="+c.mizarEtcdClients, "--advertise-client-urls="+c.mizarEtcdClients,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=mizar="+peer,
		"--cert-file="+p("etcd-server.crt"), "--key-file="+p("etcd-server.key"),
		"--client-cert-auth", "--trusted-ca-file="+p("etcd-ca.crt"),
		"--unsafe-no-fsync", "--log-level=warn")
	return err
}

// StartMizar starts mizar-apiserver (again) and waits until it is ready.
func (c *Cluster) StartMizar(ctx context.Context) error {
	p := func(n string) string { return c.path("pki", n) }
	c.mizarKubeconfig = c.path("mizar.kubeconfig")
	if err := c.writeKubeconfig(c.mizarKubeconfig, c.KubeURL, p("ca.crt"), "mizar-sa"); err != nil {
		return err
	}
	c.MizarURL = fmt.Sprintf("https://%s:%d", c.nsIP, mizarPort)
	c.DirectKubeconfig = c.path("direct.kubeconfig")
	if err := c.writeKubeconfig(c.DirectKubeconfig, c.MizarURL, p("mizar-ca.crt"), "admin"); err != nil {
		return err
	}
	args := append([]string{
		"--bind-address=" + c.nsIP, "--secure-port=" + strconv.Itoa(mizarPort),
		"--tls-cert-file=" + p("mizar-serving.crt"), "--tls-private-key-file=" + p("mizar-serving.key"),
		"--etcd-servers=" + c.mizarEtcdClients,
		"--etcd-cafile=" + p("etcd-ca.crt"), "--etcd-certfile=" + p("etcd-client.crt"), "--etcd-keyfile=" + p("etcd-client.key"),
		"--authentication-kubeconfig=" + c.mizarKubeconfig, "--authorization-kubeconfig=" + c.mizarKubeconfig,
		"--kubeconfig=" + c.mizarKubeconfig,
		"--data-dir=" + c.path("data", "mizar"),
	}, c.opts.MizarArgs...)
	proc, err := c.start("mizar-apiserver", true, c.opts.MizarAPIServer, args...)
	if err != nil {
		return err
	}
	c.mizar = proc
	return c.waitReady(ctx, "mizar-apiserver", c.MizarURL, p("mizar-ca.crt"))
}

// StopMizar stops mizar-apiserver (SIGTERM, then SIGKILL after a while).
func (c *Cluster) StopMizar() error {
	if c.mizar == nil {
		return nil
	}
	err := c.mizar.Stop()
	c.mizar = nil
	return err
}

// MizarOutput is what the current mizar-apiserver printed.
func (c *Cluster) MizarOutput() string {
	if c.mizar == nil {
		return ""
	}
	b, _ := os.ReadFile(c.mizar.Log)
	return string(b)
}

// aggregationManifest is the Service, its EndpointSlice (the address in the
// namespace; a Deployment's pods would fill it in a cluster) and the APIService
// with mizar's serving CA as caBundle.
func (c *Cluster) aggregationManifest() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  ports: [{name: https, port: 443, targetPort: %[3]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-local
  namespace: %[2]s
  labels: {kubernetes.io/service-name: %[1]s, endpointslice.kubernetes.io/managed-by: mizar-e2e}
addressType: IPv4
endpoints: [{addresses: ["%[4]s"], conditions: {ready: true}}]
ports: [{name: https, port: %[3]d, protocol: TCP}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.networking.mizar.dev}
spec:
  group: networking.mizar.dev
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {name: %[1]s, namespace: %[2]s, port: 443}
  caBundle: %[5]s
`, Service, Namespace, mizarPort, c.nsIP, base64.StdEncoding.EncodeToString(c.MizarCA))
}

// WaitAPIService waits until the APIService's Available condition is want.
func (c *Cluster) WaitAPIService(ctx context.Context, want bool) error {
	cond := "condition=Available"
	if !want {
		cond = "condition=Available=False"
	}
	_, err := c.Kubectl(ctx, "wait", "--for="+cond, "--timeout=90s", "apiservice/v1alpha1.networking.mizar.dev")
	return err
}

// Kubectl runs the cluster's kubectl as admin against kube-apiserver.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, "", args...)
}

// KubectlStdin is Kubectl with stdin.
func (c *Cluster) KubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.opts.Kubectl, append([]string{"--kubeconfig", c.AdminKubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// waitReady polls url/readyz with the admin client certificate.
func (c *Cluster) waitReady(ctx context.Context, name, url, caFile string) error {
	return c.waitReadyAs(ctx, name, url, caFile, "")
}

// waitReadyAs is waitReady verifying the certificate for serverName (empty: the URL's host).
func (c *Cluster) waitReadyAs(ctx context.Context, name, url, caFile, serverName string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("reading %s: %w", caFile, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(c.path("pki", "admin.crt"), c.path("pki", "admin.key"))
	if err != nil {
		return fmt.Errorf("loading the admin certificate: %w", err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: serverName}}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		if p := c.proc(name); p != nil && p.Exited() {
			return fmt.Errorf("%s exited before it was ready: %v\n%s", name, p.Err(), p.Tail(40))
		}
		resp, err := client.Get(url + "/readyz")
		if err == nil {
			b := new(bytes.Buffer)
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s not ready at %s/readyz (last: %s)", name, url, last)
			if p := c.proc(name); p != nil {
				msg += "\n" + p.Tail(40)
			}
			return errors.New(msg)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stopOrder: the clients of mizar-apiserver's watches (kube-controller-manager's
// informers, proxied by kube-apiserver) go first, so mizar-apiserver shuts down
// without open watches; then mizar before the kube-apiserver its informers watch.
var stopOrder = []string{"kube-controller-manager", "mizar-apiserver-extra", "mizar-apiserver", "mizar-etcd", "kube-apiserver", "etcd"}

// Stop ends every process and deletes the namespace.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var errs []error
	for _, name := range stopOrder {
		for _, p := range procs {
			if p.Name != name {
				continue
			}
			if err := p.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.netns != "" {
		// Deleting the namespace removes the veth pair with it.
		if out, err := exec.Command("ip", "netns", "del", c.netns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting netns %s: %w: %s", c.netns, err, bytes.TrimSpace(out)))
		}
		c.netns = ""
	}
	return errors.Join(errs...)
}

// Proc returns the running process of that name (etcd, mizar-etcd,
// kube-apiserver, kube-controller-manager, mizar-apiserver), or nil.
func (c *Cluster) Proc(name string) *Proc { return c.proc(name) }

func (c *Cluster) proc(name string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].Name == name {
			return c.procs[i]
		}
	}
	return nil
}

// start runs bin with args, in the namespace when inNetns, logging to a file.
func (c *Cluster) start(name string, inNetns bool, bin string, args ...string) (*Proc, error) {
	if bin == "" {
		return nil, fmt.Errorf("no %s binary given", name)
	}
	var cmd *exec.Cmd
	if inNetns {
		// ip netns exec execs the binary in place: the pid is the server's own.
		cmd = exec.Command("ip", append([]string{"netns", "exec", c.netns, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	p, err := StartProc(name, c.path("logs", fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano())), cmd)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// StartMizarWithCert starts one more mizar-apiserver in the namespace, on
// port, serving certFile/keyFile (e.g. the certificate a Helm release
// generated), on the same etcd and identity as the cluster's own, and waits
// until it is ready. It returns the address to put in an EndpointSlice; Stop
// ends it with the rest.
func (c *Cluster) StartMizarWithCert(ctx context.Context, port int, certFile, keyFile, caFile, serverName string, extraArgs ...string) (string, error) {
	p := func(n string) string { return c.path("pki", n) }
	args := append([]string{
		"--bind-address=" + c.nsIP, "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile,
		"--etcd-servers=" + c.mizarEtcdClients,
		"--etcd-cafile=" + p("etcd-ca.crt"), "--etcd-certfile=" + p("etcd-client.crt"), "--etcd-keyfile=" + p("etcd-client.key"),
		"--authentication-kubeconfig=" + c.mizarKubeconfig, "--authorization-kubeconfig=" + c.mizarKubeconfig,
		"--kubeconfig=" + c.mizarKubeconfig,
		"--data-dir=" + c.path("data", fmt.Sprintf("mizar-%d", port)),
		// The cluster's own replica runs them.
		"--operators=false",
	}, extraArgs...)
	if _, err := c.start("mizar-apiserver-extra", true, c.opts.MizarAPIServer, args...); err != nil {
		return "", err
	}
	return c.nsIP, c.waitReadyAs(ctx, "mizar-apiserver-extra", fmt.Sprintf("https://%s:%d", c.nsIP, port), caFile, serverName)
}
