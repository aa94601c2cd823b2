"""Tokenizer backends behind one small interface: Hugging Face `tokenizer.json` and tiktoken (Kimi).

Both encode with special/added tokens recognised from their text, decode with specials rendered as
text, give the raw bytes of one token and the id of a special token. Neither executes remote code;
the tiktoken backend never imports transformers at all.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from app.errors import InputError

# Kimi K2 / K2.5 pre-tokeniser (tiktoken pat_str); the alternatives in the order of the reference.
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
TIKTOKEN_SPECIAL_SLOTS = 256
_FINGERPRINT_FILES = ("tokenizer.json", "tiktoken.model", "tokenizer_config.json", "special_tokens_map.json")


class Tokenizer:
    """The interface every backend gives (see docs/contracts.md, "Tokens").

    `encode` recognises special and added tokens written as text; `decode` renders them as text and
    turns incomplete UTF-8 into U+FFFD; `token_bytes` is exact (partial characters included).
    """

    kind: str = ""
    path: Path
    fingerprint: str
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, special-token strings mapped to their ids."""
        raise NotImplementedError

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of `text` with special-token strings treated as plain text."""
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a rendered prompt as the model's server encodes it: the tokenizer's own path, its normaliser
        included (transformers' `apply_chat_template(tokenize=True)`, and every server built on it), special-token
        strings mapped to their ids. The output side uses `encode`, which keeps the model's raw bytes."""
        return self.encode(text)

    def changes_text(self, text: str) -> bool:
        """True when the tokenizer's normaliser would change `text` (False for tokenizers without one)."""
        return False

    def encode_known(self, text: str) -> tuple[list[int], bool]:
        """`encode(text)` and whether those ids are known to decode to exactly `text` without decoding them
        (True only for a lossless backend on text without lone surrogates; False: not known, decode to see)."""
        return self.encode(text), False

    def encode_between(self, segments: Sequence[str], between: Sequence[int]) -> tuple[list[int], bool] | None:
        """`encode_known` of segments[0] + special between[0] + segments[1] + ... (one more segment than
        specials; each of `between` a special token's id), encoded a segment at a time where that is provably the
        same ids: no segment holds any special token's text and none can start in a segment and run into the
        next special. None where that is not known (the caller encodes the joined text)."""
        return None

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` with specials as text; invalid UTF-8 becomes U+FFFD."""
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token (a special token's text as UTF-8)."""
        raise NotImplementedError

    def special_id(self, text: str) -> int | None:
        """The id of the special/added token spelled `text`, or None."""
        return self._specials.get(text)

    def is_special(self, token_id: int) -> bool:
        """True when `token_id` is a special or added token (a marker), not ordinary BPE."""
        return token_id in self._special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of every special/added token (for fast membership tests over long id lists)."""
        return self._special_ids

    def special_tokens(self) -> dict[str, int]:
        """All special/added tokens: text -> id."""
        return dict(self._specials)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes of `ids` (no U+FFFD substitution)."""
        try:
            return b"".join(map(self._id_to_bytes.__getitem__, ids))
        except KeyError as exc:
            raise ValueError(
                f"token id {exc.args[0]} is outside the vocabulary of {self.path} (size {self.vocab_size})"
            ) from None

    def id_of_bytes(self, data: bytes) -> int | None:
        """The ordinary (non-special) token whose bytes are `data`, or None."""
        return self._bytes_to_id.get(data)

    def ids_of_bytes(self, datas: Iterable[bytes]) -> list[int | None]:
        """`id_of_bytes` of each of `datas`, in order (one C-level pass: logprob tokens of a whole response)."""
        return list(map(self._bytes_to_id.get, datas))

    _specials: dict[str, int]
    _special_ids: frozenset[int]
    _bytes_to_id: dict[bytes, int]
    _id_to_bytes: dict[int, bytes]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} vocab={self.vocab_size} fp={self.fingerprint[:12]}>"


def _fingerprint(directory: Path) -> str:
    h = hashlib.sha256()
    for name in _FINGERPRINT_FILES:
        p = directory / name
        if p.exists():
            h.update(name.encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); replace the file with the model's original"
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object at the top level")
    return data


class TiktokenTokenizer(Tokenizer):
    """Kimi-style tokenizer: `tiktoken.model` ranks + 256 special slots named by `added_tokens_decoder`."""

    kind = "tiktoken"

    def __init__(self, directory: Path, pattern: str = KIMI_PATTERN) -> None:
        import tiktoken

        self.path = directory
        model = directory / "tiktoken.model"
        ranks = _load_ranks(model)
        config_path = directory / "tokenizer_config.json"
        named: dict[int, str] = {}
        if config_path.exists():
            decoder = _read_json(config_path).get("added_tokens_decoder") or {}
            for key, entry in decoder.items():
                try:
                    named[int(key)] = entry["content"] if isinstance(entry, dict) else str(entry)
                except (ValueError, KeyError):
                    raise InputError(
                        f"{config_path}: added_tokens_decoder[{key!r}]: expected an integer id with a 'content' string"
                    ) from None
        n_base = len(ranks)
        specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_base, n_base + TIKTOKEN_SPECIAL_SLOTS)}
        try:
            self._enc = tiktoken.Encoding(
                name=f"eaglewatch:{directory.name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
            )
        except ValueError as exc:
            raise InputError(f"{model}: tiktoken rejected the vocabulary or pattern ({exc})") from None
        self._core = self._enc._core_bpe
        self._allowed = set(specials)
        # tiktoken finds special tokens with one regex alternation over all 256 (a third of its encode time on
        # typical output); a trie-shaped Python pattern finds the same matches faster, and the text between them
        # goes to encode_ordinary. Exact only when no special is a prefix of another (then at most one special
        # matches at any position, whatever the order tiktoken's alternation tries them in); else tiktoken's way.
        self._special_re = _special_pattern(specials)
        # encode_between: the characters a special starts with (a segment holds a special only where one of them
        # is); None when a special could run from a segment into the special after it
        self._special_starts = _special_starts(specials) if self._special_re is not None else None
        # encode_between: the ids of short runs (tool-call ids such as "functions.get_weather:0", small arguments)
        # kept, since they recur across samples; a call into tiktoken costs as much as a dozen dict lookups
        self._short_runs: dict[str, list[int]] = {}
        # decode(encode(text)) == text when every character falls in some match of the pre-tokeniser pattern
        # (Kimi's does: letters, numbers, Han, `[^\s\p{L}\p{N}]+`, `\s+`; tests/tokens/test_tokenizer.py checks
        # every code point) and every single byte has a rank (BPE then spells any match exactly)
        self._lossless = pattern == KIMI_PATTERN and all(bytes([b]) in ranks for b in range(256))
        self._specials = specials
        self._special_ids = frozenset(specials.values())
        self._bytes_to_id = ranks
        self._id_to_bytes = {i: b for b, i in ranks.items()}
        self._id_to_bytes.update({i: t.encode("utf-8") for t, i in specials.items()})
        self.vocab_size = n_base + TIKTOKEN_SPECIAL_SLOTS
        self.fingerprint = _fingerprint(directory)

    @property
    def encoding(self):
        """The underlying `tiktoken.Encoding` (for benchmarks and equivalence tests)."""
        return self._enc

    def encode_known(self, text: str) -> tuple[list[int], bool]:
        try:
            return self._encode_split(text), self._lossless
        except UnicodeEncodeError:  # lone surrogates: tiktoken replaces them, so the ids decode to other text
            return self._core_encode(text), False

    def encode(self, text: str) -> list[int]:
        try:
            return self._encode_split(text)
        except UnicodeEncodeError:  # lone surrogates
            return self._core_encode(text)

    def _encode_split(self, text: str) -> list[int]:
        # Same ids as tiktoken's `encode(text, allowed_special="all")` (tiktoken's Rust loop: find the next special,
        # regex-split and BPE the text before it, emit the special's id), with the special search done here.
        # (The Python wrapper itself rebuilds the disallowed-special set on every call: skipped as well.)
        # Raises UnicodeEncodeError on lone surrogates (the callers fall back to tiktoken's own handling).
        rx = self._special_re
        if rx is None:
            return self._core.encode(text, self._allowed)
        parts = rx.split(text)  # [text, special, text, special, ..., text]: one C call finds every special
        ordinary = self._core.encode_ordinary
        if len(parts) == 1:
            return ordinary(text)
        specials = self._specials
        out: list[int] = ordinary(parts[0]) if parts[0] else []
        for k in range(1, len(parts), 2):
            out.append(specials[parts[k]])
            if parts[k + 1]:
                out += ordinary(parts[k + 1])
        return out

    def encode_between(self, segments: Sequence[str], between: Sequence[int]) -> tuple[list[int], bool] | None:
        # tiktoken encodes the text between two specials on its own (see _encode_split). No special starts at any
        # place in a segment (each place holding a special's first character is tried; str.find of one character
        # is a memchr, a fraction of one regex scan), and _special_starts ruled out a special that starts in a
        # segment and runs into the special after it: so the joined text splits exactly at `between`.
        starts = self._special_starts
        if starts is None:
            return None
        # one text to search ("\0" is in no special, so none spans two segments)
        rx = self._special_re
        assert rx is not None  # _special_starts is set only with it
        if holds_at(starts, rx.match, "\0".join(segments)):
            return None
        ordinary = self._core.encode_ordinary
        short = self._short_runs
        out: list[int] | None = None  # the first long run's own list (not copied), else a new one
        last = len(between)
        try:
            for k, seg in enumerate(segments):
                if seg:
                    if len(seg) <= _SHORT_RUN:
                        ids = short.get(seg)
                        if ids is None:
                            if len(short) >= _SHORT_RUNS:
                                short.clear()
                            ids = short[seg] = ordinary(seg)
                        if out is None:
                            out = list(ids)  # a copy: the kept list must not grow
                        else:
                            out += ids
                    elif out is None:
                        out = ordinary(seg)
                    else:
                        out += ordinary(seg)
                if k < last:
                    if out is None:
                        out = [between[k]]
                    else:
                        out.append(between[k])
        except UnicodeEncodeError:  # lone surrogates: the joined text takes tiktoken's own handling
            return None
        return (out if out is not None else []), self._lossless

    def _core_encode(self, text: str) -> list[int]:
        try:
            return self._core.encode(text, self._allowed)
        except UnicodeEncodeError:  # lone surrogates: tiktoken's own fallback
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self._core.encode(text, self._allowed)

    def encode_ordinary(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self._enc.decode_bytes(list(ids))

    def token_bytes(self, token_id: int) -> bytes:
        try:
            return self._id_to_bytes[token_id]
        except KeyError:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary of {self.path} (size {self.vocab_size})"
            ) from None


def _special_pattern(specials: dict[str, int]) -> re.Pattern[str] | None:
    """A regex matching exactly the special-token strings, shaped as a trie (one branch per next character, so a
    candidate position costs a few character tests, not one per special); None when a special is a prefix of
    another (the leftmost match would then depend on the order of alternatives)."""
    if not specials:
        return None
    trie: dict = {}
    for s in specials:
        if not s:
            return None
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str | None:
        if "" in node and len(node) > 1:
            return None  # a special ends where a longer one goes on: a prefix relation
        alts = []
        for ch in sorted(k for k in node if k):
            rest = emit(node[ch])
            if rest is None:
                return None
            alts.append(re.escape(ch) + rest)
        if len(alts) <= 1:
            return alts[0] if alts else ""
        return "(?:" + "|".join(alts) + ")"

    pattern = emit(trie)
    return re.compile(f"({pattern})", re.S) if pattern else None  # one group: re.split keeps the specials


_SHORT_RUN = 48  # characters: encode_between keeps the ids of runs this short
_SHORT_RUNS = 4096  # at most this many (then it starts over)


def holds_at(starts: Iterable[str], at: Callable[[str, int], object], text: str) -> bool:
    """True when `at(text, i)` holds at some place i of `text` that holds one of the characters `starts` (the
    first characters of what `at` matches there). Each str.find of one character is a memchr: the text is read
    at C speed, and `at` (a compiled pattern's match) runs only where a match could start."""
    for ch in starts:
        i = text.find(ch)
        while i >= 0:
            if at(text, i):
                return True
            i = text.find(ch, i + 1)
    return False


def _special_starts(specials: Iterable[str]) -> tuple[str, ...] | None:
    """The characters the specials start with, or None when some special holds one of them after its own first
    character (only then could a special that starts in one text run on into a special written after it), holds
    "\0", or they start with more than four characters (a search per character would cost more than one scan)."""
    specials = [s for s in specials if s]
    first = {s[0] for s in specials}
    if len(first) > 4 or any("\0" in s for s in specials) or any(ch in first for s in specials for ch in s[1:]):
        return None
    return tuple(sorted(first))


def _load_ranks(model: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    try:
        lines = model.read_bytes().splitlines()
    except OSError as exc:
        raise InputError(f"{model}: cannot be read ({exc.strerror})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise InputError(
                f"{model}:{lineno}: expected '<base64 token> <rank>'; the file is not a tiktoken BPE vocabulary"
            ) from None
    if not ranks:
        raise InputError(f"{model}: the file is empty; copy the model's original tiktoken.model")
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100 upwards.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class HFTokenizer(Tokenizer):
    """A `tokenizer.json` loaded with the `tokenizers` library (no transformers, no remote code)."""

    kind = "hf"

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.path = directory
        path = directory / "tokenizer.json"
        raw = _read_json(path)
        try:
            self._tok = RustTokenizer.from_str(json.dumps(raw))
        except Exception as exc:  # the Rust error names the bad field
            raise InputError(f"{path}: the tokenizers library cannot load it ({exc})") from None
        self._specials = {t["content"]: int(t["id"]) for t in raw.get("added_tokens", [])}
        self._special_ids = frozenset(self._specials.values())
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        vocab = self._tok.get_vocab(with_added_tokens=False)
        self._byte_level = _uses_byte_level(raw)
        self._has_normalizer = raw.get("normalizer") is not None
        # The same tokenizer without its normaliser: a model can emit text its normaliser would change
        # (e.g. a decomposed accent under NFC); such text is encoded raw so the ids decode to exactly it.
        self._raw_tok = RustTokenizer.from_str(json.dumps(dict(raw, normalizer=None))) if self._has_normalizer else None
        self._id_to_bytes: dict[int, bytes] = {}
        if self._byte_level:
            inverse = {c: b for b, c in _bytes_to_unicode().items()}
            for piece, i in vocab.items():
                try:
                    self._id_to_bytes[i] = bytes(inverse[c] for c in piece)
                except KeyError:
                    self._id_to_bytes[i] = piece.encode("utf-8")
        else:
            for i in vocab.values():
                self._id_to_bytes[i] = self._tok.decode([i], skip_special_tokens=False).encode("utf-8")
        self._bytes_to_id = {}
        for i in sorted(self._id_to_bytes, reverse=True):
            if i not in self._special_ids:
                self._bytes_to_id[self._id_to_bytes[i]] = i
        for t, i in self._specials.items():
            self._id_to_bytes[i] = t.encode("utf-8")
        self._lossless = _hf_lossless(raw, vocab)
        self.fingerprint = _fingerprint(directory)

    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer` (for benchmarks and equivalence tests)."""
        return self._tok

    def normalize(self, text: str) -> str:
        """`text` after the tokenizer's normaliser (unchanged when it has none)."""
        norm = self._tok.normalizer
        return norm.normalize_str(text) if norm is not None else text

    def changes_text(self, text: str) -> bool:
        """True when the normaliser would change `text` (ASCII never changes under NFC-style normalisers)."""
        return self._raw_tok is not None and not text.isascii() and self._tok.normalizer.normalize_str(text) != text

    def encode_known(self, text: str) -> tuple[list[int], bool]:
        # decode here is the tokens' bytes (byte-level), so a lossless encode (see _hf_lossless) is known
        return self.encode(text), self._lossless

    def encode(self, text: str) -> list[int]:
        # Text the normaliser would change is encoded without it (pre-tokeniser + BPE on the raw text), so
        # the ids carry the returned bytes exactly; everything else takes the tokenizer's own path.
        # encode_batch_fast: the same ids without the character offsets `encode` also computes (20% of the
        # whole path's reconstruction CPU with the sample tokenizer, bench/engine.py)
        tok = self._raw_tok if self._raw_tok is not None and self.changes_text(text) else self._tok
        return tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_prompt(self, text: str) -> list[int]:
        # the normaliser applies: a prompt is what the server fed the model, and the server normalises (NFC turns
        # U+F981 into U+5973 before BPE), unlike a model's output, which is kept as the bytes it generated
        return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_ordinary(self, text: str) -> list[int]:
        # Bypass the added-token matcher: pre-tokeniser and model only (no normaliser, as in `encode`).
        pieces = self._tok.pre_tokenizer.pre_tokenize_str(text) if self._tok.pre_tokenizer else [(text, None)]
        model = self._tok.model
        return [t.id for piece, _ in pieces for t in model.tokenize(piece)]

    def decode(self, ids: Sequence[int]) -> str:
        if self._byte_level:
            return self.decode_bytes(ids).decode("utf-8", errors="replace")
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        try:
            return self._id_to_bytes[token_id]
        except KeyError:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary of {self.path} (size {self.vocab_size})"
            ) from None


_IDENTITY_ON_UNCHANGED = ("NFC", "NFD", "NFKC", "NFKD")  # normalisers that keep ASCII (changes_text skips it)
_KEEPS_TEXT_SPLITS = ("Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")  # not "Removed"


def _hf_lossless(raw: dict, vocab: dict[str, int]) -> bool:
    """True when the bytes of `encode(text)`'s tokens are always text's UTF-8 (so `decode`, which joins those
    bytes on a byte-level tokenizer, gives text back): byte-level BPE with every byte's symbol in the vocabulary,
    a pre-tokeniser of ByteLevel without an added prefix space and Splits that keep all text, a normaliser that
    `encode` bypasses whenever it would change the text, and added tokens that strip no whitespace. Anything
    else: False (not known; callers decode)."""
    model = raw.get("model") or {}
    if (
        model.get("type") != "BPE"
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or not all(c in vocab for c in _bytes_to_unicode().values())
    ):
        return False

    def pre_ok(node) -> bool:
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "Sequence":
            return all(pre_ok(n) for n in node.get("pretokenizers") or ())
        if kind == "ByteLevel":
            return not node.get("add_prefix_space")
        if kind == "Split":
            return node.get("behavior") in _KEEPS_TEXT_SPLITS
        return False

    def norm_ok(node) -> bool:
        if node is None:
            return True
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "Sequence":
            return all(norm_ok(n) for n in node.get("normalizers") or ())
        return kind in _IDENTITY_ON_UNCHANGED

    pre = raw.get("pre_tokenizer")
    has_byte_level = '"ByteLevel"' in json.dumps(pre)
    return (
        has_byte_level
        and pre_ok(pre)
        and norm_ok(raw.get("normalizer"))
        and all(not t.get("lstrip") and not t.get("rstrip") for t in raw.get("added_tokens", []))
    )


def _uses_byte_level(raw: dict) -> bool:
    def walk(node) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(raw.get("decoder")) or walk(raw.get("pre_tokenizer"))


def load_tokenizer(directory: str | Path, pattern: str | None = None) -> Tokenizer:
    """Load the tokenizer in `directory`: `tokenizer.json` (HF) or `tiktoken.model` (+ config).

    `pattern` overrides the tiktoken pre-tokeniser (default: Kimi's). Raises InputError with a sentence
    naming the directory and the missing file when neither is present.
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(
            f"tokenizer directory {d} does not exist; pass the folder that holds tokenizer.json or tiktoken.model"
        )
    if (d / "tokenizer.json").exists():
        return HFTokenizer(d)
    if (d / "tiktoken.model").exists():
        return TiktokenTokenizer(d, pattern or KIMI_PATTERN)
    raise InputError(
        f"tokenizer directory {d} holds neither tokenizer.json nor tiktoken.model; "
        "copy the model's tokenizer files there (remote code is never run)"
    )
