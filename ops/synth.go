package ops

import (
	"encoding/binary"
	"math"
)

// Synthetic weights (like vLLM's --load-format dummy): element i of a matrix is uniform with
// the requested std, from a counter-based generator keyed by the model's seed and the
// buffer's name, so the CPU and every device produce the same bits without moving them.
// The formula keeps every rounding explicit so the PTX "synth" kernel matches it exactly:
// t = 2*(h>>40) - 2^24 is an exact integer in [-2^24, 2^24), and the value is
// float32(float64(t) * scaleU) with scaleU = sqrt(3)*std / 2^24.

// SplitMix64 is the finaliser of Steele et al.'s SplitMix64 generator.
func SplitMix64(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// NameHash hashes a buffer name (FNV-1a) into the generator's key.
func NameHash(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

// SynthGolden is the odd constant that spreads element indices over the key space.
const SynthGolden = 0x9E3779B97F4A7C15

// SynthScale is scaleU for a given std.
func SynthScale(std float64) float64 { return math.Sqrt(3) * std / (1 << 24) }

// SynthValue is element i of the buffer whose key is seed ^ NameHash(name).
func SynthValue(key uint64, scaleU float64, i uint64) float32 {
	h := SplitMix64(key ^ (i * SynthGolden))
	t := int64(h>>40)*2 - (1 << 24)
	return float32(float64(t) * scaleU)
}

// SynthAttrs: the storage type of the filled buffer ("bf16" or "f32").
type SynthAttrs struct {
	Dtype string `json:"dtype"`
}

// SynthThreads is the block size of the synth kernel; the grid covers n elements.
const SynthThreads = 256

func init() { Register("synth", buildSynth) }

// buildSynth: params out, n (u32), key (u64), scale (u64: float64 bits of scaleU).
func buildSynth(attrs []byte) (Runner, error) {
	var a SynthAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	esz := 4
	if a.Dtype == "bf16" {
		esz = 2
	}
	return RunnerFunc(func(args []Arg, l Launch) error {
		if err := CheckArgs("synth", args, 0, -1, -1, -1); err != nil {
			return err
		}
		n := args[1].Int()
		if err := CheckArgs("synth", args, n*esz, -1, -1, -1); err != nil {
			return err
		}
		key, scale := args[2].Bits, math.Float64frombits(args[3].Bits)
		out := args[0].Mem
		ParallelFor(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				v := SynthValue(key, scale, uint64(i))
				if esz == 2 {
					binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(v))
				} else {
					binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
				}
			}
		})
		return nil
	}), nil
}
