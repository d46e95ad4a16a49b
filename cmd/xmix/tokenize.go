package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"xmix/bundle"
	"xmix/chat"
	"xmix/loader"
	"xmix/tokenizer"
)

func tokenizeCmd() *cobra.Command {
	var decode bool
	c := &cobra.Command{
		Use:   "tokenize (BUNDLE.xmb|tokenizer.json) TEXT",
		Short: "Print the token ids of TEXT as a JSON array (--decode: TEXT is a JSON array of ids)",
		Example: `  xmix tokenize model.xmb "Hello, world"
  xmix tokenize tokenizer.json --decode "[9906, 11, 1917]"`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, vocab, err := openTokenizer(args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if decode {
				var ids []int
				if err := json.Unmarshal([]byte(args[1]), &ids); err != nil {
					return fmt.Errorf("--decode takes a JSON array of token ids: %w", err)
				}
				// As /detokenize: an id the model does not have is an error, not a silent gap.
				for i, id := range ids {
					if id < 0 || id >= vocab {
						return fmt.Errorf("--decode: ids[%d] = %d is outside the vocabulary (0-%d)", i, id, vocab-1)
					}
				}
				out, _ := json.Marshal(tok.Decode(ids))
				fmt.Fprintln(w, string(out))
				return nil
			}
			out, _ := json.Marshal(tok.Encode(args[1]))
			fmt.Fprintln(w, string(out))
			return nil
		},
	}
	c.Flags().BoolVar(&decode, "decode", false, "decode a JSON array of ids instead")
	return c
}

// openTokenizer reads a tokenizer.json or a bundle's tokenizer, with the vocabulary size its
// ids must stay under (the model's, for a bundle).
func openTokenizer(path string) (loader.Tokenizer, int, error) {
	if strings.HasSuffix(path, ".json") {
		t, err := tokenizer.Load(path)
		if err != nil {
			return nil, 0, err
		}
		return t, t.VocabSize(), nil
	}
	b, err := bundle.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	t, err := loader.NewTokenizer(b)
	return t, b.Manifest.Model.Vocab, err
}

// chatPrompt renders text as one user turn with the model's chat template and returns the
// model's whole input for it (a Request with Verbatim set).
func chatPrompt(m bundle.ModelConfig, tok loader.Tokenizer, text string) ([]int, error) {
	c, err := loader.NewChat(m, tok)
	if err != nil {
		return nil, fmt.Errorf("--chat: %w", err)
	}
	ids, err := c.GenerationPrompt([]chat.Message{{Role: "user", Content: text}}, true)
	if err != nil {
		return nil, fmt.Errorf("--chat: %w", err)
	}
	return ids, nil
}
