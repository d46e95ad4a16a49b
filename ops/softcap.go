package ops

import (
	"fmt"
	"math"
)

// SoftcapAttrs are the attributes of op "softcap": every value of rows of Width f32 becomes
// Cap * tanh(x / Cap), in place (Gemma 2's final-logit soft-capping). Parameter: x; the
// rows are the launch's grid y (codegen.SoftcapConfig.Launch).
type SoftcapAttrs struct {
	Width int     `json:"width"`
	Cap   float32 `json:"cap"`
}

func init() {
	Register("softcap", func(attrs []byte) (Runner, error) {
		var a SoftcapAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if a.Width <= 0 || !(a.Cap > 0) || math.IsInf(float64(a.Cap), 0) {
			return nil, fmt.Errorf("width %d, cap %g: want a positive width and a positive, finite cap", a.Width, a.Cap)
		}
		return named("softcap", a.run), nil
	})
}

func (a SoftcapAttrs) run(args []Arg, l Launch) error {
	rows := l.Grid[1]
	if err := CheckArgs("softcap", args, 4*rows*a.Width); err != nil {
		return err
	}
	x := args[0].F32()[:rows*a.Width]
	ParallelFor(rows, func(lo, hi int) {
		for i := lo * a.Width; i < hi*a.Width; i++ {
			x[i] = Softcap(x[i], a.Cap)
		}
	})
	return nil
}

// Softcap is limit * tanh(x / limit).
func Softcap(x, limit float32) float32 {
	return float32(float64(limit) * math.Tanh(float64(x)/float64(limit)))
}
