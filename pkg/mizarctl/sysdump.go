package mizarctl

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// SysdumpOptions say what goes into a sysdump besides the API's objects
// and every --agent's state.
type SysdumpOptions struct {
	// Logs maps a droplet to its agent's log file on this machine (agents
	// run as processes, as in make up).
	Logs map[string]string
	// PodSelector selects the pods whose logs are read through the API (the
	// agents, API server and etcd of a Helm install); empty: none.
	PodSelector string
	// MaxLog bounds each log's bytes (its tail is kept); 0 means 8 MiB.
	MaxLog int64
}

// Sysdump writes one gzipped tarball of what a bug report needs: the status
// report, every networking and broker object, Kubernetes Events, versions,
// and from every agent its datapath state (programs, counters, every map
// entry), drop events, metrics and health, and the logs asked for. What
// cannot be read is listed in errors.txt instead: a sysdump of a broken
// cluster is the one most needed. It returns the tarball's file names.
func Sysdump(ctx context.Context, cfg *rest.Config, agents *Agents, o SysdumpOptions, w io.Writer) ([]string, error) {
	if o.MaxLog == 0 {
		o.MaxLog = 8 << 20
	}
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	dir := "mizar-sysdump-" + time.Now().UTC().Format("20060102-150405") + "/"
	var names, errs []string
	now := time.Now()
	add := func(name string, b []byte) error {
		names = append(names, dir+name)
		if err := tw.WriteHeader(&tar.Header{Name: dir + name, Mode: 0o644, Size: int64(len(b)), ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	fail := func(what string, err error) { errs = append(errs, fmt.Sprintf("%s: %v", what, err)) }
	jsonOf := func(v any) []byte {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return []byte(err.Error())
		}
		return append(b, '\n')
	}

	var version strings.Builder
	if bi, ok := debug.ReadBuildInfo(); ok {
		fmt.Fprintf(&version, "mizarctl: %s %s\n", bi.Main.Version, bi.GoVersion)
		for _, s := range bi.Settings {
			if strings.HasPrefix(s.Key, "vcs.") {
				fmt.Fprintf(&version, "  %s=%s\n", s.Key, s.Value)
			}
		}
	}
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if v, err := c.Discovery().ServerVersion(); err != nil {
		fail("server version", err)
	} else {
		fmt.Fprintf(&version, "server: %s (%s)\n", v.GitVersion, v.Platform)
	}
	if err := add("version.txt", []byte(version.String())); err != nil {
		return names, err
	}

	if r, err := Status(ctx, c); err != nil {
		fail("status", err)
	} else {
		var b bytes.Buffer
		_ = r.Print(&b)
		if err := add("status.txt", b.Bytes()); err != nil {
			return names, err
		}
	}
	n, b := c.NetworkingV1alpha1(), c.BrokerV1alpha1()
	lo := metav1.ListOptions{}
	objects := []struct {
		name string
		list func() (any, error)
	}{
		{"vpcs", func() (any, error) { return n.Vpcs().List(ctx, lo) }},
		{"subnets", func() (any, error) { return n.Subnets().List(ctx, lo) }},
		{"droplets", func() (any, error) { return n.Droplets().List(ctx, lo) }},
		{"bouncers", func() (any, error) { return n.Bouncers().List(ctx, lo) }},
		{"dividers", func() (any, error) { return n.Dividers().List(ctx, lo) }},
		{"endpoints", func() (any, error) { return n.Endpoints("").List(ctx, lo) }},
		{"serviceclasses", func() (any, error) { return b.ServiceClasses().List(ctx, lo) }},
		{"serviceinstances", func() (any, error) { return b.ServiceInstances("").List(ctx, lo) }},
		{"servicebindings", func() (any, error) { return b.ServiceBindings("").List(ctx, lo) }},
	}
	for _, obj := range objects {
		l, err := obj.list()
		if err != nil {
			fail("list "+obj.name, err)
			continue
		}
		if err := add("objects/"+obj.name+".json", jsonOf(l)); err != nil {
			return names, err
		}
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return names, err
	}
	if ev, err := kc.CoreV1().Events("").List(ctx, lo); err != nil {
		fail("list events", err)
	} else {
		var lines []string
		for _, e := range ev.Items {
			lines = append(lines, fmt.Sprintf("%s\t%s\t%s/%s %s\t%s\t%s\tx%d", e.LastTimestamp.UTC().Format(time.RFC3339), e.Type,
				e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Reason, e.Message, e.Count))
		}
		slices.Sort(lines)
		if err := add("events.txt", []byte(strings.Join(lines, "\n")+"\n")); err != nil {
			return names, err
		}
	}

	for _, d := range agents.Names() {
		for _, f := range []struct{ file, path string }{
			{"state.txt", agentapi.PathState}, {"drops.json", agentapi.PathDrops}, {"metrics.txt", "/metrics"}, {"healthz.txt", "/healthz"},
		} {
			var body []byte
			if err := agents.call(ctx, d, f.path, nil, &body); err != nil {
				fail("agent "+d+" "+f.path, err)
				if f.path != "/healthz" {
					continue
				}
				body = []byte(err.Error() + "\n")
			}
			if err := add("agents/"+d+"/"+f.file, body); err != nil {
				return names, err
			}
		}
	}
	logNames := make([]string, 0, len(o.Logs))
	for d := range o.Logs {
		logNames = append(logNames, d)
	}
	slices.Sort(logNames)
	for _, d := range logNames {
		body, err := tail(o.Logs[d], o.MaxLog)
		if err != nil {
			fail("log of "+d, err)
			continue
		}
		if err := add("logs/"+d+".log", body); err != nil {
			return names, err
		}
	}
	if o.PodSelector != "" {
		pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: o.PodSelector})
		if err != nil {
			fail("list pods "+o.PodSelector, err)
		} else {
			for _, p := range pods.Items {
				for _, ctr := range p.Spec.Containers {
					body, err := kc.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name, LimitBytes: &o.MaxLog}).DoRaw(ctx)
					if err != nil {
						fail(fmt.Sprintf("log of %s/%s %s", p.Namespace, p.Name, ctr.Name), err)
						continue
					}
					if err := add(fmt.Sprintf("logs/pods/%s_%s_%s.log", p.Namespace, p.Name, ctr.Name), body); err != nil {
						return names, err
					}
				}
			}
		}
	}
	if len(errs) > 0 {
		if err := add("errors.txt", []byte(strings.Join(errs, "\n")+"\n")); err != nil {
			return names, err
		}
	}
	if err := tw.Close(); err != nil {
		return names, err
	}
	return names, zw.Close()
}

// tail reads the last max bytes of a file.
func tail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, max))
}
