package v1alpha1

import (
	"maps"
	"slices"
	"strings"
)

// OperatorFinalizer holds an object until its operator has drained what depends
// on it. On an endpoint it also says the Endpoint operator follows it: only then
// does an acknowledgement of it matter.
const OperatorFinalizer = "networking.mizar.dev/operator"

// EndpointDepartedFromAnnotation lists, comma-separated, the droplets an
// endpoint moved away from (spec.droplet changed) whose departure its
// subnet's status.departures does not list yet. The API server writes it in
// the update that moves the endpoint, so a move is recorded with the move
// itself, whether the Endpoint operator runs or not; the operator lists the
// departures once the subnet's relays have applied the move, then clears it
// (an update setting it to ""). Any other value a client writes is ignored.
const EndpointDepartedFromAnnotation = "networking.mizar.dev/departed-from"

// AwaitsAcknowledgement reports whether the Endpoint operator waits for the
// agents to acknowledge this version of the endpoint: it holds the operator's
// finalizer and is either not yet Provisioned, being deleted, or moved with its
// departure not yet listed. Agents write their watermark only after applying
// such a version, so versions nobody waits for (the Provisioned status write,
// the final delete) cost no writes.
func (ep *Endpoint) AwaitsAcknowledgement() bool {
	if !slices.Contains(ep.Finalizers, OperatorFinalizer) {
		return false
	}
	return ep.DeletionTimestamp != nil || ep.Status.Phase != PhaseProvisioned || len(DepartedFrom(ep.Annotations)) > 0
}

// DepartedFrom returns the droplets EndpointDepartedFromAnnotation lists.
func DepartedFrom(annotations map[string]string) []string {
	v := annotations[EndpointDepartedFromAnnotation]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// RecordDeparture returns an endpoint's annotations after an update, given
// those before it (was) and those the update carries (now): the server's list
// of former droplets, cleared when the update sets it to "", with from added
// when the update moves the endpoint off droplet from ("" : no move).
func RecordDeparture(was, now map[string]string, from string) map[string]string {
	list := DepartedFrom(was)
	if v, ok := now[EndpointDepartedFromAnnotation]; ok && v == "" {
		list = nil
	}
	if from != "" && !slices.Contains(list, from) {
		list = append(list, from)
	}
	if len(list) == 0 {
		if _, ok := now[EndpointDepartedFromAnnotation]; ok {
			now = copyOf(now)
			delete(now, EndpointDepartedFromAnnotation)
		}
		return now
	}
	now = copyOf(now)
	now[EndpointDepartedFromAnnotation] = strings.Join(list, ",")
	return now
}

// copyOf copies m (nil: a new map).
func copyOf(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+1)
	maps.Copy(out, m)
	return out
}

// AppliedResourceVersion returns the divider's watermark for subnet, or "" when
// its agent has not applied that subnet's endpoints yet.
func (st *DividerStatus) AppliedResourceVersion(subnet string) string {
	for _, w := range st.AppliedResourceVersions {
		if w.Subnet == subnet {
			return w.ResourceVersion
		}
	}
	return ""
}

// A droplet in encrypted mode (the agent's --encryption=wireguard) publishes
// its WireGuard public key (hex) and where its WireGuard listens on the
// physical network (ip:port) in these annotations. The private key never
// leaves the node.
const (
	DropletWireGuardKeyAnnotation      = "networking.mizar.dev/wireguard-public-key"
	DropletWireGuardEndpointAnnotation = "networking.mizar.dev/wireguard-endpoint"
)
