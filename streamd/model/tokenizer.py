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
        return self.id_to_piece(i).startswith("\u2581")

    def words(self, ids: Sequence[int], times: Sequence[int]) -> list[tuple[str, int, int]]:
        """Group tokens into words: [(word, first token time, last token time)] in frames."""
        groups: list[tuple[list[int], int, int]] = []
        for i, t in zip(ids, times):
            if not groups or self.starts_word(i):
                groups.append(([int(i)], int(t), int(t)))
            else:
                toks, start, _ = groups[-1]
                toks.append(int(i))
                groups[-1] = (toks, start, int(t))
        out = []
        for toks, start, end in groups:
            word = self.decode(toks).strip()
            if word:
                out.append((word, start, end))
        return out
