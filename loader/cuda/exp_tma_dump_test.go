package cuda

import (
	"os"
	"testing"
)

func TestExpTMADump(t *testing.T) {
	dir := os.Getenv("TMA_DUMP")
	if dir == "" {
		t.Skip()
	}
	for _, nk := range [][2]int{{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}} {
		s, _ := tmaPick(nk[0], nk[1])
		os.WriteFile(dir+"/"+s.name()+".ptx", []byte(tmaPTX(s)), 0o644)
	}
}
