package nettest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// IperfSeconds is the length of one iperf3 test.
const IperfSeconds = 3

// Iperf runs `runs` single-stream iperf3 TCP tests of IperfSeconds each from
// the netns at srcNetns to an iperf3 server it starts (and stops) in the netns
// at dstNetns, bound to dstIP, and returns the best Gbit/s as the server
// received it. Best, not mean: on a shared machine other load only ever
// takes throughput away, so the best of a few short runs is the closest to
// what the path itself allows.
func Iperf(srcNetns, dstNetns, dstIP string, runs int) (float64, error) {
	const port = "5201"
	addr := net.JoinHostPort(dstIP, port)
	srv := exec.Command("iperf3", "-s", "-B", dstIP, "-p", port)
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	// Started from a thread inside the netns: the child is born there.
	if err := ns.WithNetNSPath(dstNetns, func(ns.NetNS) error { return srv.Start() }); err != nil {
		return 0, fmt.Errorf("iperf3 server in %s: %w", dstNetns, err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	// Wait until the server listens (a plain connect is harmless to it).
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dialIn(srcNetns, addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("iperf3 server on %s not reachable from %s: %w (server: %s)", addr, srcNetns, err, strings.TrimSpace(srvOut.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	var best float64
	for range runs {
		ctx, cancel := context.WithTimeout(context.Background(), (IperfSeconds+15)*time.Second)
		var out []byte
		err := ns.WithNetNSPath(srcNetns, func(ns.NetNS) error {
			var err error
			out, err = exec.CommandContext(ctx, "iperf3", "-c", dstIP, "-p", port, "-t", fmt.Sprint(IperfSeconds), "-J").CombinedOutput()
			return err
		})
		cancel()
		if err != nil {
			return 0, fmt.Errorf("iperf3 %s -> %s: %w\n%s", srcNetns, addr, err, out)
		}
		var res struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			return 0, fmt.Errorf("iperf3 JSON: %w\n%s", err, out)
		}
		best = max(best, res.End.SumReceived.BitsPerSecond/1e9)
	}
	return best, nil
}

// TCPRR measures the mean round trip, in µs, of `rounds` 1-byte
// request/response exchanges over one TCP connection (netperf TCP_RR style)
// from the netns at srcNetns to an echo listener it runs in the netns at
// dstNetns on dstIP, after 100 unmeasured ones (ARP, caches).
func TCPRR(srcNetns, dstNetns, dstIP string, rounds int) (float64, error) {
	var l net.Listener
	if err := ns.WithNetNSPath(dstNetns, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp4", net.JoinHostPort(dstIP, "7001"))
		return err
	}); err != nil {
		return 0, fmt.Errorf("echo listener in %s: %w", dstNetns, err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	c, err := dialIn(srcNetns, l.Addr().String(), 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("TCP_RR %s -> %s: %w", srcNetns, l.Addr(), err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Duration(rounds+100) * 10 * time.Millisecond))
	buf := []byte{1}
	exchange := func() error {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	}
	for range 100 {
		if err := exchange(); err != nil {
			return 0, fmt.Errorf("TCP_RR %s -> %s warm-up: %w", srcNetns, l.Addr(), err)
		}
	}
	start := time.Now()
	for range rounds {
		if err := exchange(); err != nil {
			return 0, fmt.Errorf("TCP_RR %s -> %s: %w", srcNetns, l.Addr(), err)
		}
	}
	return float64(time.Since(start).Microseconds()) / float64(rounds), nil
}

// dialIn opens a TCP connection from inside the netns at netnsPath (the
// socket stays there whichever thread uses it later).
func dialIn(netnsPath, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	})
	return c, err
}
