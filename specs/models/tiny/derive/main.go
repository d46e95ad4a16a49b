// Command derive computes the vectors of the tiny apps (specs/apps/tiny/) with xmix itself: it
// runs the embedded model on the CPU backend with a capture read at every layer's resid_post
// over prompt sets, and writes difference-of-means directions and nearest-mean probe weights
// to specs/models/tiny/apps.safetensors. The output is deterministic (fixed prompt sets,
// float64 sums in a fixed order). Run it from the repository root:
//
//	go run ./specs/models/tiny/derive
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/safetensors"
)

const (
	hidden = 256
	layers = 6
	// moodLayer is where tiny-steer's happy_dir was measured; the mood apps read and write
	// around it.
	moodLayer = 3
	// kindLayer is where the kind probe reads: by then the kind word has been read whole.
	kindLayer = 2
	// probeLayer is where the sadness probe reads, before the layers that app 3 steers.
	probeLayer = 2
	// genderLayer is where app 5's single-layer edit writes.
	genderLayer = 2
)

// Kinds the kind probe tells apart, in the order of its outputs.
var probeKinds = []string{"fox", "bear", "cat", "dog", "owl"}

// kindFrames hold a kind in a sentence the corpus could open a story with; the probe's class
// means are taken over the rows from the kind word to the end.
var kindFrames = []string{
	"Once upon a time, a little %s lived near the river.",
	"There was once an old %s who lived in the forest.",
	"One day, a brave %s went to the park.",
	"One morning, a sleepy %s woke up early.",
	"Long ago, a curious %s found a red ball.",
	"A kind %s lived in a small house near the farm.",
}

// pronounFrames name an animal, which has no fixed gender in the corpus, then refer to it as
// She or He (%[1]s) near a place (%[2]s).
var pronounFrames = []string{
	"There was once a bear. %[1]s went to %[2]s.",
	"One day, a little fox woke up. %[1]s walked to %[2]s and smiled.",
	"The old owl lived near %[2]s. %[1]s liked the sun.",
	"A small cat sat by %[2]s. %[1]s was very quiet.",
}

func main() {
	dir := flag.String("dir", "specs/models/tiny", "the tiny model's folder")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "derive:", err)
		os.Exit(1)
	}
}

// sample is a prompt and the byte range [from, to) whose rows it contributes; to 0 means
// the end of the prompt.
type sample struct {
	text     string
	from, to int
}

func run(dir string) error {
	capt, err := newCapturer(dir)
	if err != nil {
		return err
	}
	happy, err := readLines(filepath.Join(dir, "prompts_happy.txt"))
	if err != nil {
		return err
	}
	sad, err := readLines(filepath.Join(dir, "prompts_sad.txt"))
	if err != nil {
		return err
	}
	all := func(ps []string) []sample {
		out := make([]sample, len(ps))
		for i, p := range ps {
			out[i] = sample{p, 0, 0}
		}
		return out
	}
	mHappy, err := capt.mean(all(happy))
	if err != nil {
		return err
	}
	mSad, err := capt.mean(all(sad))
	if err != nil {
		return err
	}
	var out []safetensors.Tensor
	for l := 0; l < layers; l++ {
		d := sub(mHappy[l], mSad[l])
		fmt.Fprintf(os.Stderr, "mood layer %d: |happy-sad| %.3f, cos with layer %d %.3f\n", l, norm(d), moodLayer, cos(d, sub(mHappy[moodLayer], mSad[moodLayer])))
	}
	out = append(out, f32(fmt.Sprintf("mood_l%d", moodLayer), sub(mHappy[moodLayer], mSad[moodLayer])))

	// Sadness probe at probeLayer: sigmoid(w.h + b) with w along sad-happy, scaled so that the
	// two class means score sigmoid(+-2) (0.88 and 0.12), b putting 0.5 at their midpoint.
	d := sub(mSad[probeLayer], mHappy[probeLayer])
	u := scale(d, 1/norm(d))
	k := 4 / norm(d)
	mid := (dot(u, mSad[probeLayer]) + dot(u, mHappy[probeLayer])) / 2
	fmt.Fprintf(os.Stderr, "sad probe layer %d: class means project to %.3f (sad) and %.3f (happy)\n", probeLayer, dot(u, mSad[probeLayer]), dot(u, mHappy[probeLayer]))
	out = append(out, f32("sad_probe", scale(u, k)), f32("sad_probe_bias", []float64{-k * mid}))
	for l := 0; l < layers; l++ {
		u := sub(mHappy[l], mSad[l])
		u = scale(u, 1/norm(u))
		fmt.Fprintf(os.Stderr, "layer %d along the unit mood_l3: happy %.2f sad %.2f; along its own: happy %.2f sad %.2f\n", l,
			dot(mHappy[l], unit(sub(mHappy[moodLayer], mSad[moodLayer]))), dot(mSad[l], unit(sub(mHappy[moodLayer], mSad[moodLayer]))),
			dot(mHappy[l], u), dot(mSad[l], u))
	}

	// Gender: sentences that differ only in their pronoun, from the pronoun on.
	var she, he []sample
	for _, f := range pronounFrames {
		for _, place := range []string{"the park", "the river", "the forest", "the farm"} {
			for _, p := range []struct {
				word string
				into *[]sample
			}{{"She", &she}, {"He", &he}} {
				text := fmt.Sprintf(f, p.word, place)
				*p.into = append(*p.into, sample{text, strings.Index(text, p.word+" "), 0})
			}
		}
	}
	mShe, err := capt.mean(she)
	if err != nil {
		return err
	}
	mHe, err := capt.mean(he)
	if err != nil {
		return err
	}
	for l := 0; l < layers; l++ {
		g := sub(mShe[l], mHe[l])
		fmt.Fprintf(os.Stderr, "gender layer %d: %d she / %d he prompts, |she-he| %.3f\n", l, len(she), len(he), norm(g))
	}
	out = append(out, f32(fmt.Sprintf("she_l%d", genderLayer), sub(mShe[genderLayer], mHe[genderLayer])))

	// Kind probe: nearest class mean at kindLayer, written as one linear score per class:
	// score_k = c_k.h - c_k.m - |c_k|^2/2 with c_k = m_k - m, m the mean of the class means.
	// The class means are over the rows of the kind word itself: the probe names the animal
	// as it is read.
	means := make([][]float64, len(probeKinds))
	for k, kind := range probeKinds {
		var ss []sample
		for _, f := range kindFrames {
			text := fmt.Sprintf(f, kind)
			at := strings.Index(text, " "+kind) + 1
			ss = append(ss, sample{text, at, at + len(kind)})
		}
		m, err := capt.mean(ss)
		if err != nil {
			return err
		}
		means[k] = m[kindLayer]
	}
	center := make([]float64, hidden)
	for _, m := range means {
		for i := range center {
			center[i] += m[i] / float64(len(means))
		}
	}
	for k, kind := range probeKinds {
		c := sub(means[k], center)
		out = append(out, f32("kind_"+kind, c), f32("kind_"+kind+"_bias", []float64{-dot(c, center) - dot(c, c)/2}))
	}

	path := filepath.Join(dir, "apps.safetensors")
	if err := safetensors.WriteFile(path, out, map[string]string{"derived_by": "go run ./specs/models/tiny/derive"}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d tensors)\n", path, len(out))
	return nil
}

// capturer runs prompts through the tiny model with every layer's resid_post exported.
type capturer struct {
	eng *loader.Engine
}

func newCapturer(dir string) (*capturer, error) {
	tmp, err := os.MkdirTemp("", "derive")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var app strings.Builder
	app.WriteString("app: cap\nbuffers:\n")
	for l := 0; l < layers; l++ {
		fmt.Fprintf(&app, "  l%d: {shape: [%d], export: true}\n", l, hidden)
	}
	app.WriteString("ops:\n")
	for l := 0; l < layers; l++ {
		fmt.Fprintf(&app, "  - read: {at: {layers: [%d], hook: resid_post}, kernel: capture, into: l%d}\n", l, l)
	}
	ap := filepath.Join(tmp, "cap.yaml")
	if err := os.WriteFile(ap, []byte(app.String()), 0o644); err != nil {
		return nil, err
	}
	b, err := compile.Build(filepath.Join(dir, "..", "tiny.yaml"), []string{ap}, compile.Options{})
	if err != nil {
		return nil, err
	}
	be, err := backend(b)
	if err != nil {
		return nil, err
	}
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		return nil, err
	}
	return &capturer{eng}, nil
}

func backend(b *bundle.Bundle) (loader.Backend, error) {
	w, err := loader.OpenWeights(b, "")
	if err != nil {
		return nil, err
	}
	defer w.Close()
	return cpu.New(b, w, nil)
}

// mean returns, per layer, the mean residual over every prompt row from byte s.from on (the
// BOS row and the rows before the marked word left out), rows weighted equally.
func (c *capturer) mean(ss []sample) ([][]float64, error) {
	sum := make([][]float64, layers)
	for l := range sum {
		sum[l] = make([]float64, hidden)
	}
	n := 0
	reqs := make([]loader.Request, len(ss))
	for i, s := range ss {
		reqs[i] = loader.Request{Prompt: loader.ByteTokenizer{}.Encode(s.text), Apps: []string{"cap"}, MaxTokens: 1}
	}
	res, err := c.eng.Generate(reqs)
	if err != nil {
		return nil, err
	}
	for i, s := range ss {
		rows := res[i].Rows
		// Row 0 is BOS; row 1+j fed byte j of the prompt.
		to := len(reqs[i].Prompt)
		if s.to > 0 {
			to = s.to
		}
		for r := 1 + s.from; r <= to; r++ {
			for l := 0; l < layers; l++ {
				x := rows[r].Exports.Get(fmt.Sprintf("cap.l%d", l))
				for j, v := range x {
					sum[l][j] += float64(v)
				}
			}
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no rows to average")
	}
	for l := range sum {
		for j := range sum[l] {
			sum[l][j] /= float64(n)
		}
	}
	return sum, nil
}

func readLines(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

func f32(name string, v []float64) safetensors.Tensor {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(x)))
	}
	return safetensors.Tensor{Name: name, Dtype: "F32", Shape: []int{len(v)}, Data: data}
}

func sub(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func scale(a []float64, k float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = k * a[i]
	}
	return out
}

func unit(a []float64) []float64 { return scale(a, 1/norm(a)) }

func norm(a []float64) float64 { return math.Sqrt(dot(a, a)) }

func cos(a, b []float64) float64 { return dot(a, b) / (norm(a) * norm(b)) }
