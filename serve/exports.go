package serve

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"

	"xmix/bundle"
	"xmix/loader"
)

// Exports are per-position reads as the API reports them: {"app.buffer": [one value per
// position]}, a number for an export of width 1, a list of Width numbers otherwise, null
// where the row has no read (a sampled-rows-only export at a prompt row). Non-finite
// values are written as null: JSON has no NaN or infinity.
type Exports struct {
	refs []exportRef
	rows []loader.Row // by position: rows[p].Pos == p
	from int          // first position
	to   int          // past the last
}

// tokenExports are the reads at the rows that sampled generated tokens [from, to) of a
// request whose prompt has promptLen rows: token k is sampled at position promptLen-1+k.
func tokenExports(refs []exportRef, rows []loader.Row, promptLen, from, to int) Exports {
	return Exports{refs: refs, rows: rows, from: promptLen - 1 + from, to: promptLen - 1 + to}
}

// promptExports are the reads at the prompt's rows (the BOS the engine adds included).
func promptExports(refs []exportRef, rows []loader.Row, promptLen int) Exports {
	return Exports{refs: refs, rows: rows, from: 0, to: promptLen}
}

// ResultExports are the reads of a finished result per generated token, for every export of
// the apps it enabled: what the server's "xmix.exports" reports, for the CLI.
func ResultExports(b *bundle.Bundle, apps []string, r loader.Result) Exports {
	var refs []exportRef
	for _, a := range b.Manifest.Apps {
		if slices.Contains(apps, a.Name) {
			for _, x := range a.Exports {
				refs = append(refs, exportRef{name: a.Name + "." + x.Name, width: x.Width})
			}
		}
	}
	return tokenExports(refs, r.Rows, r.PromptTokens, 0, len(r.Tokens))
}

func (x Exports) at(pos int, name string) []float32 {
	if pos < 0 || pos >= len(x.rows) || x.rows[pos].Pos != pos {
		return nil
	}
	return x.rows[pos].Exports.Get(name)
}

// MarshalJSON implements json.Marshaler.
func (x Exports) MarshalJSON() ([]byte, error) { return x.appendJSON(nil), nil }

func (x Exports) appendJSON(b []byte) []byte {
	b = append(b, '{')
	for i, ref := range x.refs {
		if i > 0 {
			b = append(b, ',')
		}
		name, _ := json.Marshal(ref.name)
		b = append(b, name...)
		b = append(b, ':', '[')
		for p := x.from; p < x.to; p++ {
			if p > x.from {
				b = append(b, ',')
			}
			v := x.at(p, ref.name)
			switch {
			case v == nil:
				b = append(b, "null"...)
			case ref.width == 1:
				b = appendFloat(b, v[0])
			default:
				b = append(b, '[')
				for k, f := range v {
					if k > 0 {
						b = append(b, ',')
					}
					b = appendFloat(b, f)
				}
				b = append(b, ']')
			}
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendFloat(b []byte, f float32) []byte {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, float64(f), 'g', -1, 32)
}
