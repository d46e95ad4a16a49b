//go:build !linux

package cpu

// physicalMemory is the machine's RAM in bytes, 0 when unknown (here: not asked).
func physicalMemory() int64 { return 0 }
