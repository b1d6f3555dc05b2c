package registry

import (
	"encoding"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// jsonSizeBound returns a number of bytes that json.Marshal(v) does not
// exceed, walking v without encoding it, or ok false when it cannot tell (a
// type encoding/json refuses, a value too deep) or the bound passes limit
// (it stops there). Every create and update checks its object's size: this
// spares the typical object, a few hundred bytes, its encoding; an object
// whose bound passes the limit is encoded to get its exact size.
//
// Each rule takes encoding/json's worst case: a string byte may become a
// six-byte escape (\u00XX, \ufffd), a Marshaler's output may grow as much
// when encoding/json escapes HTML in it, and every field is counted as if
// omitempty kept it.
func jsonSizeBound(v any, limit int) (int, bool) {
	w := boundWalker{limit: limit}
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return boundNull, true
	}
	w.value(rv, typeInfoOf(rv.Type()), 0)
	return w.n, !w.failed && w.n <= limit
}

type boundWalker struct {
	n, limit int
	failed   bool
}

// maxBoundDepth is deeper than any API object; a deeper value (or a cycle,
// which encoding/json refuses too) is left to json.Marshal.
const maxBoundDepth = 200

// Bounds of the encodings whose length does not depend on the value.
const (
	boundNull   = len("null")
	boundBool   = len("false")
	boundNumber = 32 // the longest int64, uint64 or float64 encoding, quoted (,string)
)

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func (w *boundWalker) add(n int) {
	w.n += n
	if w.n > w.limit {
		w.failed = true
	}
}

// value bounds v, whose type info is.
func (w *boundWalker) value(v reflect.Value, info *typeInfo, depth int) {
	if w.failed {
		return
	}
	if depth > maxBoundDepth {
		w.failed = true
		return
	}
	t := info.t
	if info.fixed > 0 {
		w.add(info.fixed)
		return
	}
	// The order encoding/json looks for a method in (newTypeEncoder).
	switch {
	case info.marshaler, info.ptrMarshaler && v.CanAddr():
		w.marshaler(v, info.ptrMarshaler && !info.marshaler, false)
		return
	case info.textMarshaler, info.ptrTextMarshaler && v.CanAddr():
		w.marshaler(v, info.ptrTextMarshaler && !info.textMarshaler, true)
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		w.add(boundBool)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		w.add(boundNumber)
	case reflect.String:
		w.add(6*v.Len() + 4) // quotes, and quotes again for ,string
	case reflect.Pointer:
		if v.IsNil() {
			w.add(boundNull)
			return
		}
		w.value(v.Elem(), info.elem(), depth+1)
	case reflect.Interface:
		if v.IsNil() {
			w.add(boundNull)
			return
		}
		e := v.Elem()
		w.value(e, typeInfoOf(e.Type()), depth+1)
	case reflect.Struct:
		w.add(2)
		for i := range info.fields {
			f := &info.fields[i]
			fv := v.Field(f.index)
			w.add(f.keyBound)
			switch {
			case f.embeddedPtr && fv.IsNil():
			case f.quoted && fv.Kind() == reflect.String:
				w.add(6*(6*fv.Len()+2) + 2) // ,string: the encoded string is escaped again
			default:
				w.value(fv, f.info(), depth+1)
			}
		}
	case reflect.Map:
		w.mapValue(v, info, depth)
	case reflect.Slice:
		if v.IsNil() {
			w.add(boundNull)
			return
		}
		if t.Elem().Kind() == reflect.Uint8 && !info.elemMarshals {
			w.add(2*v.Len() + 4) // base64, quoted
			return
		}
		w.list(v, info.elem(), depth)
	case reflect.Array:
		w.list(v, info.elem(), depth)
	default:
		// Channels, functions, complex numbers: encoding/json refuses them.
		w.failed = true
	}
}

func (w *boundWalker) list(v reflect.Value, elem *typeInfo, depth int) {
	w.add(2)
	for i := range v.Len() {
		if w.failed {
			return
		}
		w.add(1)
		w.value(v.Index(i), elem, depth+1)
	}
}

func (w *boundWalker) mapValue(v reflect.Value, info *typeInfo, depth int) {
	if v.IsNil() {
		w.add(boundNull)
		return
	}
	w.add(2)
	// Labels and annotations: no reflection per entry.
	if v.CanInterface() {
		if m, ok := v.Interface().(map[string]string); ok {
			for k, e := range m {
				w.add(6*(len(k)+len(e)) + 6)
			}
			return
		}
	}
	kt := info.t.Key()
	keyInfo := typeInfoOf(kt)
	elem := info.elem()
	it := v.MapRange()
	for it.Next() {
		if w.failed {
			return
		}
		k := it.Key()
		// encoding/json's order (resolveKeyName): a string kind is used as it
		// is, even when it has a MarshalText.
		switch {
		case kt.Kind() == reflect.String:
			w.add(6*k.Len() + 2)
		case keyInfo.textMarshaler:
			w.marshaler(k, false, true)
		default:
			w.add(boundNumber)
		}
		w.add(2) // colon, comma
		w.value(it.Value(), elem, depth+1)
	}
}

// marshaler bounds a value encoded by its own MarshalJSON (or MarshalText, then
// quoted), calling it through a pointer when only *T has the method.
func (w *boundWalker) marshaler(v reflect.Value, viaPointer, text bool) {
	if viaPointer {
		v = v.Addr()
	}
	if !v.CanInterface() {
		w.failed = true
		return
	}
	if (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
		w.add(boundNull)
		return
	}
	var b []byte
	var err error
	if text {
		b, err = v.Interface().(encoding.TextMarshaler).MarshalText()
	} else {
		b, err = v.Interface().(json.Marshaler).MarshalJSON()
	}
	if err != nil {
		w.failed = true // encoding/json fails too: its error is the answer
		return
	}
	w.add(6*len(b) + 2)
}

// typeInfo is what the walker needs of a type, computed once per type.
type typeInfo struct {
	t                               reflect.Type
	marshaler, ptrMarshaler         bool
	textMarshaler, ptrTextMarshaler bool
	// fixed, when set, bounds every value of the type: the timestamps every
	// object has are not encoded to be measured.
	fixed int
	// elemMarshals: a []T whose T has its own encoding is not base64 bytes.
	elemMarshals bool
	fields       []fieldInfo
	// elemInfo is Elem()'s, looked up on first use (types may be recursive).
	elemInfo atomic.Pointer[typeInfo]
}

func (i *typeInfo) elem() *typeInfo {
	if e := i.elemInfo.Load(); e != nil {
		return e
	}
	e := typeInfoOf(i.t.Elem())
	i.elemInfo.Store(e)
	return e
}

type fieldInfo struct {
	index int
	// keyBound bounds the field's key, colon and comma.
	keyBound int
	// embeddedPtr: an embedded *struct, which encoding/json skips when nil.
	embeddedPtr bool
	// quoted: the ,string option.
	quoted bool
	t      reflect.Type
	// typ is t's info, looked up on first use.
	typ *atomic.Pointer[typeInfo]
}

func (f *fieldInfo) info() *typeInfo {
	if i := f.typ.Load(); i != nil {
		return i
	}
	i := typeInfoOf(f.t)
	f.typ.Store(i)
	return i
}

var typeInfos sync.Map // reflect.Type -> *typeInfo

func typeInfoOf(t reflect.Type) *typeInfo {
	if i, ok := typeInfos.Load(t); ok {
		return i.(*typeInfo)
	}
	info := &typeInfo{
		t:             t,
		marshaler:     t.Implements(marshalerType),
		textMarshaler: t.Implements(textMarshalerType),
	}
	switch t {
	case reflect.TypeFor[metav1.Time](), reflect.TypeFor[metav1.MicroTime]():
		// null, or RFC 3339 in UTC (with microseconds), quoted; a year past
		// 9999 adds digits, at most 12 of them.
		info.fixed = 64
	}
	if t.Kind() != reflect.Pointer {
		pt := reflect.PointerTo(t)
		info.ptrMarshaler = pt.Implements(marshalerType)
		info.ptrTextMarshaler = pt.Implements(textMarshalerType)
	}
	if t.Kind() == reflect.Slice {
		e := t.Elem()
		pe := reflect.PointerTo(e)
		info.elemMarshals = e.Implements(marshalerType) || e.Implements(textMarshalerType) ||
			pe.Implements(marshalerType) || pe.Implements(textMarshalerType)
	}
	if t.Kind() == reflect.Struct {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			ft := f.Type
			embeddedPtr := f.Anonymous && ft.Kind() == reflect.Pointer
			if embeddedPtr {
				ft = ft.Elem()
			}
			if !f.IsExported() && !(f.Anonymous && ft.Kind() == reflect.Struct) {
				continue // encoding/json sees only exported fields and embedded structs' promoted ones
			}
			name, opts, _ := strings.Cut(tag, ",")
			quoted := slices.Contains(strings.Split(opts, ","), "string")
			// An embedded struct's fields are promoted, not nested: counting its
			// own key and braces as well only loosens the bound.
			info.fields = append(info.fields, fieldInfo{index: i, keyBound: 6*max(len(name), len(f.Name)) + 4,
				embeddedPtr: embeddedPtr, quoted: quoted, t: f.Type, typ: new(atomic.Pointer[typeInfo])})
		}
	}
	actual, _ := typeInfos.LoadOrStore(t, info)
	return actual.(*typeInfo)
}
