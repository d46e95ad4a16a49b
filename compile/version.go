package compile

import (
	"runtime"
	"runtime/debug"
)

// Version says which xmix this is, for --version: the toolchain release (Compiler), the
// commit the binary was built from (with "+dirty" when the tree had changes) and the Go
// release that built it.
func Version() string {
	v := Compiler[len("xmixc "):]
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev, dirty string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			v += " (commit " + rev + dirty + ")"
		}
	}
	return v + " " + runtime.Version()
}
