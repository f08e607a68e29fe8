"""Prompt templates of the PE family, as pure functions of public inputs.

Every prompt is built from an instruction; chat models get it as one user message, plain
completion models (e.g. the base Gemma 3 270M) get it as text ending in an answer cue.
Prompts built here may contain synthetic texts (never private ones): the PE methods only ever
show the generator its own earlier outputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from ..config import PromptConfig

ANSWER_CUE = "\n\nText:"


_IDENTIFIER = re.compile(r"[A-Za-z0-9]+(?:[_\-.][A-Za-z0-9]+)+|[a-z]+(?:[A-Z][a-z0-9]+)+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def readable_label(value: str) -> str:
    """A label value as the generator reads it when it has no description: an identifier-like
    code (``card_arrival``, ``lost-or-stolen-card``, ``topUpFailed``, ``sci.med``) is spelled
    out in words ('card arrival', 'lost or stolen card', 'top up failed', 'sci med'); any other
    value (already words, a number or version such as ``v1.2``, an all-capitals code such as
    ``ENTY``) is kept as it is.
    A public rule on the public label domain: it reads no record."""
    text = str(value).strip()
    if not _IDENTIFIER.fullmatch(text) or re.search(r"\d\.|\.\d|^[\d\-_]+$", text):
        return text
    spaced = _CAMEL.sub(" ", text) if "_" not in text and "-" not in text else text
    words = re.split(r"[_\-.]+|\s+", spaced)
    return " ".join(w if w.isupper() and len(w) > 1 else w.lower() for w in words if w)


def describe_labels(labels: Mapping[str, str], prompts: PromptConfig) -> str:
    """A sentence naming the label values, from the config's template or a default. A value
    with a description in ``prompts.label_descriptions`` (public config) is shown as that
    description, any other one in its :func:`readable_label` form: every prompt of every
    method goes through here."""
    if not labels:
        return ""
    descriptions = prompts.descriptions()
    described = {col: descriptions.get(col, {}).get(val, readable_label(val))
                 for col, val in labels.items()}
    if prompts.label_template:
        return prompts.label_template.format(**described)
    return " ".join(f"Its {col.replace('_', ' ')} is {val}." for col, val in described.items())


def write_request(task: str, label_text: str) -> str:
    """'Write {task}.' and the label sentence (none when ``label_text`` is empty)."""
    return " ".join(part for part in (f"Write {task}.", label_text.strip()) if part)


def zero_shot_instruction(task: str, label_text: str) -> str:
    """RANDOM_API of Aug-PE: a label-conditioned zero-shot request (docs/methods.md §1, step 2)."""
    return f"{write_request(task, label_text)} Reply with the text only."


def rephrase_instruction(task: str, label_text: str, text: str, style: str) -> str:
    """VARIATION_API, rephrase with a random style (docs/methods.md §1, step 3e)."""
    return (f"Rephrase the following {task} in a {style} style, keeping its meaning. "
            f"{label_text} Reply with the rephrased text only.\n\nText: {text}")


def mask_words(text: str, rate: float, rng: np.random.Generator) -> str:
    """Replace each word by a blank with probability `rate` (at least one word when possible)."""
    words = text.split()
    if not words:
        return text
    mask = rng.random(len(words)) < rate
    if not mask.any():
        mask[rng.integers(len(words))] = True
    return " ".join("___" if m else w for w, m in zip(words, mask, strict=True))


def fill_in_instruction(task: str, label_text: str, masked: str) -> str:
    """VARIATION_API, fill in randomly masked words (docs/methods.md §1, step 3e)."""
    return (f"Fill in each blank (___) in the following {task} so that it reads naturally. "
            f"{label_text} Reply with the completed text only.\n\nText: {masked}")


def contrastive_instruction(task: str, label_text: str, good: Sequence[str],
                            bad: Sequence[str]) -> str:
    """WASP's contrastive prompt (docs/methods.md §2, step 5): the request first (the task and
    the label, as in the zero-shot prompt), then the bad and the good demonstrations, then the
    ask for a new text like the good ones in a new wording. The request leads and the
    demonstrations are not called "examples": SmolLM2-135M answered the earlier layout (examples
    first, "think about what makes the good examples better") with comments on the examples
    or texts about the writer (benchmarks/results/readable_defaults.md)."""
    bad_block = "\n".join(f"- {t}" for t in bad)
    good_block = "\n".join(f"- {t}" for t in good)
    return (
        f"{write_request(task, label_text)}\n\n"
        f"Not like these (unrealistic or off-topic):\n{bad_block}\n\n"
        f"Like these (realistic and on-topic), but in different words:\n{good_block}\n\n"
        "Reply with your new text only."
    )


def writer_sentence(writer: str) -> str:
    """'You are {writer}.' for the public ``prompts.writer`` ('' when it is empty)."""
    writer = writer.strip().rstrip(".")
    return f"You are {writer}." if writer else ""


def with_writer(instruction: str, writer: str) -> str:
    """The instruction as a plain-text prompt asks it: :func:`writer_sentence` before it
    (nothing when ``writer`` is empty), so the model writes as the texts' writer."""
    sentence = writer_sentence(writer)
    return f"{sentence} {instruction}" if sentence else instruction


def render(instruction: str, chat: bool, writer: str = ""
           ) -> str | tuple[dict[str, str], ...]:
    """The request for one instruction. Chat models: the :func:`writer_sentence` as the system
    message (a chat template's default system prompt, SmolLM2's "You are a helpful AI
    assistant", otherwise makes the model answer as the assistant), the instruction as the
    user's; plain models: :func:`with_writer` plus an answer cue."""
    if chat:
        sentence = writer_sentence(writer)
        system = ({"role": "system", "content": sentence},) if sentence else ()
        return (*system, {"role": "user", "content": instruction})
    return with_writer(instruction, writer) + ANSWER_CUE


_PREFIX = re.compile(
    r"^\s*(?:(?:sure|okay|ok|certainly|of course)[,!.]?\s*)?"
    r"(?:(?:here|below)(?:'s| is| are)[^:\n]{0,80}:\s*)?"
    r"(?:\*?(?:rephras\w*|completed|new|the|customer'?s?|my)?\s*(?:text|message|version|review|"
    r"example|question|query|request|sentence)?\s*:\s*)?",
    re.IGNORECASE,
)
#: A template slot or elision instead of words: "[...]", "[Insert date]", "{name}", "<amount>".
_PLACEHOLDER = re.compile(
    r"\[(?:\s*(?:\.\s*){2,}|\s*…\s*|insert\b[^\]]*|[^\]]{0,30}\b(?:name|date|number|amount|"
    r"address|email|phone)\b[^\]]{0,30})\]|\{[a-z_ ]{1,30}\}|<[a-z_ ]{1,30}>|\bX{3,}\b|"
    r"\[[A-Za-z]{0,30}(?:Name|Number|Date|Address|Amount)\]|"  # a slot: [BankAccountName]
    r"</?(?:a|div|span|p|br|img|html|body|li|ul)(?:\s[^>]*)?/?>",  # markup, not a record
    re.IGNORECASE,
)
#: An answer or explanation where a record was asked for: "The answer to this question
#: is ...", "Answer: ...", "Explanation: ...".
_ANSWER = re.compile(
    r"^\s*(?:the )?(?:answer|response|reply|explanation|solution)\b(?:\s+to\b|\s*:)|"
    r"\bthe answer to (?:this|your|the|that) question\b",
    re.IGNORECASE,
)
#: The model declining the request. "I cannot" / "I am unable" alone are a customer's words
#: too ("I cannot use my card."): 0.5 % of Banking77's real messages matched the bare phrases,
#: so only the refusal of a request to write counts (none of them match this).
_REFUSAL = re.compile(
    r"\b(?:i'?m sorry|i am sorry|as an ai|language model|"
    r"(?:i cannot|i can'?t|i'?m unable to|i am unable to|i'?m not able to|i am not able to) "
    r"(?:help|assist|write|provide|create|generate|fulfil+|comply|complete|do that|rephrase))\b",
    re.IGNORECASE,
)


#: Talk about an earlier turn of a conversation instead of a record ("I'm trying to clarify my
#: previous answer", "The response you sent must have been too long. I will keep the response
#: in the specified format", "Your review has been reworded"): 1-3 % of WASP's released texts
#: in the 2000-record side-by-side runs (Banking77 and Yelp), none of 23 083 real Banking77 and
#: Yelp records.
_META = (
    r"\b(?:my|the|your) (?:previous|above|original|earlier|last) (?:answer|response|reply|"
    r"formatting|version|text|message)\b|\b(?:above|previous) (?:answer|response|reply)\b|"
    r"\bspecified format\b|\bno new answer\b|"
    r"\b(?:your|this|the) (?:review|message|text|question) (?:has been|was|is) (?:reworded|"
    r"rewritten|edited|updated|revised|rephrased)\b|"
    r"\b(?:respond|reply) to your (?:message|request|review|question)\b|"
    r"\b(?:a|the) more (?:specific|accurate|detailed) (?:and \w+ )?answer\b|"
    r"\b(?:shared|share) (?:this|your) (?:great |wonderful )?review with me\b"
)
#: A generation that talks about the prompt (its examples, the rephrasing asked for) instead of
#: being a sample: SmolLM2-135M answers WASP's contrastive prompt so about a fifth of the time
#: by this pattern (benchmarks/results/wasp_offtask.md).
_OFF_TASK = re.compile(
    r"\b(?:good|bad) (?:examples?|ones)\b|\bexamples? (?:above|below|provided|given)\b|"
    r"\b(?:the|these|those|your|my) examples\b|\brephras\w*|"
    r"\b(?:new|original|given|following|above) (?:text|example|sentence)\b|" + _META,
    re.IGNORECASE,
)

#: A generation in the other side's voice: the assistant answering ("How can I help you?",
#: "I'm happy to assist", "Welcome to ...") or a form letter with template slots ("[Your
#: Name]", "Dear valued customer"). A chat model asked to write AS someone falls back to its
#: assistant role: 12 % of SmolLM2-135M's released texts in WASP's Banking77 run matched, none
#: of Banking77's 10003 real messages (benchmarks/results/readable_defaults.md).
_ASSISTANT_VOICE = re.compile(
    r"\bhow (?:can|may|could) (?:i|we) (?:help|assist)\b|"
    r"\b(?:i'?m|i am|we'?re|we are) (?:here|happy|glad|delighted) to (?:help|assist)\b|"
    r"\b(?:i|we)(?:'d| would) be (?:happy|glad|delighted) to (?:help|assist)\b|"
    r"\b(?:please )?follow these steps\b|\bif you have any (?:other |further |more )?"
    r"questions\b|\bfeel free to (?:ask|contact|reach)\b|\bas an? (?:ai|assistant|language)\b|"
    r"\bwhat can (?:i|we) (?:help|do for) you\b|^\s*you'?re (?:very |most )?welcome\b|"
    r"\bhere(?:'s| is) (?:a |the |my )?(?:rewritten|revised|rephrased) (?:message|text|"
    r"version|question)\b|"
    r"\bwelcome to\b|\bdear (?:valued|customer|sir|madam)\b|"
    r"\b(?:sorry|apologi[sz]e) for any inconvenience\b|\bwe(?:'re| are)? (?:sorry|"
    r"apologi[sz]e)\b|"
    r"\[(?:your|user'?s?|customer'?s?|client'?s?|company|business|bank)\b[^\]]{0,40}\]",
    re.IGNORECASE,
)


#: Words after which a writer's description goes on past its head noun ("a customer OF an
#: online bank", "a patient WRITING to a doctor").
_WRITER_TAIL = re.compile(
    r"\s+(?:of|at|in|on|to|for|from|with|who|that|which|writing|asking|using|living)\b|[,;(]")


def writer_noun(writer: str) -> str:
    """The head noun of the public ``prompts.writer``: the last word before the description
    goes on ('a customer of an online bank' -> 'customer', 'an angry Yelp reviewer' ->
    'reviewer'); '' when ``writer`` is empty."""
    head = _WRITER_TAIL.split(writer.strip().rstrip("."), maxsplit=1)[0]
    words = re.findall(r"[A-Za-z][A-Za-z'-]*", head)
    return words[-1].lower() if words else ""


@lru_cache(maxsize=16)
def about_the_writer(writer: str) -> re.Pattern[str] | None:
    """A generation that speaks ABOUT the writer instead of AS the writer: the writer's
    :func:`writer_noun` in the third person ("This customer wants ...", "The customer's card",
    "A customer is asking ..." at the start of the text, "their customers"). "I am a customer"
    and "as a customer" are the writer speaking and do not match. None without a writer.
    SmolLM2-135M, told 'You are a customer of an online bank', wrote about "the customer" in
    about a tenth of WASP's released Banking77 texts; no real Banking77 message does
    (benchmarks/results/readable_defaults.md). Built once per writer (cached): every
    generation of a run is checked against it."""
    noun = writer_noun(writer)
    if not noun:
        return None
    n = re.escape(noun)
    return re.compile(
        rf"\b(?:the|this|that|these|those|each|every|another|our|their|his|her|its)\s+"
        rf"(?:[a-z-]+\s+)?{n}(?:s|es|'s|s')?\b|^\s*(?:a|an)\s+(?:[a-z-]+\s+)?{n}\b",
        re.IGNORECASE)


def echoes_writer(text: str, writer: str) -> bool:
    """The text repeats the public ``prompts.writer`` description past its head noun ("I am
    a customer of an online bank who ..."): the prompt echoed, not a record."""
    words = re.findall(r"[a-z']+", writer.lower())
    if words and words[0] in ("a", "an", "the"):
        words = words[1:]
    if len(words) < 3:
        return False
    return " ".join(words) in " ".join(re.findall(r"[a-z']+", text.lower()))


def instruction_sentences(instruction: str) -> list[str]:
    """The sentences of an instruction's first line (the request and the label sentence, never
    a quoted text or a demonstration), for :func:`clean_generation`'s echo removal."""
    first = instruction.split("\n", 1)[0]
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", first) if len(s.strip()) >= 8]


#: a token that reads as a word: letters after any leading punctuation or emoji, not a hashtag
#: or a handle
_WORD_TOKEN = re.compile(r"^[^#@\w]*[^\W\d_]")


def mostly_symbols(text: str) -> bool:
    """Fewer than half of the text's whitespace-separated tokens are words: runs of emoji,
    hashtags, numbers or codes ("💤🎨#SalesBeverage🎌 #Sauce #Sauce #Bars"), not a record.
    Measured: none of 20 003 real Yelp and Banking77 records matches; 9 of WASP's 498 released
    texts of a Yelp run at epsilon 8 and up to 4 of 500 zero-shot texts did."""
    tokens = text.split()
    return sum(bool(_WORD_TOKEN.match(t)) for t in tokens) < len(tokens) / 2


#: a generation that opens as a list item ("- ", "* ", "1. "), and the start of its next item:
#: WASP's contrastive prompt lists its demonstrations so, and a model continuing it writes
#: several texts in one answer (18 of 195 released texts of a Banking77 run)
_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+")
_NEXT_ITEM = re.compile(r"\n\s*(?:[-*\u2022]|\d{1,2}[.)])\s+")


def clean_generation(raw: str, min_chars: int, max_chars: int = 2000,
                     echoes: Sequence[str] = (), drop_off_task: bool = False,
                     writer: str = "") -> str | None:
    """Strip chat artefacts (preambles, quotes, markdown) and any of the ``echoes`` (sentences
    of the instruction the model repeated, e.g. the label sentence) from a generation; None
    when the result is empty, a refusal, shorter than `min_chars`, or (``drop_off_task``)
    commentary on the prompt, a text in the assistant's voice, a run of symbols
    (:func:`mostly_symbols`) or, when the public ``writer`` is set, a text about the writer
    (:func:`about_the_writer`) rather than a sample."""
    text = raw.replace("\r", "").strip()
    for echo in echoes:
        text = re.sub(re.escape(echo), " ", text, flags=re.IGNORECASE)
    text = re.sub(r"\*\*|^#+\s*", "", text, flags=re.MULTILINE).strip()
    text = _PREFIX.sub("", text, count=1).strip()
    # the prompt's own "Text:" cue repeated mid-answer: what follows the last one is the text
    cue = list(re.finditer(r"(?:^|\s)Text:\s+", text))
    if cue and len(text) - cue[-1].end() >= min_chars:
        text = text[cue[-1].end():].strip()
    if _LIST_ITEM.match(text):  # a list of texts, as the demonstrations are laid out: the first
        text = _NEXT_ITEM.split(_LIST_ITEM.sub("", text, count=1))[0]
    text = re.split(r"\n\s*\n(?:note|explanation|analysis|---)|\n\s*\(?\bnote:\s",
                    text, flags=re.IGNORECASE)[0]
    if len(text) >= 2 and text[0] in "\"'“" and text[-1] in "\"'”":
        text = text[1:-1].strip()
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) < min_chars or _REFUSAL.search(text):
        return None
    if drop_off_task:
        third_person = about_the_writer(writer)
        if (_OFF_TASK.search(text) or _ASSISTANT_VOICE.search(text)
                or _PLACEHOLDER.search(text) or _ANSWER.search(text)
                or (third_person is not None and third_person.search(text))
                or echoes_writer(text, writer) or mostly_symbols(text)):
            return None
    return text[:max_chars]


_SENTENCE_END = re.compile(r"[.!?…][\"')\]]*(?=\s|$)")


def trim_cut_off(text: str, max_words: int) -> str:
    """A text of at least 0.8 x ``max_words`` words that stops mid-sentence (the token cap
    cut it) back to its last full sentence (:func:`trim_to_sentence`); any other text as it
    is."""
    if len(text.rstrip().split()) < 0.8 * max_words:
        return text
    return trim_to_sentence(text)


def ends_a_sentence(text: str) -> bool:
    """True when ``text`` ends on a full stop, question or exclamation mark or an ellipsis
    (a closing quote or bracket after it allowed)."""
    return bool(_SENTENCE_END.search(text.rstrip()[-3:]))


#: the share of released texts stopping mid-sentence above which a run warns and its report
#: says so
MOSTLY_CUT = 0.3


def cut_share(texts: Sequence[str]) -> float:
    """The share of ``texts`` that stop mid-sentence (0 for none)."""
    return sum(not ends_a_sentence(t) for t in texts) / len(texts) if texts else 0.0


def trim_to_sentence(text: str) -> str:
    """A text that stops mid-sentence back to its last full sentence, when that keeps at
    least half of it; any other text as it is."""
    stripped = text.rstrip()
    if ends_a_sentence(stripped):
        return text
    ends = [m.end() for m in _SENTENCE_END.finditer(stripped)]
    if ends and ends[-1] >= len(stripped) / 2:
        return stripped[:ends[-1]]
    return text


def normalised(text: str) -> str:
    """Lower-case words only: two texts with the same are duplicates."""
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))
