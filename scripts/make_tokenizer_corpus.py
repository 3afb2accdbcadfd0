#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/corpus.json, the tokenizer test corpus (deterministic; run from the repo root)."""
import json, random
c = []
# --- English prose
c += [
 "Hello world",
 "hello world",
 " Hello",
 "Hello, world! How are you doing today?",
 "The quick brown fox jumps over the lazy dog.",
 "It's a test: don't, won't, they're, we've, I'm, you'll, he'd. IT'S LOUD; DON'T SHOUT.",
 "A cache hit means the engine skips the prefill for every block it has already seen; a miss costs a full forward pass.",
 "Mr. O'Neil paid $1,234.56 on 2026-11-29 at 10:45 a.m. (about 3.5% more than last year).",
 "e.g. i.e. etc. vs. U.S.A. Ph.D. -- em—dash – en–dash … ellipsis “quotes” ‘single’ «guillemets»",
 "",
 " ",
 "a",
 "~",
 " ~",
 "~/path ~user a~b ~~~ ~ ~",
 "Führer naïve café résumé coöperate Ångström jalapeño façade",
 "Cafe\u0301 vs Café: the first uses a combining acute accent (NFC composes it).",
 "e\u0301\u0300 a\u0308\u0304 o\u0328\u0304 \u0041\u030a \u212b \u2126 \ufb01",
 "Hangul jamo: \u1100\u1161\u11a8 \u1112\u1161\u11ab and precomposed 한국어",
]
# --- CJK
c += [
 "你好，世界！今天天气很好，我们去公园散步吧。",
 "深度学习模型的推理服务需要高效的键值缓存管理。",
 "这是一个包含数字123和English单词的混合句子。",
 "日本語のテキスト：東京は日本の首都です。ひらがな、カタカナ、漢字が混在しています。",
 "ｶﾀｶﾅ（半角）とカタカナ（全角）、ｈａｌｆ　ｗｉｄｔｈ　ｆｕｌｌ　ｗｉｄｔｈ",
 "한국어 문장입니다. 서울은 대한민국의 수도입니다.",
 "中文、日本語、한국어 mixed with English and العربية and русский текст.",
 "繁體中文與简体中文：龍、龙；臺灣、台湾。",
 "𠀀𠀁𪚥 rare CJK extension characters 𡃁",
]
# --- code
c += [
 "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
 "#include <cstdio>\nint main(int argc, char** argv) {\n\tstd::printf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
 "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
 "const f = async (x) => { await fetch(`/api/${x}?q=1&r=2`); return x ?? null; };",
 "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
 "<html><body><div class=\"a\">Text &amp; more</div></body></html>",
 "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"k\": \"v\\u00e9\"}}",
 "if [ -f ~/.bashrc ]; then\n  source ~/.bashrc\nfi\nexport PATH=$HOME/bin:$PATH\n",
 "    indented four spaces\n\tindented tab\n\t\tindented two tabs\n        eight spaces",
 "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&&=e;f||=g;h??=i;",
 "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
]
# --- numbers
c += [
 "0 1 12 123 1234 12345 123456 1234567",
 "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
 "Version 3.14.159, IP 192.168.0.1, phone +1-555-0100, hex 0xDEADBEEF, 1e-9, 6.02e23",
 "١٢٣٤٥ ٦٧٨٩٠ (Arabic-Indic digits) ० १ २ ३ (Devanagari) ①②③ Ⅻ ½ ¾ ²³",
 "2026年11月29日 星期日 15:30",
]
# --- emoji
c += [
 "I love it 😀😃😄😁 🎉🎉",
 "Family: 👨‍👩‍👧‍👦 couple 👩‍❤️‍👨 profession 👩🏽‍💻 skin tones 👍🏻👍🏼👍🏽👍🏾👍🏿",
 "Flags: 🇺🇸🇨🇳🇯🇵🇰🇷🇫🇷🇩🇪 🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏳️‍🌈",
 "Keycaps 1️⃣ 2️⃣ #️⃣ and variation ☺︎ ☺️ ❤ ❤️",
 "🙂",
 "emoji🙂inside🙂words",
]
# --- whitespace
c += [
 "two  spaces   three    four     five",
 "trailing spaces   ",
 "   leading spaces",
 "tabs\tbetween\t\twords\t",
 "line1\nline2\n\nline4\n\n\n",
 "windows\r\nline\r\nendings\r\n\r\n",
 "mixed \r\n \n\r \t\n  \n",
 "\n\n\n\n",
 "\t\t\t",
 "a\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic space",
 "zero\u200bwidth\u200cnon\u200djoiner\ufeffBOM\u2060word-joiner",
 "soft\u00adhyphen and next\u0085line and line\u2028sep and para\u2029sep",
 "control chars \u0001\u0002\u001f\u007f end",
 "word \n  word",
 "end with newline and spaces \n   ",
]
# --- control token spellings
c += [
 "<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>Who are you?<｜Assistant｜></think>I am DeepSeek<｜end▁of▁sentence｜>",
 "<｜User｜>1+1=?<｜Assistant｜><think>\nLet me think.\n</think>\n2<｜end▁of▁sentence｜>",
 "<|User|> ascii bars are not control tokens <|Assistant|>",
 "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
 "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">deepinfer</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
 "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|><|endoftext|>",
 "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
 "<|EOT|> <｜fim▁begin｜>def f():<｜fim▁hole｜>\n<｜fim▁end｜>",
 "text<think>inner</think>text <think> spaced </think> ",
 "<｜place▁holder▁no▁798｜><|reserved_special_token_0|><|reserved_special_token_250|>",
 "<｜User｜<｜User｜>>  <<|im_start|>|im_end|> <|begin_of_text|<|begin_of_text|>",
 "half <｜User and half User｜> and <think and think>",
]
# --- mixed scripts
c += [
 "Ελληνικά κείμενο, русский язык, עברית, العربية, हिन्दी, ไทย, ქართული, Հայերեն",
 "Mixed: English中文日本語한국어Русский123😀!?",
 "Math: ∀x∈ℝ, ∃y: x² + y² ≤ 1 → ∫₀¹ f(x)dx ≈ π/4; α β γ δ ∑ ∏ √ ∞",
 "Currency: $ € £ ¥ ₹ ₩ ₽ ₿ 100€ ¥500",
 "Box drawing ┌─┐│ │└─┘ and arrows ← ↑ → ↓ ⇒ ⇔",
 "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ １２３ ！？",
 "Thai: ภาษาไทยไม่มีช่องว่างระหว่างคำ; Hindi: नमस्ते दुनिया; Tamil: வணக்கம்",
 "Combining: ǹ̷̢͉̫ỏ̶̧̫͙r̷̨̛͚m̴̛̺̳a̵̡̝͐l̶̲̈́ zalgo text",
 "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D x's X'S",
 "!!!??? ... ,,, ;;; ::: ---- ____ **** #### @@@@ &&&& |||| \\\\\\\\",
]
# --- long texts (own prose, deterministic)
random.seed(20261129)
words_en = ("serving engine cache block prefix token router decode prefill scheduler batch kernel memory "
            "latency throughput request stream model weight expert attention layer tensor queue").split()
words_zh = list("模型推理缓存调度请求解码预填充专家注意力张量队列吞吐延迟内存批处理")
def sentence():
    n = random.randint(6, 16)
    ws = [random.choice(words_en) for _ in range(n)]
    ws[0] = ws[0].capitalize()
    if random.random() < 0.3: ws.insert(random.randint(1, n - 1), str(random.randint(0, 10**random.randint(1, 9))))
    return " ".join(ws) + random.choice([".", "!", "?", ";", ":"])
para_en = "\n\n".join(" ".join(sentence() for _ in range(6)) for _ in range(8))
para_zh = "\n".join("".join(random.choice(words_zh) for _ in range(random.randint(20, 60))) + "。" for _ in range(30))
code_long = "\n".join(f"    let value_{i} = compute(&input[{i}..{i + 8}], {i * 37 % 101})?; // step {i}" for i in range(80))
mixed_long = "".join(random.choice([sentence() + " ", "".join(random.choice(words_zh) for _ in range(12)), " 😀 ", "\n", "\t", "  ", str(random.randint(0, 99999)), " 👨‍👩‍👧 ", "éàü ", "<｜User｜>", "<|im_start|>"]) for _ in range(400))
ws_long = " " * 300 + "x" + "\n" * 50 + "y" + "\t" * 40 + " \n" * 30 + "z"
digits_long = "".join(str(random.randint(0, 9)) for _ in range(2000))
c += [para_en, para_zh, code_long, mixed_long, ws_long, digits_long, "a" * 1000, "😀" * 300, "中" * 800]
json.dump(c, open("tests/fixtures/tokenizer/corpus.json", "w"), ensure_ascii=False, indent=0)
print(len(c), sum(len(s.encode()) for s in c))

# --- corpus_edge.json: short random mixes of the characters where regex engines disagree (Oniguruma,
# which HF uses, counts U+0085 as \s but not U+FEFF or U+180E; JavaScript's \s is the other way round
# for U+0085 and U+FEFF; PCRE2's \s includes U+180E), combining marks, contractions, control spellings.
random.seed(1729)
units = [
    "abc", "XYZ", "7", "42", "123456", " ", "  ", "\t", "\n", "\r\n", "\r", "\u0085", "\ufeff", "\u180e", "\u2028",
    "\u2029", "\u00a0", "\u3000", "\u200b", "\u200d", "'s", "'T", "'re", "'LL", "'d", "'", "\"", ".", ",", "!?",
    "~", "-", "_", "(", "<", ">", "|", "中文", "かな", "カナ", "한", "é", "e\u0301", "\u0301", "\u0328\u0301",
    "ǹ̷̢", "α", "д", "ع", "ि", "١", "²", "😀", "👨‍👩‍👧", "🇺🇸", "1️⃣", "\u0001", "€", "∑", "<｜User｜>",
    "<|im_start|>", "<|begin_of_text|>", "<think>", "</think>", "｜DSML｜",
]
edge = ["".join(random.choice(units) for _ in range(random.randint(1, 12))) for _ in range(400)]
json.dump(edge, open("tests/fixtures/tokenizer/corpus_edge.json", "w"), ensure_ascii=False, indent=0)
print(len(edge), sum(len(s.encode()) for s in edge))
