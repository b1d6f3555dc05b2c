package v1alpha1

import "slices"

// OperatorFinalizer holds an object until its operator has drained what depends
// on it. On an endpoint it also says the Endpoint operator follows it: only then
// does an acknowledgement of it matter.
const OperatorFinalizer = "networking.mizar.dev/operator"

// AwaitsAcknowledgement reports whether the Endpoint operator waits for the
// agents to acknowledge this version of the endpoint: it holds the operator's
// finalizer and is either not yet Provisioned or being deleted. Agents write
// their watermark only after applying such a version, so versions nobody waits
// for (the Provisioned status write, the final delete) cost no writes.
func (ep *Endpoint) AwaitsAcknowledgement() bool {
	if !slices.Contains(ep.Finalizers, OperatorFinalizer) {
		return false
	}
	return ep.DeletionTimestamp != nil || ep.Status.Phase != PhaseProvisioned
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
