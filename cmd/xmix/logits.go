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
	var idsJSON, out string
	c := &cobra.Command{
		Use:   "logits BUNDLE.xmb --ids JSON [--out FILE]",
		Short: "Next-token logits at every position of a token sequence (teacher forced)",
		Long: `Runs the ids through the model as they are (nothing is prepended: start them with the model's
BOS when its tokenizer adds one), one position at a time after the first, and prints the argmax
at every position as JSON. With --out, also writes all logits as little-endian float32
[positions, vocab].`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ids []int
			if err := json.Unmarshal([]byte(idsJSON), &ids); err != nil || len(ids) < 1 {
				return fmt.Errorf("--ids takes a non-empty JSON array of token ids: %v", err)
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
			// The first step prefills the first id alone (logits at position 0); the rest are forced.
			if _, err := eng.Generate([]loader.Request{{Prompt: ids[:1], Verbatim: true, MaxTokens: len(ids), Force: ids[1:]}}); err != nil {
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
					return err
				}
			}
			enc, _ := json.Marshal(map[string]any{"positions": len(rec.steps), "vocab": vocab, "argmax": top})
			fmt.Fprintln(cmd.OutOrStdout(), string(enc))
			return nil
		},
	}
	c.Flags().StringVar(&idsJSON, "ids", "", "JSON array of token ids, fed as they are (BOS included when the model takes one)")
	c.Flags().StringVar(&out, "out", "", "write all logits here as float32 [positions, vocab]")
	f.addBackendFlags(c.Flags())
	return c
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
