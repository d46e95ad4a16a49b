package cuda

// MEASUREMENT ONLY (reverted after): a kernel after each layer's q/k/v GEMM asks L2 for the
// first XMIX_PF_O_BYTES of the layer's o weight (cp.async.bulk.prefetch.L2), then waits for
// the grid ahead; "hop" inserts it with nothing to ask for.

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"xmix/bundle"
)

const pfPTX = `.version 8.0
.target sm_90
.address_size 64

.visible .entry xmix_prefetch_l2(
	.param .u64 src,
	.param .u64 bytes
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<8>;
	griddepcontrol.launch_dependents;
	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [bytes];
	mov.u32 %r1, %tid.x;
	setp.ne.u32 %p1, %r1, 0;
	@%p1 bra WAIT;
	mov.u32 %r2, %ctaid.x;
	cvt.u64.u32 %rd3, %r2;
	shl.b64 %rd3, %rd3, 14;
	mov.u32 %r3, %nctaid.x;
	cvt.u64.u32 %rd4, %r3;
	shl.b64 %rd4, %rd4, 14;
LOOP:
	setp.ge.u64 %p1, %rd3, %rd2;
	@%p1 bra WAIT;
	add.u64 %rd5, %rd1, %rd3;
	cp.async.bulk.prefetch.L2.global [%rd5], 16384;
	add.u64 %rd3, %rd3, %rd4;
	bra LOOP;
WAIT:
	griddepcontrol.wait;
	ret;
}
`

var pfFunc uintptr

func (be *Backend) pfAfter(nodes []bundle.Node, i int) (launch, bool) {
	env := os.Getenv("XMIX_PF_O_BYTES")
	if env == "" || !strings.HasSuffix(nodes[i].Label, ".qkv") {
		return launch{}, false
	}
	layer := strings.TrimSuffix(nodes[i].Label, ".qkv")
	var w, size uint64
	for _, n := range nodes[i+1:] {
		if n.Label == layer+".o" {
			g, ok, err := bundle.GemmOf(n, be.kernels[n.Kernel])
			if err != nil || !ok {
				return launch{}, false
			}
			vals, err := be.argValues(n)
			if err != nil {
				return launch{}, false
			}
			w, size = vals[g.W], uint64(g.N*g.K*2)
			break
		}
	}
	if w == 0 {
		return launch{}, false
	}
	bytes := uint64(0)
	if env != "hop" {
		b, _ := strconv.ParseUint(env, 10, 64)
		bytes = min(b, size) &^ 16383
	}
	if pfFunc == 0 {
		var mod uintptr
		src := append([]byte(pfPTX), 0)
		if err := be.d.call("cuModuleLoadDataEx", uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&src[0])), 0, 0, 0); err != nil {
			panic(err)
		}
		runtime.KeepAlive(src)
		name := append([]byte("xmix_prefetch_l2"), 0)
		if err := be.d.call("cuModuleGetFunction", uintptr(unsafe.Pointer(&pfFunc)), mod, uintptr(unsafe.Pointer(&name[0]))); err != nil {
			panic(err)
		}
	}
	return launch{label: layer + ".pf", kernel: "xmix_prefetch_l2", f: pfFunc, grid: [3]int{132, 1, 1}, block: [3]int{32, 1, 1},
		params: be.keepParams([]uint64{w, bytes}), early: true}, true
}
