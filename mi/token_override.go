package mi

import (
	"fmt"
	"math"
)

// token_override: the sampled token becomes `token` (a run-time replaceable scalar, so a
// request may override it). The sampler runs it, after it picks each sample's token.
func init() {
	Register(Template{
		Name: "token_override", Kind: Write, Hooks: []string{"sampled"}, Alpha: Required, RunsIn: "sample",
		Args:  map[string]Arg{"token": {Kind: Scalar, Required: true}},
		Check: checkToken,
	})
}

func checkToken(c CheckArgs) (string, string) {
	if v := c.Scalars[c.Alpha]; v != float32(math.Trunc(float64(v))) || v < 0 || v >= float32(c.Vocab) {
		return fmt.Sprintf("token_override: token %v is not a token id", v), fmt.Sprintf("model %q has tokens 0-%d", c.Model, c.Vocab-1)
	}
	return "", ""
}
