"""Token ids to text (SentencePiece), including incremental detokenisation for live results."""
from __future__ import annotations

from collections.abc import Sequence

import sentencepiece as spm


class Tokenizer:
    """A SentencePiece model held in memory. RNN-T label i is piece i; blank (= vocab_size) is
    never passed here."""

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(model_proto)
        # per piece: whether it begins a word (asked for every token of every result with words)
        self._word_starts = [self._sp.IdToPiece(i).startswith("\u2581") for i in range(self._sp.GetPieceSize())]

    @property
    def vocab_size(self) -> int:
        return int(self._sp.GetPieceSize())

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.DecodeIds([int(i) for i in ids]))

    def encode(self, text: str) -> list[int]:
        return list(self._sp.EncodeAsIds(text))

    def id_to_piece(self, i: int) -> str:
        return str(self._sp.IdToPiece(int(i)))

    def starts_word(self, i: int) -> bool:
        """True if piece i begins a new word (SentencePiece's U+2581 prefix)."""
        return self._word_starts[int(i)]

    def words(self, ids: Sequence[int], times: Sequence[int]) -> list[tuple[str, int, int]]:
        """Group tokens into words: [(word, first token time, last token time)] in frames. A word
        begins at the first token and at each piece that starts one."""
        n = min(len(ids), len(times))
        starts = [k for k in range(n) if k == 0 or self._word_starts[int(ids[k])]]
        out = []
        for a, b in zip(starts, starts[1:] + [n]):
            word = self.decode(ids[a:b]).strip()
            if word:
                out.append((word, int(times[a]), int(times[b - 1])))
        return out
