package osb

import (
	"crypto/sha256"
	"encoding/base32"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationID keeps the Open Service Broker id of an order or binding placed
// through the facade: its object name is derived from the id and may differ.
const AnnotationID = "broker.mizar.dev/osb-id"

// MaxIDBytes bounds an instance or binding id. The spec sets no limit; ids
// are kept in an annotation, and GUIDs are 36 bytes.
const MaxIDBytes = 1024

// maxVerbatimID is the longest id used as an object name as it is. A
// ServiceInstance name is a DNS-1123 label of at most 52 characters (see
// validation.MaxInstanceName); a lower-case GUID is 36.
const maxVerbatimID = 52

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ObjectName is the name of the object that stands for an OSB id. The spec
// allows any non-empty string (RFC 3986 unreserved characters are only
// recommended): upper-case GUIDs, underscores, tildes, dots, even
// percent-encoded bytes. An id that is already a lower-case DNS-1123 label of
// at most 52 characters is the name itself, so `kubectl get msi <guid>`
// finds a platform's order; any other id is hashed into "osb-" and 32
// base32 characters (160 bits of SHA-256). Whether an object found under
// that name is really this id's is told by its AnnotationID.
func ObjectName(id string) string {
	if len(id) <= maxVerbatimID && len(utilvalidation.IsDNS1123Label(id)) == 0 {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "osb-" + lowerBase32.EncodeToString(sum[:])[:32]
}

// isFor reports whether an object stands for the OSB id: its annotation says
// so, or (made before the annotation, or by kubectl) it is named after it.
func isFor(m metav1.Object, id string) bool {
	if v, ok := m.GetAnnotations()[AnnotationID]; ok {
		return v == id
	}
	return m.GetName() == id
}
