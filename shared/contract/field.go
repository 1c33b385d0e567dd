package contract

import (
	"bytes"
	"encoding/json"
)

type fieldState uint8

const (
	fieldLeave fieldState = iota
	fieldSet
	fieldClear
)

// Field is one entry of a patch: left alone (the zero value), set to a value, or cleared.
// In JSON an absent key leaves it alone, null clears it and a value sets it; struct fields
// of type Field must carry `json:",omitzero"` so "left alone" is omitted when encoding.
type Field[T any] struct {
	state fieldState
	v     T
}

// Set returns a Field that sets v.
func Set[T any](v T) Field[T] { return Field[T]{state: fieldSet, v: v} }

// Clear returns a Field that removes the value.
func Clear[T any]() Field[T] { return Field[T]{state: fieldClear} }

// IsZero reports whether the field is left alone.
func (f Field[T]) IsZero() bool { return f.state == fieldLeave }

// IsSet reports whether the field sets a value.
func (f Field[T]) IsSet() bool { return f.state == fieldSet }

// IsClear reports whether the field removes the value.
func (f Field[T]) IsClear() bool { return f.state == fieldClear }

// Value returns the value being set and true, or the zero value and false.
func (f Field[T]) Value() (T, bool) { return f.v, f.state == fieldSet }

// Apply returns the result of applying f to the current value cur (nil = absent).
func (f Field[T]) Apply(cur *T) *T {
	switch f.state {
	case fieldSet:
		v := f.v
		return &v
	case fieldClear:
		return nil
	}
	return cur
}

// MarshalJSON encodes a set field as its value and a cleared one as null. A left-alone
// field also encodes as null; omit it with `omitzero`.
func (f Field[T]) MarshalJSON() ([]byte, error) {
	if f.state != fieldSet {
		return []byte("null"), nil
	}
	return json.Marshal(f.v)
}

// UnmarshalJSON reads null as Clear and anything else as Set.
func (f *Field[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*f = Clear[T]()
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Set(v)
	return nil
}
