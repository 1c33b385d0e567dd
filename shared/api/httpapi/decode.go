package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// Body limits (shared/api/wire holds them).
const (
	MaxBodyBytes   = wire.MaxBodyBytes   // every JSON body but POST /events
	MaxEventsBytes = wire.MaxEventsBytes // POST /v1/runs/{runId}/events
)

// decodeBody reads exactly one JSON object of at most limit bytes into dst, rejecting
// null, unknown fields (case-sensitively), members given twice and wrong types (opaque
// documents — event data, usage, workspace — are kept as sent); allowEmpty reads an
// empty body as {}.
// Every failure wraps contract.ErrInvalid and names the field.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, dst any, allowEmpty bool) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return contract.Invalid("body", "larger than %d bytes", tooBig.Limit)
		}
		return contract.Invalid("body", "unreadable: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		if !allowEmpty {
			return contract.Invalid("body", "empty; a JSON object is required")
		}
		data = []byte("{}")
	}
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return contract.Invalid("body", "must be a JSON object, not null")
	}
	if !json.Valid(data) {
		// Let the decoder say where the syntax breaks; a valid first value means more follow.
		var v any
		if err := json.NewDecoder(bytes.NewReader(data)).Decode(&v); err != nil {
			return jsonError(err)
		}
		return contract.Invalid("body", "must hold exactly one JSON value")
	}
	// Keys first, case-sensitively and with their full path: encoding/json matches keys
	// case-insensitively and names only the leaf of an unknown field; the API (and its
	// OpenAPI document) treats "RunId" as an unknown field, not a silent alias.
	if err := checkKeys(data, reflect.TypeOf(dst), ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	return nil
}

// jsonError turns a decoder error into ErrInvalid naming the field.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return contract.Invalid("body", "malformed JSON at byte %d", syn.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return contract.Invalid("body", "truncated JSON")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return contract.Invalid(field, "must be %s, not %s", jsonTypeName(typ.Type), typ.Value)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if s, uerr := strconv.Unquote(name); uerr == nil {
			name = s
		}
		return contract.Invalid(name, "unknown field")
	}
	return contract.Invalid("body", "%v", err)
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// jsonTypeName names the JSON type a Go type decodes from.
func jsonTypeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// checkKeys verifies that every object key in data names a field of t exactly (the
// decoder already checked syntax and types).
func checkKeys(data []byte, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, err := members(data)
		if err != nil {
			return contract.Invalid(fieldName(path), "must be an object")
		}
		fields := jsonFields(t)
		seen := make(map[string]bool, len(m))
		for _, kv := range m {
			k, v := kv.key, kv.value
			if seen[k] {
				// encoding/json would keep the last silently; another reader the first.
				return contract.Invalid(path+k, "given more than once")
			}
			seen[k] = true
			ft, ok := fields[k]
			if !ok {
				return contract.Invalid(path+k, "unknown field")
			}
			if err := checkKeys(v, ft, path+k+"."); err != nil {
				return err
			}
		}
	case reflect.Slice:
		var items []json.RawMessage
		if err := json.Unmarshal(data, &items); err != nil {
			return contract.Invalid(fieldName(path), "must be an array")
		}
		for i, it := range items {
			if err := checkKeys(it, t.Elem(), fmt.Sprintf("%s[%d].", strings.TrimSuffix(path, "."), i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// member is one key and value of a JSON object, in document order.
type member struct {
	key   string
	value json.RawMessage
}

// members returns the members of the JSON object data (valid JSON) in order, duplicates
// included; anything but an object is an error.
func members(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, member{key, v})
	}
	return out, nil
}

// fieldName names the member at path ("body" for the top level).
func fieldName(path string) string {
	if p := strings.TrimSuffix(path, "."); p != "" {
		return p
	}
	return "body"
}

// jsonFields maps the exact JSON names of t's exported fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// queryInt reads an optional integer query parameter within [lo, hi]; absent is def.
func queryInt(q url.Values, name string, def, lo, hi int64) (int64, error) {
	vs, ok := q[name]
	if !ok {
		return def, nil
	}
	if len(vs) != 1 {
		return 0, contract.Invalid(name, "given more than once")
	}
	n, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil {
		return 0, contract.Invalid(name, "must be an integer")
	}
	if n < lo || n > hi {
		return 0, contract.Invalid(name, "must be between %d and %d", lo, hi)
	}
	return n, nil
}
