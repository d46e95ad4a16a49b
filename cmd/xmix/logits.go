package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"xmix/bundle"
	"xmix/loader"
)

// logitsCmd scores a token sequence: the logits at every position, for checks against other
// implementations (testsuite/gpu/hf_compare.py compares them with transformers).
func logitsCmd() *cobra.Command {
	var f runFlags
	var idsJSON, out, exportsDir string
	var promptLen int
	c := &cobra.Command{
		Use:   "logits BUNDLE.xmb --ids JSON [--out FILE] [--prompt-len N] [--apps A,B --exports DIR]",
		Short: "Next-token logits at every position of a token sequence (teacher forced)",
		Long: `Runs the ids through the model as they are (nothing is prepended: start them with the model's
BOS when its tokenizer adds one): the first --prompt-len ids as one prompt (prefill), the rest
one position at a time (decode), and prints the argmax at every position from the prompt's
last on as JSON. With --out, also writes those positions' logits as little-endian float32
[positions, vocab]. --apps enables deployed apps for the sequence; --exports DIR then writes
each exported read as DIR/NAME.f32, float32 [every position, width] (captures of hidden
states for checks against other implementations: testsuite/gpu/gemma2_compare.py).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ids []int
			if err := json.Unmarshal([]byte(idsJSON), &ids); err != nil {
				return fmt.Errorf("--ids takes a non-empty JSON array of token ids: %v", err)
			}
			if len(ids) == 0 {
				return fmt.Errorf("--ids %s: no token ids; give at least one, e.g. --ids '[128000, 9906]'", idsJSON)
			}
			if promptLen < 1 || promptLen > len(ids) {
				return fmt.Errorf("--prompt-len %d: want 1 to the %d ids", promptLen, len(ids))
			}
			apps, err := appsFor(f.apps, 1)
			if err != nil {
				return err
			}
			if exportsDir != "" && len(apps[0]) == 0 {
				return fmt.Errorf("--exports %s: enable the apps whose reads to write with --apps", exportsDir)
			}
			// Where the results go is checked before the model loads and runs, not after.
			if out != "" {
				if err := checkOutFile(out); err != nil {
					return fmt.Errorf("--out %s: %w", out, err)
				}
			}
			if exportsDir != "" {
				if err := os.MkdirAll(exportsDir, 0o755); err != nil {
					return fmt.Errorf("--exports %s: %w", exportsDir, err)
				}
			}
			b, err := bundle.ReadFile(args[0])
			if err != nil {
				return err
			}
			s, err := open(b, filepath.Dir(args[0]), f)
			if err != nil {
				return err
			}
			defer s.be.Close()
			vocab := b.Manifest.Model.Vocab
			rec := &logitSteps{Backend: s.be, vocab: vocab}
			eng, err := loader.NewEngine(b, rec)
			if err != nil {
				return err
			}
			// The first step prefills the prompt (logits at its last position); the rest are forced.
			res, err := eng.Generate([]loader.Request{{Prompt: ids[:promptLen], Verbatim: true, Apps: apps[0],
				MaxTokens: len(ids) - promptLen + 1, Force: ids[promptLen:]}})
			if err != nil {
				return err
			}
			top := make([]int, len(rec.steps))
			for i, l := range rec.steps {
				for j, v := range l {
					if v > l[top[i]] {
						top[i] = j
					}
				}
			}
			if out != "" {
				buf := make([]byte, 0, 4*vocab*len(rec.steps))
				for _, l := range rec.steps {
					for _, v := range l {
						buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
					}
				}
				if err := os.WriteFile(out, buf, 0o644); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			widths := map[string]int{}
			if exportsDir != "" {
				if widths, err = writeExports(exportsDir, res[0].Rows, len(ids)); err != nil {
					return err
				}
			}
			enc, _ := json.Marshal(map[string]any{"positions": len(rec.steps), "first": promptLen - 1, "vocab": vocab, "argmax": top, "exports": widths})
			fmt.Fprintln(cmd.OutOrStdout(), string(enc))
			return nil
		},
	}
	c.Flags().StringVar(&idsJSON, "ids", "", "JSON array of token ids, fed as they are (BOS included when the model takes one)")
	c.Flags().StringVar(&out, "out", "", "write the logits here as float32 [positions, vocab]")
	c.Flags().IntVar(&promptLen, "prompt-len", 1, "prefill the first N ids as one prompt, then feed the rest one per step")
	c.Flags().StringVar(&f.apps, "apps", "", "comma-separated apps to enable")
	c.Flags().StringVar(&exportsDir, "exports", "", "write each exported read to DIR/NAME.f32 as float32 [positions, width]")
	f.addBackendFlags(c.Flags())
	return c
}

// writeExports writes every export of rows, which must cover positions 0..n-1, as
// dir/NAME.f32 ([n, width] float32, by position; dir made before the run) and returns each
// one's width.
func writeExports(dir string, rows []loader.Row, n int) (map[string]int, error) {
	if len(rows) != n {
		return nil, fmt.Errorf("--exports: %d rows came back for %d positions", len(rows), n)
	}
	data := map[string][]byte{}
	widths := map[string]int{}
	for i, row := range rows {
		if row.Pos != i {
			return nil, fmt.Errorf("--exports: row %d is position %d", i, row.Pos)
		}
		for _, e := range row.Exports {
			if w, ok := widths[e.Name]; ok && w != len(e.Values) {
				return nil, fmt.Errorf("--exports: %s has %d values at position %d, %d before", e.Name, len(e.Values), i, w)
			}
			widths[e.Name] = len(e.Values)
			for _, v := range e.Values {
				data[e.Name] = binary.LittleEndian.AppendUint32(data[e.Name], math.Float32bits(v))
			}
		}
	}
	for name, b := range data {
		if len(b) != 4*n*widths[name] {
			return nil, fmt.Errorf("--exports: %s is missing at some positions", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".f32"), b, 0o644); err != nil {
			return nil, fmt.Errorf("--exports: %w", err)
		}
	}
	return widths, nil
}

// logitSteps keeps the first sample's logits after every step.
type logitSteps struct {
	loader.Backend
	vocab int
	steps [][]float32
}

func (r *logitSteps) Step(t int) error {
	if err := r.Backend.Step(t); err != nil {
		return err
	}
	raw := make([]byte, 4*r.vocab)
	if err := r.Backend.Read(bundle.ActLogits, raw); err != nil {
		return err
	}
	l := make([]float32, r.vocab)
	for i := range l {
		l[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	r.steps = append(r.steps, l)
	return nil
}
