package loader

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Exports and Fired are slices of named values that travel as one JSON object, name to
// value, in their order (a map would lose it). These two functions are that encoding.

// marshalNamed writes n entries as one object: entry i is name(i) to the JSON of value(i);
// a nil slice (isNil) is null.
func marshalNamed(isNil bool, n int, name func(int) string, value func(int) any) ([]byte, error) {
	if isNil {
		return []byte("null"), nil
	}
	b := []byte{'{'}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(name(i))
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(value(i))
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// unmarshalNamed reads what marshalNamed writes: entry decodes each entry in order from a
// decoder positioned at its value, and null reads as nil. what names the object in errors
// ("exports"), want what it should hold ("name to values").
func unmarshalNamed[E any](b []byte, what, want string, entry func(name string, dec *json.Decoder) (E, error)) ([]E, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("%s: want an object of %s, got %v", what, want, tok)
	}
	out := []E{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := k.(string)
		e, err := entry(name, dec)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", what, name, err)
		}
		out = append(out, e)
	}
	return out, nil
}
