module mizar.dev

go 1.25.0

tool github.com/cilium/ebpf/cmd/bpf2go

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containernetworking/plugins v1.9.1
	github.com/gopacket/gopacket v1.7.7
	github.com/safchain/ethtool v0.7.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.45.0
)

require golang.org/x/net v0.55.0 // indirect
