// Command pair-bench compares the CPU two mizar-apiserver binaries spend per
// Droplet create. It runs both standalone (each with its embedded etcd, so
// the numbers include etcd's share) and sends every create to both, one after
// the other, from the same 16 workers: on a shared machine whose load changes
// from minute to minute, both servers see the same load, and the ratio B/A is
// steady where two separate runs differ by tens of percent.
//
//	go build -o /tmp/a ./cmd/apiserver   # on the baseline, then on the change:
//	go build -o /tmp/b ./cmd/apiserver
//	go run ./hack/pair-bench -a /tmp/a -b /tmp/b
//
// Run it twice with -a and -b swapped: the order of the two creates is the
// only asymmetry. -profile DIR writes an 8 s CPU profile of each server
// (A.pprof, B.pprof) taken during the first round.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/test/cluster"
)

func main() {
	a := flag.String("a", "", "the baseline mizar-apiserver binary")
	b := flag.String("b", "", "the mizar-apiserver binary compared with it")
	creates := flag.Int("creates", 3000, "creates per server per round")
	rounds := flag.Int("rounds", 4, "measured rounds (after one warm-up round of 500)")
	profile := flag.String("profile", "", "directory for CPU profiles of both servers during the first round")
	flag.Parse()
	if *a == "" || *b == "" || *creates < 1 || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "pair-bench: -a and -b name the two binaries; -creates and -rounds must be positive")
		os.Exit(2)
	}
	if err := run(*a, *b, *creates, *rounds, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "pair-bench:", err)
		os.Exit(1)
	}
}

type server struct {
	name string
	cmd  *exec.Cmd
	kube kubernetes.Interface
	res  dynamic.ResourceInterface
}

func run(binA, binB string, creates, rounds int, profile string) error {
	root, err := os.MkdirTemp("", "pair-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	var servers []*server
	defer func() {
		for _, s := range servers {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			_ = s.cmd.Wait()
		}
	}()
	for _, x := range []struct{ name, bin string }{{"A", binA}, {"B", binB}} {
		s, err := start(x.name, x.bin, filepath.Join(root, x.name))
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	var next atomic.Int64
	if _, err := measure(servers, &next, 500); err != nil {
		return err
	}
	var sum [2]time.Duration
	for r := range rounds {
		var profiles sync.WaitGroup
		if profile != "" && r == 0 {
			for _, s := range servers {
				profiles.Go(func() {
					if err := takeProfile(s, filepath.Join(profile, s.name+".pprof")); err != nil {
						fmt.Fprintln(os.Stderr, "pair-bench:", err)
					}
				})
			}
		}
		cpu, err := measure(servers, &next, creates)
		profiles.Wait()
		if err != nil {
			return err
		}
		sum[0] += cpu[0]
		sum[1] += cpu[1]
		fmt.Printf("round %d: A %s/create, B %s/create, B/A %.3f\n", r, cpu[0].Round(time.Microsecond), cpu[1].Round(time.Microsecond),
			cpu[1].Seconds()/cpu[0].Seconds())
	}
	fmt.Printf("all rounds: A %s/create, B %s/create, B/A %.3f; peak RSS A %d MB, B %d MB\n",
		(sum[0] / time.Duration(rounds)).Round(time.Microsecond), (sum[1] / time.Duration(rounds)).Round(time.Microsecond), sum[1].Seconds()/sum[0].Seconds(),
		peakRSS(servers[0].cmd.Process.Pid), peakRSS(servers[1].cmd.Process.Pid))
	return nil
}

// start runs bin standalone in dir and waits until it serves Droplets.
func start(name, bin, dir string) (*server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "--standalone", "--data-dir", dir, "--secure-port", "0", "--embedded-etcd-unsafe-no-fsync")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &server{name: name, cmd: cmd}
	deadline := time.Now().Add(time.Minute)
	for {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s (%s) did not serve within a minute; its log is %s", name, bin, log.Name())
		}
		time.Sleep(100 * time.Millisecond)
		if s.res == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
			if err != nil {
				continue // not written yet
			}
			cfg.QPS, cfg.Burst = -1, 1000
			if s.kube, err = kubernetes.NewForConfig(cfg); err != nil {
				return nil, err
			}
			d, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return nil, err
			}
			s.res = d.Resource(schema.GroupVersionResource{Group: "networking.mizar.dev", Version: "v1alpha1", Resource: "droplets"})
		}
		if _, err := s.res.List(context.Background(), metav1.ListOptions{Limit: 1}); err == nil {
			return s, nil
		}
	}
}

// measure creates n Droplets on every server, each create sent to all of them
// in turn, and returns each server's CPU time per create.
func measure(servers []*server, next *atomic.Int64, n int) ([]time.Duration, error) {
	before := make([]time.Duration, len(servers))
	for i, s := range servers {
		t, err := cluster.ProcessCPUTime(s.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		before[i] = t
	}
	var started atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for started.Add(1) <= int64(n) && failed.Load() == nil {
				i := next.Add(1)
				obj := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "networking.mizar.dev/v1alpha1", "kind": "Droplet",
					"metadata": map[string]any{"name": fmt.Sprintf("pair-%d", i)},
					"spec": map[string]any{
						"node": fmt.Sprintf("node-%d", i), "interface": "eth0",
						"ip":  fmt.Sprintf("10.%d.%d.%d", i/62500%250+1, i/250%250, i%250+1),
						"mac": fmt.Sprintf("02:bb:%02x:%02x:%02x:%02x", i>>24&255, i>>16&255, i>>8&255, i&255),
					},
				}}
				for _, s := range servers {
					if _, err := s.res.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
						err = fmt.Errorf("create on %s: %w", s.name, err)
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return nil, *err
	}
	out := make([]time.Duration, len(servers))
	for i, s := range servers {
		t, err := cluster.ProcessCPUTime(s.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		out[i] = (t - before[i]) / time.Duration(n)
	}
	return out, nil
}

func takeProfile(s *server, path string) error {
	b, err := s.kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "8").DoRaw(context.Background())
	if err != nil {
		return fmt.Errorf("profiling %s: %w", s.name, err)
	}
	return os.WriteFile(path, b, 0o644)
}

// peakRSS is pid's peak resident set (VmHWM) in MB, 0 if unknown.
func peakRSS(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.Fields(v)[0])
			return kb / 1024
		}
	}
	return 0
}
