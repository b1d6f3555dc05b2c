package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// pluginDir holds the real plugin binary, built once: the tests drive it as a
// runtime does, through libcni.
var pluginDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mizar-cni-bin-")
	if err != nil {
		panic(err)
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "mizar"), "mizar.dev/cmd/cni").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the plugin: %v\n%s", err, out)
		os.Exit(1)
	}
	pluginDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

type fixture struct {
	cni    *libcni.CNIConfig
	socket string
	queue  string
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	return &fixture{
		cni:    libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(dir, "cache"), nil),
		socket: filepath.Join(dir, "agent.sock"),
		queue:  filepath.Join(dir, "queue"),
	}
}

func (f *fixture) conflist(t *testing.T, ver, extra string) *libcni.NetworkConfigList {
	t.Helper()
	s := fmt.Sprintf(`{"cniVersion": %q, "name": "mizar-test", "plugins": [{"type": "mizar", "vpc": "v1", "subnet": "s1",
		"agentSocket": %q, "deleteQueue": %q %s}]}`, ver, f.socket, f.queue, extra)
	l, err := libcni.ConfListFromBytes([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func rt(id string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: "/var/run/netns/none-" + id, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "ns1"}, {"K8S_POD_NAME", "pod-" + id}}}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error, got %T %v", err, err)
	}
	return e.Code
}

func TestVersionAdvertised(t *testing.T) {
	f := newFixture(t)
	info, err := f.cni.GetVersionInfo(context.Background(), "mizar")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.SupportedVersions(); !slices.Equal(got, versions) {
		t.Fatalf("plugin advertises %v, want %v", got, versions)
	}
}

// With no agent: STATUS says "not available" (50), ADD says "try again later"
// (11), and DEL succeeds by queueing, once per attachment however often it is
// repeated; the agent's Drain then carries it out.
func TestAgentDown(t *testing.T) {
	ctx := context.Background()
	for _, ver := range versions {
		t.Run(ver, func(t *testing.T) {
			f := newFixture(t)
			l := f.conflist(t, ver, "")
			if ver == "1.1.0" {
				if got := cniCode(t, f.cni.GetStatusNetworkList(ctx, l)); got != 50 {
					t.Errorf("STATUS with the agent down: code %d, want 50", got)
				}
			}
			if _, err := f.cni.AddNetworkList(ctx, l, rt("c1")); cniCode(t, err) != types.ErrTryAgainLater {
				t.Errorf("ADD with the agent down: %v, want code 11", err)
			} else if !strings.Contains(err.Error(), "mizar-nodeagent is not running") {
				t.Errorf("ADD error does not say what to do: %v", err)
			}
			for range 2 {
				if err := f.cni.DelNetworkList(ctx, l, rt("c1")); err != nil {
					t.Fatalf("DEL with the agent down: %v", err)
				}
			}
			if err := f.cni.DelNetworkList(ctx, l, rt("c2")); err != nil {
				t.Fatalf("DEL with the agent down: %v", err)
			}
			var got []string
			if err := Drain(f.queue, func(r *Request) error {
				got = append(got, r.ContainerID+"/"+r.IfName)
				if r.Command != CmdDel || len(r.Config) == 0 {
					t.Errorf("queued request %+v lacks its command or config", r)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			if !slices.Equal(got, []string{"c1/eth0", "c2/eth0"}) {
				t.Errorf("drained %v, want c1/eth0 and c2/eth0 once each", got)
			}
			if left, _ := os.ReadDir(f.queue); len(left) != 0 {
				t.Errorf("%d entries left in the queue after a successful drain", len(left))
			}
		})
	}
}

// A failed drain keeps the entry for the next start.
func TestDrainKeepsFailures(t *testing.T) {
	dir := t.TempDir()
	if err := Enqueue(dir, &Request{ContainerID: "c", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := Drain(dir, func(*Request) error { return errors.New("apiserver away") }); err == nil {
		t.Fatal("Drain hid the failure")
	}
	n := 0
	if err := Drain(dir, func(*Request) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("second drain: %v, %d deletes, want 1", err, n)
	}
}

func TestBadConflist(t *testing.T) {
	f := newFixture(t)
	l, err := libcni.ConfListFromBytes([]byte(`{"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "mizar", "vpc": "v1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.cni.AddNetworkList(context.Background(), l, rt("c"))
	if cniCode(t, err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), `"subnet"`) {
		t.Fatalf("ADD without a subnet: %v, want code 7 naming \"subnet\"", err)
	}
}

// echoAgent answers as an agent would, to test the plugin's side of the
// protocol: result conversion per spec version and error pass-through.
type echoAgent struct{ reqs chan *Request }

func (a *echoAgent) Handle(_ context.Context, r *Request) (json.RawMessage, *types.Error) {
	a.reqs <- r
	switch r.Command {
	case CmdAdd:
		idx := 1
		res := &types100.Result{CNIVersion: "1.1.0",
			Interfaces: []*types100.Interface{{Name: "mz1234", Mac: "02:00:00:00:00:01"}, {Name: r.IfName, Mac: "02:00:00:00:00:02", Sandbox: r.Netns}},
			IPs:        []*types100.IPConfig{{Interface: &idx, Address: net.IPNet{IP: net.IPv4(10, 0, 0, 5), Mask: net.CIDRMask(24, 32)}, Gateway: net.IPv4(10, 0, 0, 1)}},
		}
		b, _ := json.Marshal(res)
		return b, nil
	case CmdCheck:
		return nil, types.NewError(types.ErrUnknownContainer, "endpoint gone", "")
	}
	return nil, nil
}

func TestProtocol(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFixture(t)
	ln, err := Listen(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(f.socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", st.Mode(), err)
	}
	a := &echoAgent{reqs: make(chan *Request, 16)}
	done := make(chan error)
	go func() { done <- Serve(ctx, ln, a) }()
	for _, ver := range versions {
		l := f.conflist(t, ver, "")
		res, err := f.cni.AddNetworkList(ctx, l, rt("c-"+ver))
		if err != nil {
			t.Fatalf("%s ADD: %v", ver, err)
		}
		if res.Version() != ver {
			t.Errorf("ADD at %s printed a %s result", ver, res.Version())
		}
		r100, err := types100.GetResult(res)
		if err != nil || len(r100.IPs) != 1 || r100.IPs[0].Address.String() != "10.0.0.5/24" {
			t.Errorf("%s ADD result %v (%v)", ver, res, err)
		}
		req := <-a.reqs
		if req.Command != CmdAdd || req.ContainerID != "c-"+ver || !strings.Contains(req.Args, "K8S_POD_NAME=pod-c-"+ver) {
			t.Errorf("agent got %+v", req)
		}
		if ver != "0.3.1" {
			if err := f.cni.CheckNetworkList(ctx, l, rt("c-"+ver)); cniCode(t, err) != types.ErrUnknownContainer {
				t.Errorf("%s CHECK: %v, want the agent's code 3", ver, err)
			}
			<-a.reqs
		}
		if err := f.cni.DelNetworkList(ctx, l, rt("c-"+ver)); err != nil {
			t.Errorf("%s DEL: %v", ver, err)
		}
		<-a.reqs
	}
	if left, _ := os.ReadDir(f.queue); len(left) != 0 {
		t.Errorf("DEL was queued although the agent answered")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
