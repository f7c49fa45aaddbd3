"""Training text from offline sources: fortunes, WordNet examples, Faker, spoken-style templates
(conversation.py: questions, commands, numbers, names, chat); normalised, filtered, split.

    python -m recipes.synthetic.text --out DIR [--faker N] [--conversation N] [--seed S]

writes DIR/train.txt, DIR/dev.txt (checkpoint selection), DIR/eval.txt (held apart: the only
source of evaluation sentences) and DIR/stats.json. Needs apt `fortunes fortunes-min
wordnet-base` and PyPI `num2words faker`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from . import ngrams
from .conversation import conversation_sentences
from .normalize import ascii_fold, expand_abbreviations, normalize

REPO = Path(__file__).resolve().parents[2]
RESERVED = REPO.parent / "shared" / "data" / "reserved-6grams.txt"
FORTUNES = Path("/usr/share/games/fortunes")
WORDNET = Path("/usr/share/wordnet")
SKIP_FORTUNES = {"ascii-art"}
MIN_WORDS, MAX_WORDS = 3, 30
SPLITS = ("train", "dev", "eval")

_ALLOWED = re.compile(r"[A-Za-z0-9\s.,;:!?'\"()\-&%$£€+@=#/]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')]*\s+(?=[\"'(]*[A-Z0-9])")
_SPEAKER = re.compile(r"^\s*[A-Z][A-Za-z .]{0,30}:\s")
_ATTRIBUTION = re.compile(r"^\s*(--|-\s|\u2014)")


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences (abbreviations are expanded first so 'Mr.' does not end one)."""
    text = " ".join(expand_abbreviations(ascii_fold(text)).split())
    return [s for s in _SENTENCE_END.split(text) if s]


def plausible(sentence: str) -> bool:
    """Prose rather than code, art or tables: ordinary characters, mostly letters and digits."""
    chars = "".join(sentence.split())
    letters = sum(c.isalpha() for c in chars)
    alnum = letters + sum(c.isdigit() for c in chars)
    return bool(_ALLOWED.fullmatch(sentence)) and alnum >= 0.7 * len(chars) and letters >= 0.3 * len(chars)


def fortune_entries(folder: Path = FORTUNES) -> Iterator[str]:
    """Fortune cookies as prose: attributions cut, speaker labels dropped, art and tables skipped."""
    for path in sorted(folder.iterdir()):
        if path.suffix or path.name in SKIP_FORTUNES or not path.is_file():
            continue
        for entry in re.split(r"^%$", path.read_text(errors="replace"), flags=re.MULTILINE):
            lines: list[str] = []
            for line in entry.strip("\n").splitlines():
                if _ATTRIBUTION.match(line):
                    break
                if "\t" in line.strip() or re.search(r"\S {4,}\S", line):
                    lines = []
                    break
                lines.append(_SPEAKER.sub(" ", line))
            yield " ".join(lines)


def fortune_sentences(folder: Path = FORTUNES) -> Iterator[str]:
    for entry in fortune_entries(folder):
        yield from split_sentences(entry)


def wordnet_sentences(folder: Path = WORDNET) -> Iterator[str]:
    """The quoted usage examples of WordNet's synsets."""
    for part in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{part}").read_text(errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            yield from re.findall(r'"([^"]+)"', line.split("|", 1)[1])


def faker_sentences(n: int, seed: int) -> Iterator[str]:
    """Templated sentences with names, addresses, dates, times, phone numbers and amounts."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    rng = random.Random(seed)

    def ordinal(day: int) -> str:
        suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
        return f"{day}{suffix}"

    def date() -> str:
        d = fake.date_object()
        carrier = rng.choice(["It happened on", "The deadline is", "I was born on", "See you on",
                              "It opened on", "Payment is due"])
        return f"{carrier} {d:%B} {ordinal(d.day)}, {d.year}."

    def time() -> str:
        h, m = rng.randint(1, 12), rng.choice([0, 5, 10, 15, 20, 30, 45, rng.randint(0, 59)])
        clock = f"{h}:{m:02d} {rng.choice(['am', 'pm', 'a.m.', 'p.m.'])}" if rng.random() < 0.6 \
            else f"{rng.randint(0, 23)}:{m:02d}"
        return f"{rng.choice(['The train leaves at', 'Meet me at', 'We close at', 'Wake me at'])} {clock}."

    def phone() -> str:
        number = fake.numerify(rng.choice(["###-###-####", "(###) ###-####", "###.###.####"]))
        return f"{rng.choice(['Call', 'My number is', 'Please dial', 'Text me at'])} {number}."

    templates: list[Callable[[], str]] = [
        lambda: f"{fake.name()} lives at {fake.building_number()} {fake.street_name()} in "
                f"{fake.city()}, {fake.state()}.",
        lambda: f"Send it to {fake.building_number()} {fake.street_name()}, {fake.city()}, "
                f"{fake.state()} {fake.postcode()}.",
        lambda: f"{rng.choice(['It costs', 'That comes to', 'The total is', 'I paid'])} "
                f"{fake.pricetag()}.",
        lambda: f"{fake.company()} hired {fake.name()} as a {fake.job().lower()}.",
        lambda: f"Sales rose {rng.randint(1, 99)}.{rng.randint(0, 9)}% in {rng.randint(1950, 2030)}.",
        lambda: f"There are {rng.randint(2, 200000):,} {fake.word()}s in {fake.city()}.",
        lambda: f"{fake.catch_phrase()}.",
        lambda: f"We need to {fake.bs()}.",
        lambda: fake.sentence(nb_words=rng.randint(6, 14)),
        date, time, phone,
    ]
    for _ in range(n):
        yield rng.choice(templates)()


def clean_sentences(sources: Mapping[str, Iterable[str]], reserved: frozenset[str]
                    ) -> tuple[list[str], dict[str, Counter[str]]]:
    """Normalise, drop implausible, too short/long, reserved-6-gram and duplicate sentences."""
    seen: set[str] = set()
    kept: list[str] = []
    stats: dict[str, Counter[str]] = {}
    for name, raw_sentences in sources.items():
        counts = stats.setdefault(name, Counter())
        for raw in raw_sentences:
            counts["raw"] += 1
            label = normalize(raw) if plausible(raw) else ""
            n_words = len(label.split())
            reason = ("implausible" if not label else
                      "length" if not MIN_WORDS <= n_words <= MAX_WORDS else
                      "reserved" if ngrams.shares_ngram((raw, label), reserved) else
                      "duplicate" if label in seen else "kept")
            counts[reason] += 1
            if reason == "kept":
                seen.add(label)
                kept.append(label)
    return kept, stats


def split_of(sentence: str, seed: int, dev: float, held: float) -> str:
    """Deterministic split by a seeded hash of the sentence."""
    u = int(hashlib.sha1(f"{seed}:{sentence}".encode()).hexdigest()[:12], 16) / 16**12
    return "dev" if u < dev else "eval" if u < dev + held else "train"


def split(sentences: Iterable[str], seed: int, dev: float = 0.02, held: float = 0.02
          ) -> dict[str, list[str]]:
    """train / dev / eval slices; train loses every sentence sharing a 6-gram with dev or eval."""
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for s in sentences:
        out[split_of(s, seed, dev, held)].append(s)
    apart = {h for s in out["dev"] + out["eval"] for h in ngrams.hashes(s)}
    out["train"] = [s for s in out["train"] if ngrams.hashes(s).isdisjoint(apart)]
    rng = random.Random(seed)
    for part in out.values():
        part.sort()
        rng.shuffle(part)
    return out


def build(out: Path, faker: int, seed: int, reserved_path: Path = RESERVED,
          conversation: int = 0) -> dict[str, object]:
    """Gather, clean and split; write the three text files and stats.json; return the stats."""
    reserved = ngrams.load_reserved(reserved_path)
    sources = {"fortunes": fortune_sentences(), "wordnet": wordnet_sentences(),
               "faker": faker_sentences(faker, seed),
               "conversation": conversation_sentences(conversation, seed)}
    sentences, per_source = clean_sentences(sources, reserved)
    parts = split(sentences, seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, lines in parts.items():
        (out / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
    stats = {"seed": seed, "sources": {k: dict(v) for k, v in per_source.items()},
             "kept": len(sentences),
             "splits": {k: {"sentences": len(v), "words": sum(len(s.split()) for s in v)}
                        for k, v in parts.items()},
             "dropped_train_overlapping_held_out": len(sentences) - sum(map(len, parts.values()))}
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--faker", type=int, default=30000, help="Faker sentences to generate")
    ap.add_argument("--conversation", type=int, default=40000,
                    help="spoken-style sentences to generate (conversation.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reserved", type=Path, default=RESERVED, help="reserved 6-gram hashes")
    args = ap.parse_args()
    print(json.dumps(build(args.out, args.faker, args.seed, args.reserved, args.conversation), indent=2))


if __name__ == "__main__":
    main()
