package ptx

import (
	"strings"
	"testing"
)

// TestByteParam: a byte-array parameter (a tensor map passed by value) prints, parses back
// and validates; mov.u64 takes its address; other forms are refused.
func TestByteParam(t *testing.T) {
	k := NewKernel("k")
	m := k.ByteParam("w_map", 64, 128)
	r := k.Reg(U64)
	k.Emit("mov.u64", r, m)
	k.Emit("cvta.param.u64", r, r)
	k.Emit("ret")
	text, err := NewModule(k).Print()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "\t.param .align 64 .b8 w_map[128]\n") {
		t.Fatalf("printed:\n%s", text)
	}
	reprints(t, text)
	bad := NewKernel("k")
	b := bad.ByteParam("w_map", 64, 128)
	bad.Emit("mov.u32", bad.Reg(U32), b)
	if err := Validate(NewModule(bad)); err == nil || !strings.Contains(err.Error(), "byte-array parameter") {
		t.Errorf("mov.u32 of a byte-array parameter: %v", err)
	}
	head := ".version 8.0\n.target sm_90\n.address_size 64\n"
	for _, c := range []struct{ src, want string }{
		{head + ".visible .entry k(.param .u32 a[4])\n{\n}", "array parameters must be .b8"},
		{head + ".visible .entry k(.param .align 8 .u32 a)\n{\n}", "only array parameters take .align"},
	} {
		if _, err := Parse(c.src); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}
