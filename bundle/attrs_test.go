package bundle

import (
	"encoding/json"
	"fmt"
	"testing"
)

func TestAttrsMemo(t *testing.T) {
	var c attrsMemo[GemmTCAttrs]
	for range 2 { // the second read comes from the memo
		a, err := c.decode(json.RawMessage(`{"k":4096,"n":6144,"guard":2}`))
		if err != nil || a != (GemmTCAttrs{K: 4096, N: 6144, Guard: 2}) {
			t.Fatalf("decode = %+v, %v; want k 4096, n 6144, guard 2", a, err)
		}
		if _, err := c.decode(json.RawMessage(`{"k":"x"}`)); err == nil {
			t.Fatal("malformed attributes decoded without an error")
		}
	}
	if len(c.m) != 2 {
		t.Errorf("memo holds %d entries, want 2", len(c.m))
	}
	for i := range attrsMemoMax + 10 {
		a, err := c.decode(json.RawMessage(fmt.Sprintf(`{"k":%d,"n":1}`, i+1)))
		if err != nil || a.K != i+1 {
			t.Fatalf("entry %d: decode = %+v, %v", i, a, err)
		}
	}
	if len(c.m) > attrsMemoMax {
		t.Errorf("memo holds %d entries, past its bound %d", len(c.m), attrsMemoMax)
	}
}
