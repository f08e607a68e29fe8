"""A public rule for "reads as the writer's own message" (issue 24, point 6): a synthetic
customer message should be the customer speaking to the bank ("I still haven't got my card",
"Can you refund ...?"), not a text about a customer ("This customer wants to ...", "The user
asks ...") nor a comment on the prompt ("The good examples ...", "Here is a rephrased
question"). Pure functions on one text; no record is read. On Banking77's real customer
messages :func:`own_voice` holds for 97 % of train.csv and of test.csv (readable_defaults.md).
"""

from __future__ import annotations

import re

#: The writer speaks: first person ("I", "my", "we") or addresses the reader ("you", "your").
FIRST_OR_SECOND = re.compile(
    r"\b(?:i|i'm|im|i've|i'd|i'll|me|my|mine|myself|we|we're|our|ours|us|you|your|yours)\b",
    re.IGNORECASE)

#: A text about its writer, in the third person: "this customer", "a user", "the client's".
THIRD_PERSON = re.compile(
    r"\b(?:the|this|that|a|an|each|every|our|their|your)\s+(?:customer|user|client|"
    r"account[- ]holder|cardholder|consumer|shopper|reviewer)(?:s|'s|s')?\b",
    re.IGNORECASE)

#: Talk about the prompt instead of a sample: its examples, the task, the label, rephrasing.
COMMENTARY = re.compile(
    r"\b(?:good|bad|new|original|given|above|following|previous)\s+(?:examples?|texts?|"
    r"ones|sentences?|questions?|messages?|versions?)\b|\bexamples?\b|\brephras\w*|"
    r"\bintent(?:ion)?s?\b|\bprompt\b|\b(?:this|the)\s+(?:text|sentence)\b|\brewr[io]t\w*|"
    r"\bhere(?:'s| is| are) (?:a|an|the|some|my|your)\s+(?:\w+\s+)?(?:versions?|texts?|"
    r"questions?|messages?|rewrites?)\b",
    re.IGNORECASE)


#: The other side's voice: the bank (or shop, service) answering its customer.
SERVICE_VOICE = re.compile(
    r"\bhow (?:can|may) i (?:help|assist)|\b(?:i'm|i am|we're|we are) (?:here|happy|glad) to "
    r"(?:help|assist)|\bwelcome to\b|\bdear (?:customer|valued|sir|madam|\[)|"
    r"\bour (?:valued )?(?:customers?|clients?|users?)\b|\[[^\]]*\bname\b[^\]]*\]",
    re.IGNORECASE)


def own_voice(text: str) -> bool:
    """True when ``text`` reads as its writer's own message: it speaks in the first or second
    person or asks a question, and it neither describes a customer/user in the third person
    nor comments on the prompt (examples, intent, rephrasing), nor speaks as the service
    answering the customer ("How can I help you?", "Dear [Customer Name]")."""
    t = text.strip()
    if not t or THIRD_PERSON.search(t) or COMMENTARY.search(t) or SERVICE_VOICE.search(t):
        return False
    return bool(FIRST_OR_SECOND.search(t)) or "?" in t


def own_voice_share(texts: list[str]) -> float:
    """Share of ``texts`` for which :func:`own_voice` holds (0.0 for none)."""
    return sum(own_voice(t) for t in texts) / len(texts) if texts else 0.0


def main() -> None:
    """``python benchmarks/voice.py RUN_DIR ...``: the own-voice share of each run's released
    texts (release/synthetic.jsonl), one JSON line per run."""
    import json
    import sys
    from pathlib import Path

    for run in sys.argv[1:]:
        texts = [json.loads(line)["text"] for line in
                 (Path(run) / "release" / "synthetic.jsonl").read_text().splitlines()]
        print(json.dumps({"run": run, "n": len(texts),
                          "own_voice": round(own_voice_share(texts), 3)}))


if __name__ == "__main__":
    main()
