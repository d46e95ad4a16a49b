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

// unmarshalNamed reads what marshalNamed writes, calling add for each entry in order with
// a decoder positioned at its value; it reports false for null. what names the object in
// errors ("exports").
func unmarshalNamed(b []byte, what, want string, add func(name string, dec *json.Decoder) error) (bool, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return false, err
	}
	if tok == nil {
		return false, nil
	}
	if tok != json.Delim('{') {
		return false, fmt.Errorf("%s: want an object of %s, got %v", what, want, tok)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return false, err
		}
		name, _ := k.(string)
		if err := add(name, dec); err != nil {
			return false, fmt.Errorf("%s: %s: %w", what, name, err)
		}
	}
	return true, nil
}
