// Package validation checks networking.mizar.dev objects. Static rules look at one
// object; relational rules (Validate*Relations) are handed the related objects by
// the registry, which reads them under a lock so concurrent creates cannot race.
package validation

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/ipam"
)

const (
	// MaxVNI is the largest 24-bit Geneve VNI.
	MaxVNI = 1<<24 - 1
	// MaxPrefixLength keeps room for a network, a gateway, one endpoint and a broadcast address.
	MaxPrefixLength = 29
	// MaxDividers and MaxBouncers bound the fan-out the dataplane maps hold per VPC / subnet.
	MaxDividers = 16
	MaxBouncers = 16
	// maxInterfaceName is IFNAMSIZ-1.
	maxInterfaceName = 15
)

var (
	specPath   = field.NewPath("spec")
	statusPath = field.NewPath("status")
	metaPath   = field.NewPath("metadata")

	validPhases = sets.New(networking.PhaseInit, networking.PhaseProvisioned, networking.PhaseTerminating, networking.PhaseFailed)

	// reservedRanges are IPv4 ranges whose addresses cannot be unicast hosts of a
	// VPC: a CIDR overlapping one of them could hand such an address to a pod.
	reservedRanges = []struct {
		prefix netip.Prefix
		what   string
	}{
		{netip.MustParsePrefix("0.0.0.0/8"), "the unspecified \"this network\" range 0.0.0.0/8"},
		{netip.MustParsePrefix("127.0.0.0/8"), "the loopback range 127.0.0.0/8"},
		{netip.MustParsePrefix("169.254.0.0/16"), "the link-local range 169.254.0.0/16"},
		{netip.MustParsePrefix("224.0.0.0/4"), "the multicast range 224.0.0.0/4"},
		{netip.MustParsePrefix("240.0.0.0/4"), "the reserved range 240.0.0.0/4 (with the broadcast address 255.255.255.255)"},
	}
)

// ValidateVpc validates a VPC on create.
func ValidateVpc(vpc *networking.Vpc) field.ErrorList {
	errs := validateMeta(&vpc.ObjectMeta, false)
	errs = append(errs, validateCIDR(vpc.Spec.CIDR, specPath.Child("cidr"))...)
	// 0 asks the server to allocate; the registry fills it in before storing.
	if vpc.Spec.VNI < 0 || vpc.Spec.VNI > MaxVNI {
		errs = append(errs, field.Invalid(specPath.Child("vni"), vpc.Spec.VNI, fmt.Sprintf("must be between 1 and %d, or 0 to allocate one", MaxVNI)))
	}
	errs = append(errs, validateCount(vpc.Spec.Dividers, MaxDividers, specPath.Child("dividers"))...)
	return errs
}

// ValidateVpcUpdate validates a spec update of a VPC.
func ValidateVpcUpdate(vpc, old *networking.Vpc) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&vpc.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateVpc(vpc)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(vpc.Spec.CIDR, old.Spec.CIDR, specPath.Child("cidr"))...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(vpc.Spec.VNI, old.Spec.VNI, specPath.Child("vni"))...)
	return errs
}

// ValidateSubnet validates a subnet on create.
func ValidateSubnet(s *networking.Subnet) field.ErrorList {
	errs := validateMeta(&s.ObjectMeta, false)
	errs = append(errs, validateReference(s.Spec.VPC, true, specPath.Child("vpc"))...)
	cidrErrs := validateCIDR(s.Spec.CIDR, specPath.Child("cidr"))
	errs = append(errs, cidrErrs...)
	errs = append(errs, validateCount(s.Spec.Bouncers, MaxBouncers, specPath.Child("bouncers"))...)
	gwPath := specPath.Child("gateway")
	switch gwErrs := validateIPv4(s.Spec.Gateway, gwPath); {
	case s.Spec.Gateway == "" && len(cidrErrs) > 0:
		// The gateway defaults from a valid CIDR; its absence is the CIDR's fault,
		// already reported.
	case s.Spec.Gateway == "":
		errs = append(errs, field.Required(gwPath, "defaults to the first address of spec.cidr"))
	case len(gwErrs) > 0:
		errs = append(errs, gwErrs...)
	case len(cidrErrs) == 0:
		prefix := netip.MustParsePrefix(s.Spec.CIDR)
		if msg := hostAddressProblem(netip.MustParseAddr(s.Spec.Gateway), prefix); msg != "" {
			errs = append(errs, field.Invalid(gwPath, s.Spec.Gateway, msg))
		}
	}
	return errs
}

// ValidateSubnetUpdate validates a spec update of a subnet.
func ValidateSubnetUpdate(s, old *networking.Subnet) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&s.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateSubnet(s)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(s.Spec.VPC, old.Spec.VPC, specPath.Child("vpc"))...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(s.Spec.CIDR, old.Spec.CIDR, specPath.Child("cidr"))...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(s.Spec.Gateway, old.Spec.Gateway, specPath.Child("gateway"))...)
	return errs
}

// ValidateSubnetRelations checks a new, statically valid subnet against its VPC
// (nil when it does not exist). Overlap with the VPC's other subnets is checked
// by the claim of its range, in the registry.
func ValidateSubnetRelations(s *networking.Subnet, vpc *networking.Vpc) field.ErrorList {
	if vpc == nil {
		return field.ErrorList{field.NotFound(specPath.Child("vpc"), s.Spec.VPC)}
	}
	if vpc.DeletionTimestamp != nil {
		return field.ErrorList{field.Forbidden(specPath.Child("vpc"), fmt.Sprintf("VPC %s is being deleted", vpc.Name))}
	}
	cidrPath := specPath.Child("cidr")
	prefix := netip.MustParsePrefix(s.Spec.CIDR)
	vpcPrefix := netip.MustParsePrefix(vpc.Spec.CIDR)
	if prefix.Bits() < vpcPrefix.Bits() || !vpcPrefix.Contains(prefix.Addr()) {
		return field.ErrorList{field.Invalid(cidrPath, s.Spec.CIDR, fmt.Sprintf("must lie inside VPC %s's cidr %s", vpc.Name, vpc.Spec.CIDR))}
	}
	return nil
}

// ValidateDivider validates a divider on create.
func ValidateDivider(d *networking.Divider) field.ErrorList {
	errs := validateMeta(&d.ObjectMeta, false)
	errs = append(errs, validateReference(d.Spec.VPC, true, specPath.Child("vpc"))...)
	errs = append(errs, validateReference(d.Spec.Droplet, false, specPath.Child("droplet"))...)
	return errs
}

// ValidateDividerUpdate validates a spec update of a divider.
func ValidateDividerUpdate(d, old *networking.Divider) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&d.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateDivider(d)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(d.Spec.VPC, old.Spec.VPC, specPath.Child("vpc"))...)
	return errs
}

// ValidateBouncer validates a bouncer on create.
func ValidateBouncer(b *networking.Bouncer) field.ErrorList {
	errs := validateMeta(&b.ObjectMeta, false)
	errs = append(errs, validateReference(b.Spec.Subnet, true, specPath.Child("subnet"))...)
	errs = append(errs, validateReference(b.Spec.Droplet, false, specPath.Child("droplet"))...)
	return errs
}

// ValidateBouncerUpdate validates a spec update of a bouncer.
func ValidateBouncerUpdate(b, old *networking.Bouncer) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&b.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateBouncer(b)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(b.Spec.Subnet, old.Spec.Subnet, specPath.Child("subnet"))...)
	return errs
}

// ValidateEndpoint validates an endpoint on create. An empty spec.ip is allowed
// here: the registry allocates one before the object is stored.
func ValidateEndpoint(ep *networking.Endpoint) field.ErrorList {
	errs := validateMeta(&ep.ObjectMeta, true)
	errs = append(errs, validateReference(ep.Spec.Subnet, true, specPath.Child("subnet"))...)
	errs = append(errs, validateReference(ep.Spec.Droplet, true, specPath.Child("droplet"))...)
	errs = append(errs, validateReference(ep.Spec.Pod, false, specPath.Child("pod"))...)
	errs = append(errs, validateInterfaceName(ep.Spec.Interface, specPath.Child("interface"))...)
	errs = append(errs, validateMAC(ep.Spec.MAC, specPath.Child("mac"))...)
	if ep.Spec.IP != "" {
		errs = append(errs, validateIPv4(ep.Spec.IP, specPath.Child("ip"))...)
	}
	return errs
}

// ValidateEndpointUpdate validates a spec update of an endpoint.
func ValidateEndpointUpdate(ep, old *networking.Endpoint) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&ep.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateEndpoint(ep)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(ep.Spec.Subnet, old.Spec.Subnet, specPath.Child("subnet"))...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(ep.Spec.IP, old.Spec.IP, specPath.Child("ip"))...)
	return errs
}

// ValidateEndpointSubnet checks that a new endpoint's subnet (nil when missing)
// can take endpoints.
func ValidateEndpointSubnet(ep *networking.Endpoint, subnet *networking.Subnet) field.ErrorList {
	if subnet == nil {
		return field.ErrorList{field.NotFound(specPath.Child("subnet"), ep.Spec.Subnet)}
	}
	if subnet.DeletionTimestamp != nil {
		return field.ErrorList{field.Forbidden(specPath.Child("subnet"), fmt.Sprintf("subnet %s is being deleted", subnet.Name))}
	}
	return nil
}

// ValidateEndpointAddress checks a requested address against the endpoint's
// subnet. Uniqueness is the claim of the address, in the registry.
func ValidateEndpointAddress(ep *networking.Endpoint, subnet *networking.Subnet) field.ErrorList {
	ipPath := specPath.Child("ip")
	addr := netip.MustParseAddr(ep.Spec.IP)
	if msg := hostAddressProblem(addr, netip.MustParsePrefix(subnet.Spec.CIDR)); msg != "" {
		return field.ErrorList{field.Invalid(ipPath, ep.Spec.IP, fmt.Sprintf("%s of subnet %s", msg, subnet.Name))}
	}
	if ep.Spec.IP == subnet.Spec.Gateway {
		return field.ErrorList{field.Invalid(ipPath, ep.Spec.IP, fmt.Sprintf("is the gateway of subnet %s", subnet.Name))}
	}
	return nil
}

// ValidateDroplet validates a droplet on create.
func ValidateDroplet(d *networking.Droplet) field.ErrorList {
	errs := validateMeta(&d.ObjectMeta, false)
	errs = append(errs, validateReference(d.Spec.Node, true, specPath.Child("node"))...)
	errs = append(errs, validateHostIPv4(d.Spec.IP, specPath.Child("ip"))...)
	errs = append(errs, validateMAC(d.Spec.MAC, specPath.Child("mac"))...)
	errs = append(errs, validateInterfaceName(d.Spec.Interface, specPath.Child("interface"))...)
	return errs
}

// ValidateDropletUpdate validates a spec update of a droplet.
func ValidateDropletUpdate(d, old *networking.Droplet) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&d.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateDroplet(d)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(d.Spec.Node, old.Spec.Node, specPath.Child("node"))...)
	return errs
}

// ValidateProvisioningStatus validates the lifecycle part of any status update.
func ValidateProvisioningStatus(st *networking.ProvisioningStatus, generation int64) field.ErrorList {
	var errs field.ErrorList
	if st.Phase != "" && !validPhases.Has(st.Phase) {
		errs = append(errs, field.NotSupported(statusPath.Child("phase"), st.Phase, sets.List(validPhases)))
	}
	ogPath := statusPath.Child("observedGeneration")
	errs = append(errs, apimachineryvalidation.ValidateNonnegativeField(st.ObservedGeneration, ogPath)...)
	if st.ObservedGeneration > generation {
		errs = append(errs, field.Invalid(ogPath, st.ObservedGeneration, fmt.Sprintf("must not exceed metadata.generation (%d)", generation)))
	}
	errs = append(errs, metav1validation.ValidateConditions(st.Conditions, statusPath.Child("conditions"))...)
	return errs
}

// ValidateWatermark checks an agent's watermark (status.appliedResourceVersion):
// empty, or the decimal resourceVersion its operator compares with others.
func ValidateWatermark(rv string, path *field.Path) field.ErrorList {
	if rv == "" {
		return nil
	}
	if _, err := strconv.ParseUint(rv, 10, 64); err != nil {
		return field.ErrorList{field.Invalid(path, rv, "must be a resourceVersion: a decimal number")}
	}
	return nil
}

// ValidateSubnetWatermarks checks a divider's per-subnet watermarks: one per
// subnet (the list's map key), each a resourceVersion.
func ValidateSubnetWatermarks(marks []networking.SubnetWatermark) field.ErrorList {
	var errs field.ErrorList
	path := statusPath.Child("appliedResourceVersions")
	seen := sets.New[string]()
	for i, m := range marks {
		p := path.Index(i)
		errs = append(errs, validateReference(m.Subnet, true, p.Child("subnet"))...)
		if seen.Has(m.Subnet) {
			errs = append(errs, field.Duplicate(p.Child("subnet"), m.Subnet))
		}
		seen.Insert(m.Subnet)
		errs = append(errs, ValidateWatermark(m.ResourceVersion, p.Child("resourceVersion"))...)
	}
	return errs
}

// ValidateSubnetDepartures checks a subnet's departures: at most
// MaxSubnetDepartures, numbered upwards without gaps (agents read a gap as
// departures they missed), each a namespaced endpoint, an IPv4 address and a
// droplet.
func ValidateSubnetDepartures(deps []networking.EndpointDeparture) field.ErrorList {
	var errs field.ErrorList
	path := statusPath.Child("departures")
	if len(deps) > networking.MaxSubnetDepartures {
		errs = append(errs, field.TooMany(path, len(deps), networking.MaxSubnetDepartures))
	}
	for i, d := range deps {
		p := path.Index(i)
		if d.Sequence <= 0 {
			errs = append(errs, field.Invalid(p.Child("sequence"), d.Sequence, "must be positive"))
		} else if i > 0 && d.Sequence != deps[i-1].Sequence+1 {
			errs = append(errs, field.Invalid(p.Child("sequence"), d.Sequence, fmt.Sprintf("must follow %d", deps[i-1].Sequence)))
		}
		if ns, name, ok := strings.Cut(d.Endpoint, "/"); !ok || ns == "" || name == "" {
			errs = append(errs, field.Invalid(p.Child("endpoint"), d.Endpoint, "must be namespace/name"))
		}
		if a, err := netip.ParseAddr(d.IP); err != nil || !a.Is4() {
			errs = append(errs, field.Invalid(p.Child("ip"), d.IP, "must be an IPv4 address"))
		}
		errs = append(errs, validateReference(d.Droplet, true, p.Child("droplet"))...)
	}
	return errs
}

func validateMeta(meta *metav1.ObjectMeta, namespaced bool) field.ErrorList {
	return apimachineryvalidation.ValidateObjectMeta(meta, namespaced, apimachineryvalidation.NameIsDNSSubdomain, metaPath)
}

// validateReference checks the name of a referenced object.
func validateReference(name string, required bool, path *field.Path) field.ErrorList {
	if name == "" {
		if required {
			return field.ErrorList{field.Required(path, "")}
		}
		return nil
	}
	var errs field.ErrorList
	for _, msg := range apimachineryvalidation.NameIsDNSSubdomain(name, false) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return errs
}

func validateCount(n, limit int32, path *field.Path) field.ErrorList {
	if n < 1 || n > limit {
		return field.ErrorList{field.Invalid(path, n, fmt.Sprintf("must be between 1 and %d", limit))}
	}
	return nil
}

// validateCIDR accepts canonical IPv4 prefixes short enough to hold endpoints.
func validateCIDR(value string, path *field.Path) field.ErrorList {
	if value == "" {
		return field.ErrorList{field.Required(path, "an IPv4 CIDR such as 10.0.0.0/16")}
	}
	if errs := utilvalidation.IsValidCIDR(path, value); len(errs) > 0 {
		return errs
	}
	p := netip.MustParsePrefix(value)
	if !p.Addr().Is4() {
		return field.ErrorList{field.Invalid(path, value, "only IPv4 is supported")}
	}
	if p.Bits() > MaxPrefixLength {
		return field.ErrorList{field.Invalid(path, value, fmt.Sprintf("prefix length must be at most /%d", MaxPrefixLength))}
	}
	for _, r := range reservedRanges {
		if r.prefix.Overlaps(p) {
			return field.ErrorList{field.Invalid(path, value, "must hold unicast host addresses only; it overlaps "+r.what)}
		}
	}
	return nil
}

// validateHostIPv4 accepts an IPv4 address a host can have as its own unicast address.
func validateHostIPv4(value string, path *field.Path) field.ErrorList {
	if errs := validateIPv4(value, path); len(errs) > 0 {
		return errs
	}
	a := netip.MustParseAddr(value)
	var problem string
	switch {
	case a.IsUnspecified():
		problem = "is the unspecified address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		problem = "is the broadcast address"
	case a.IsMulticast():
		problem = "is a multicast address"
	case a.IsLoopback():
		problem = "is a loopback address"
	default:
		return nil
	}
	return field.ErrorList{field.Invalid(path, value, problem+"; a droplet needs a unicast address other hosts can reach")}
}

func validateIPv4(value string, path *field.Path) field.ErrorList {
	if value == "" {
		return field.ErrorList{field.Required(path, "an IPv4 address")}
	}
	if errs := utilvalidation.IsValidIP(path, value); len(errs) > 0 {
		return errs
	}
	if !netip.MustParseAddr(value).Is4() {
		return field.ErrorList{field.Invalid(path, value, "only IPv4 is supported")}
	}
	return nil
}

// validateMAC accepts a 48-bit unicast MAC written as six colon-separated bytes.
func validateMAC(value string, path *field.Path) field.ErrorList {
	if value == "" {
		return field.ErrorList{field.Required(path, "a MAC address such as 02:00:00:00:00:01")}
	}
	hw, err := net.ParseMAC(value)
	if err != nil || len(hw) != 6 || strings.Count(value, ":") != 5 {
		return field.ErrorList{field.Invalid(path, value, "must be a 48-bit MAC address written as six colon-separated hex bytes")}
	}
	if [6]byte(hw) == [6]byte{} {
		return field.ErrorList{field.Invalid(path, value, "must not be all zeros (00:00:00:00:00:00 is no interface's address)")}
	}
	if hw[0]&1 != 0 {
		return field.ErrorList{field.Invalid(path, value, "must be a unicast address (the low bit of the first byte is clear)")}
	}
	if value != hw.String() {
		return field.ErrorList{field.Invalid(path, value, fmt.Sprintf("must be in canonical lower-case form (%q)", hw.String()))}
	}
	return nil
}

func validateInterfaceName(value string, path *field.Path) field.ErrorList {
	switch {
	case value == "":
		return field.ErrorList{field.Required(path, "")}
	case len(value) > maxInterfaceName:
		return field.ErrorList{field.TooLong(path, value, maxInterfaceName)}
	case value == "." || value == ".." || strings.ContainsAny(value, "/: \t\n"):
		return field.ErrorList{field.Invalid(path, value, "must be a Linux interface name (no '/', ':' or whitespace)")}
	case strings.IndexFunc(value, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0:
		// NUL ends the name the kernel sees; control and non-ASCII bytes pass the
		// kernel but break every tool that prints or matches the name.
		return field.ErrorList{field.Invalid(path, value, "must be printable ASCII (no NUL, control or non-ASCII characters)")}
	}
	return nil
}

// hostAddressProblem says why addr cannot be a host address of prefix, or "".
func hostAddressProblem(addr netip.Addr, prefix netip.Prefix) string {
	switch {
	case !prefix.Contains(addr):
		return "must lie inside " + prefix.String()
	case addr == prefix.Addr():
		return "is the network address"
	case addr == ipam.Broadcast(prefix):
		return "is the broadcast address"
	}
	return ""
}
