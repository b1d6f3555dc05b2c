package nodeagent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/dataplane"
)

// Prober answers agentapi.PathProbe: real pings from inside a pod of this
// node (its network namespace, as the CNI attachment records it), for
// mizarctl connectivity-test, which has no other way into pods that no
// kubelet runs.
type Prober struct {
	dp      *dataplane.Datapath
	pods    *DatapathPods
	cni     *CNIServer
	droplet string
}

// NewProber returns the handler of agentapi.PathProbe.
func NewProber(dp *dataplane.Datapath, pods *DatapathPods, cni *CNIServer, droplet string) *Prober {
	return &Prober{dp: dp, pods: pods, cni: cni, droplet: droplet}
}

func (p *Prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	resp := agentapi.ProbeResponse{Droplet: p.droplet}
	err := func() error {
		vni, err := strconv.ParseUint(q.Get("vni"), 10, 32)
		if err != nil {
			return fmt.Errorf("vni: %w", err)
		}
		ip, err := netip.ParseAddr(q.Get("ip"))
		if err != nil {
			return fmt.Errorf("ip: %w", err)
		}
		dst, err := netip.ParseAddr(q.Get("dst"))
		if err != nil || !dst.Is4() {
			return fmt.Errorf("dst: want an IPv4 address (%v)", err)
		}
		count := 3
		if s := q.Get("count"); s != "" {
			if count, err = strconv.Atoi(s); err != nil || count < 1 || count > 20 {
				return errors.New("count: 1 to 20")
			}
		}
		netns, err := p.netnsOf(uint32(vni), ip)
		if err != nil {
			return err
		}
		resp.Sent = count
		resp.Received, resp.RTT, err = ping(netns, dst, count, time.Second)
		return err
	}()
	if err != nil {
		resp.Error = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// netnsOf finds the network namespace of the pod (vni, ip) of this node.
func (p *Prober) netnsOf(vni uint32, ip netip.Addr) (string, error) {
	pis, err := p.dp.PodInterfaces()
	if err != nil {
		return "", err
	}
	for _, pi := range pis {
		if pi.VNI == vni && pi.IP == ip {
			return p.cni.netnsOfHostIfindex(pi.Ifindex)
		}
	}
	return "", fmt.Errorf("no pod %s of VNI %d on droplet %s", ip, vni, p.droplet)
}

// netnsOfHostIfindex is the netns of the attachment on record whose
// host-side veth has this ifindex.
func (s *CNIServer) netnsOfHostIfindex(ifindex int) (string, error) {
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return "", fmt.Errorf("read the attachment state: %w", err)
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if st, err := s.readState(id); err == nil && st.HostIfindex == ifindex && st.Netns != "" {
			return st.Netns, nil
		}
	}
	return "", fmt.Errorf("no attachment on record with host interface %d", ifindex)
}

// ping sends count ICMP echo requests from inside netns to dst, one at a
// time, each waiting up to timeout, and returns the replies and their mean
// round trip.
func ping(netns string, dst netip.Addr, count int, timeout time.Duration) (int, time.Duration, error) {
	var fd int
	if err := ns.WithNetNSPath(netns, func(ns.NetNS) (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("ICMP socket in %s: %w", netns, err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, 0, err
	}
	id := uint16(os.Getpid()) ^ uint16(time.Now().UnixNano())
	to := &unix.SockaddrInet4{Addr: dst.As4()}
	got := 0
	var total time.Duration
	buf := make([]byte, 1500)
	for seq := 1; seq <= count; seq++ {
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'm', 'i', 'z', 'a', 'r'}
		binary.BigEndian.PutUint16(msg[2:], dataplane.InternetChecksum(msg, 0))
		sent := time.Now()
		if err := unix.Sendto(fd, msg, 0, to); err != nil {
			return got, 0, fmt.Errorf("send to %s: %w", dst, err)
		}
		for time.Since(sent) < timeout {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // the 50 ms receive timeout
			}
			f, ok := from.(*unix.SockaddrInet4)
			if !ok || f.Addr != dst.As4() || n < 20 {
				continue
			}
			ihl := int(buf[0]&0xf) * 4
			if n < ihl+8 || buf[ihl] != 0 || binary.BigEndian.Uint16(buf[ihl+4:]) != id || binary.BigEndian.Uint16(buf[ihl+6:]) != uint16(seq) {
				continue
			}
			got++
			total += time.Since(sent)
			break
		}
	}
	if got == 0 {
		return 0, 0, nil
	}
	return got, total / time.Duration(got), nil
}
