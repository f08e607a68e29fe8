"""The built-in private demo corpus: fictional patient messages to a clinic.

dpsynth ships no real private data. ``dpsynth data demo --out DIR`` writes a corpus made here,
from a seed, that exercises every method: labels for Aug-PE / WASP (department, urgency), a
user column for user-level privacy, secrets inside the text for SecPE (names, phone numbers,
e-mail addresses), and a knowledge table for DP-SynRAG's question answering.

How it is made (everything is a pure function of ``seed``):

1. **Knowledge** (:func:`demo_knowledge`). Six departments with unbalanced prevalence
   (Gastroenterology 28 %, Dermatology 22 %, Pulmonology 17 %, Neurology 14 %, Orthopedics
   11 %, Cardiology 8 %). Each department gets four *fictional* diseases whose names are built
   by a seeded syllable composer, in three shapes: eponyms ("Varnell's syndrome"), a root plus
   an organ stem plus a suffix ("chronic quessenteritis", "drovarthrosis") and root plus
   noun ("Tolrin fever"). No model can know them. Within a department the four diseases
   have prevalences 40/30/20/10 %. Each disease has three real symptoms drawn from its
   department's vocabulary, one invented signature symptom built from the department's
   body parts ("a fizzing feeling behind the ribs"), an invented drug with a
   department-flavoured suffix and a regimen ("Quessoprazine 20 mg twice daily"), and a
   one-paragraph description. Each department also has two fictional doctors.
2. **Patients**. Faker (en_US, seeded) draws unique names; phone numbers (five US formats)
   and e-mail addresses (six patterns built from the name, free-mail or company domains)
   are made from the same seeded generator and are unique. Each patient has one disease
   (drawn by department then disease prevalence) and writes 1 to 6 messages (geometric,
   mean about 1.6), so the ``patient_id`` user column matters for user-level privacy.
3. **Messages**. Each message has 1 to 5 sentences (10/20/30/25/15 %), assembled from
   several dozen sentence templates in slots: an introduction with the patient's name,
   symptoms (1 to 3 of the disease's symptoms with a duration), the disease or its
   treatment (optional), an urgency cue and contact details. Every message contains the
   patient's full name, phone number and e-mail address verbatim. The urgency label
   (routine / soon / urgent; the mix depends on the department, Cardiology is the most
   urgent) has its own cue phrases, so the text depends on both labels. About one message
   in eight gets one or two typos (swapped, dropped or doubled letters) in ordinary words;
   names, contacts and disease names are never altered.
4. **Splits** (:func:`write_demo_corpus`). ``private.csv`` (n rows, patient ids ``P00001``
   ...) and ``test.csv`` (``test_n`` rows, ids ``T00001`` ...) come from two independent
   random streams of the same seed; they share the knowledge (diseases) but no patient,
   name, phone, e-mail or text. ``knowledge.json`` holds the knowledge table.

Columns: ``patient_id, text, department, urgency, disease, patient_name, phone, email``.
The last four are ground truth for evaluation (secrets and diagnosis), not model inputs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "DEPARTMENTS",
    "URGENCIES",
    "demo_knowledge",
    "demo_label_values",
    "make_demo_corpus",
    "write_demo_corpus",
]

URGENCIES = ("routine", "soon", "urgent")

# name, prevalence, urgency mix (routine, soon, urgent)
DEPARTMENTS: tuple[tuple[str, float, tuple[float, float, float]], ...] = (
    ("Gastroenterology", 0.28, (0.55, 0.30, 0.15)),
    ("Dermatology", 0.22, (0.70, 0.25, 0.05)),
    ("Pulmonology", 0.17, (0.45, 0.35, 0.20)),
    ("Neurology", 0.14, (0.50, 0.30, 0.20)),
    ("Orthopedics", 0.11, (0.60, 0.30, 0.10)),
    ("Cardiology", 0.08, (0.35, 0.35, 0.30)),
)
DISEASES_PER_DEPARTMENT = 4
DISEASE_PREVALENCE = (0.4, 0.3, 0.2, 0.1)


def demo_label_values() -> dict[str, list[str]]:
    """The public label domain of the demo corpus (``label_values: {department: demo}``).

    Departments in the order of :data:`DEPARTMENTS`, urgencies in the order of
    :data:`URGENCIES`: constants of this module, never read from the generated records.
    """
    return {"department": [d[0] for d in DEPARTMENTS], "urgency": list(URGENCIES)}


_VOCAB: dict[str, dict[str, list[str]]] = {
    "Gastroenterology": {
        "stems": ["enter", "gastr", "col", "chol"],
        "symptoms": [
            "bloating after meals",
            "a burning pain in my upper stomach",
            "nausea in the mornings",
            "cramps low in my belly",
            "loose stools",
            "constipation",
            "heartburn at night",
            "loss of appetite",
            "acid coming up into my throat",
            "a sour taste in my mouth",
        ],
        "parts": ["below the ribs", "around the navel", "in the upper belly", "in my gut"],
        "drug_suffix": ["prazine", "lazole", "setron", "colix"],
    },
    "Dermatology": {
        "stems": ["derm", "cut", "kerat", "pil"],
        "symptoms": [
            "an itchy rash on my arms",
            "dry, flaking skin",
            "red patches on my face",
            "small blisters on my hands",
            "skin that peels around the nails",
            "hives that come and go",
            "a burning sensation on my scalp",
            "dark spots on my neck",
            "cracked skin on my heels",
            "swelling around my eyes",
        ],
        "parts": ["on the forearms", "along the hairline", "between the fingers", "on the shins"],
        "drug_suffix": ["dermol", "cortine", "zapryl", "lumab"],
    },
    "Pulmonology": {
        "stems": ["pneum", "bronch", "pulm", "trach"],
        "symptoms": [
            "a dry cough that won't stop",
            "shortness of breath on the stairs",
            "wheezing at night",
            "tightness in my chest",
            "coughing up mucus",
            "a hoarse voice",
            "getting winded very easily",
            "a whistling sound when I breathe",
            "night sweats",
            "a sore throat every morning",
        ],
        "parts": [
            "deep in the chest",
            "behind the breastbone",
            "in the throat",
            "under the collarbone",
        ],
        "drug_suffix": ["terol", "halix", "sonide", "pulmin"],
    },
    "Neurology": {
        "stems": ["neur", "cephal", "myel", "gangl"],
        "symptoms": [
            "pounding headaches",
            "dizziness when I stand up",
            "tingling in my fingers",
            "blurred vision",
            "trouble remembering words",
            "numbness in my left foot",
            "twitching eyelids",
            "ringing in my ears",
            "sudden fatigue in the afternoon",
            "sensitivity to light",
        ],
        "parts": [
            "behind the eyes",
            "at the base of the skull",
            "in the temples",
            "down the spine",
        ],
        "drug_suffix": ["tiracetam", "triptan", "gabrin", "neurax"],
    },
    "Orthopedics": {
        "stems": ["arthr", "oste", "chondr", "ten"],
        "symptoms": [
            "stiff knees in the morning",
            "pain in my lower back",
            "a swollen ankle",
            "clicking in my shoulder",
            "weakness in my grip",
            "aching hips after walking",
            "a sharp pain in my heel",
            "stiffness in my neck",
            "a locked finger joint",
            "soreness along my shin",
        ],
        "parts": ["in the knee joint", "along the spine", "in the wrist", "around the hip"],
        "drug_suffix": ["ostrel", "flexin", "coxib", "arthrol"],
    },
    "Cardiology": {
        "stems": ["cardi", "vas", "angi", "valv"],
        "symptoms": [
            "palpitations",
            "chest pain when I exercise",
            "swollen ankles",
            "an irregular heartbeat",
            "lightheadedness",
            "shortness of breath lying down",
            "cold hands and feet",
            "a racing pulse at rest",
            "pressure in my chest",
            "fainting spells",
        ],
        "parts": ["behind the sternum", "in the left arm", "under the left ribs", "in the jaw"],
        "drug_suffix": ["olol", "pril", "vastine", "cardin"],
    },
}

_SENSATIONS = ["fizzing", "humming", "crawling", "fluttering", "prickling", "buzzing", "pulling"]
_SIGNATURE_FORMS = [
    "a {sens} feeling {part}",
    "a {color} tinge to the skin {part}",
    "a {sens} ache {part} that comes in waves",
    "a {taste} taste in my mouth with {sens} twinges {part}",
]
_COLORS = ["grey", "bluish", "yellowish", "coppery", "violet"]
_TASTES = ["metallic", "salty", "bitter", "chalky"]
_REGIMENS = [
    "{drug} {mg} mg twice daily",
    "{drug} {mg} mg once a day",
    "{drug} {mg} mg every morning for six weeks",
    "a two-week course of {drug} {mg} mg tablets",
    "{drug} {mg} mg at bedtime",
]

# syllable composer for invented names
_ONSETS = ["b", "br", "d", "dr", "f", "fl", "g", "gr", "k", "kr", "l", "m", "n", "p", "pr",
           "qu", "r", "s", "sk", "st", "t", "tr", "v", "z", "th", "sh"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ou", "ei", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s"]
_END_CODAS = ["n", "r", "l", "s", "x", "rn", "ss", "v", "th", "nd", "rk"]
_EPONYM_ENDS = ["ell", "ard", "ix", "ova", "ton", "ing", "ek", "ane", "ier", "orth"]
_EPONYM_KINDS = ["syndrome", "disease", "syndrome"]
_NOUN_KINDS = ["fever", "palsy", "complex", "disorder"]
_MODIFIERS = ["chronic ", "acute ", "", ""]
_SUFFIXES = ["itis", "osis", "opathy", "algia", "emia", "itis"]
# real words a composed root must not spell (and common real disease roots)
_FORBIDDEN = {
    "gout", "flu", "mumps", "lupus", "polio", "rabies", "tetanus", "cholera", "typhus",
    "measles", "plague", "scurvy", "rickets", "croup", "ebola", "zika", "dengue", "malaria",
    "sars", "covid", "acne", "herpes", "shingles", "angina", "asthma", "colitis", "gastritis",
    "arthritis", "dermatitis", "bronchitis", "neuritis", "hepatitis", "sinusitis",
}  # fmt: skip

_DURATIONS = [
    "two days", "three days", "about a week", "ten days", "two weeks", "three weeks",
    "a month", "about six weeks", "a couple of months", "half a year",
]  # fmt: skip

# --------------------------------------------------------------------- sentence templates
# {name} {phone} {email} {disease} are inserted last and never get typos.
_ONE_LINERS = [
    "Hi, {name} here ({email}, {phone}) - I've had {s1} for {dur} and need an appointment {cue}.",
    "This is {name}, my {disease} is acting up again with {s1}; please call {phone} or write to {email} {cue}.",  # noqa: E501
    "{name} ({phone} / {email}) asking for a visit {cue} because of {s1}.",
    "Hello, I'm {name} and I keep getting {s1}, could someone reach me at {phone} or {email} {cue}?",  # noqa: E501
    "{name} again, still {s1_ing}, best number is {phone} and email {email}, please get back to me {cue}.",  # noqa: E501
    "Quick note from {name} ({email}, tel {phone}): {s1} for {dur} now, can I be seen {cue}?",
]
_INTROS = [
    "Hello, my name is {name}.",
    "Hi, this is {name}.",
    "Good morning, {name} writing.",
    "This is {name}, a patient of {doctor}.",
    "Dear {dept} team, my name is {name}.",
    "Hi there, it's {name} again.",
    "My name is {name} and I'm a patient at your {dept_lower} clinic.",
    "Hello {doctor}, it's {name}.",
]
_INTRO_SYMPTOMS = [
    "Hi, this is {name} and I've had {s1} for {dur}.",
    "My name is {name}, and for {dur} I've been dealing with {s1}.",
    "Hello, {name} here - {s1} has been bothering me for {dur}.",
    "This is {name}; since {dur} ago I have {s1}.",
    "Hi, I'm {name} and I have {s1} again.",
]
_SYMPTOMS = [
    "I've been dealing with {s1} and {s2} for {dur}.",
    "Lately I keep getting {s1}, and now {s2} too.",
    "It started with {s1} about {dur} ago.",
    "For {dur} I have had {s1}, {s2} and {s3}.",
    "The main problem is {s1}, especially in the evenings.",
    "I also noticed {s2} this week.",
    "Since {dur} ago I've had {s1} that does not go away.",
    "What worries me most is {s1}.",
    "On top of {s1} I now have {s2}.",
    "Every day I get {s1}, sometimes with {s2}.",
]
_DISEASE = [
    "I was diagnosed with {disease} last year.",
    "{doctor} thinks it might be {disease}.",
    "My {disease} seems to be flaring up again.",
    "Could this be related to my {disease}?",
    "I read that {disease} can cause this, is that true?",
    "I have a history of {disease} in the family.",
    "At my last visit you mentioned {disease}.",
]
_TREATMENT = [
    "I'm currently taking {treatment}.",
    "The {drug} helped at first but not anymore.",
    "Do I need a new prescription for {drug}?",
    "I ran out of {drug} three days ago.",
    "Should I keep taking {treatment}?",
    "Is it safe to take {drug} with ibuprofen?",
]
_CUES: dict[str, list[str]] = {
    "routine": [
        "No rush, whenever there is an opening is fine.",
        "This isn't urgent, I just want it on file.",
        "Could I book a routine check-up in the next few weeks?",
        "I'd like a refill when it's convenient.",
        "Any appointment next month would work for me.",
    ],
    "soon": [
        "I'd like to be seen this week if possible.",
        "It's getting a bit worse, so sooner would be better.",
        "Could someone call me back in the next day or two?",
        "Is there anything open in the next few days?",
        "I'd rather not wait more than a week.",
    ],
    "urgent": [
        "This is urgent, it got much worse overnight.",
        "Please call me back today, I'm really worried.",
        "I could barely sleep last night and it's getting scary.",
        "Should I go to the ER? Please advise asap.",
        "It's much worse than before, I need help today.",
    ],
}
_SHORT_CUES = {
    "routine": ["when you have a moment", "whenever convenient", "at some point next month"],
    "soon": ["this week if possible", "in the next few days", "soon please"],
    "urgent": ["today, it's urgent", "as soon as possible", "right away please"],
}
_CONTACT = [
    "You can reach me at {phone} or {email}.",
    "My number is {phone} and my email is {email}.",
    "Please call {phone} or write to {email}.",
    "Best way to reach me: {phone}, or email {email}.",
    "Phone: {phone}. Email: {email}.",
    "Call me on {phone} (or email {email} if I don't pick up).",
]
_CONTACT_CUE = [
    "Please call me at {phone} or email {email}, {cue}.",
    "Reach me on {phone} or at {email}, {cue}.",
    "I'm at {phone} and {email}, please get back to me {cue}.",
]
_PHONE_ONLY = [
    "My cell is {phone}.",
    "You can call me at {phone}.",
    "Best number: {phone}.",
]
_EMAIL_ONLY = [
    "Or email me at {email}.",
    "My email is {email} if that's easier.",
    "I also check {email} every day.",
]
_CLOSINGS = ["Thanks so much.", "Thank you!", "Thanks in advance.", "Kind regards.", "Thanks."]

_SECRET_MARKS = {"name": "\x01", "phone": "\x02", "email": "\x03", "disease": "\x04"}


# ------------------------------------------------------------------------------ knowledge


def _syllable(rng: np.random.Generator, codas: list[str]) -> str:
    return _pick(rng, _ONSETS) + _pick(rng, _VOWELS) + _pick(rng, codas)


def _ok(word: str) -> bool:
    return word not in _FORBIDDEN and not re.search(r"(.)\1\1|[aeiouy]{3}", word)


def _root(rng: np.random.Generator, syllables: int = 1) -> str:
    """A pronounceable invented root ("quess", "tolrin") made of seeded syllables."""
    while True:
        parts = [_syllable(rng, _CODAS) for _ in range(syllables - 1)]
        root = "".join(parts) + _syllable(rng, _END_CODAS)
        if 3 <= len(root) <= 8 and _ok(root):
            return root


def _join(*pieces: str) -> str:
    """Glue word pieces: a linking 'o' between consonants, one vowel where two meet."""
    out = pieces[0]
    for piece in pieces[1:]:
        if out[-1] in "aeiouy" and piece[0] in "aeiouy":
            out = out[:-1]
        elif out[-1] not in "aeiouy" and piece[0] not in "aeiouy":
            out += "o"
        out += piece
    return out


def _disease_name(rng: np.random.Generator, stem: str) -> str:
    """An invented disease name in one of three shapes (eponym, root+stem+suffix, noun)."""
    shape = int(rng.integers(3))
    if shape == 0:
        eponym = _join(_root(rng), _pick(rng, _EPONYM_ENDS)).capitalize()
        return f"{eponym}'s {_pick(rng, _EPONYM_KINDS)}"
    if shape == 1:
        while True:
            word = _join(_root(rng), stem, _pick(rng, _SUFFIXES))
            if len(word) <= 17:
                return _pick(rng, _MODIFIERS) + word
    return f"{_root(rng, 2).capitalize()} {_pick(rng, _NOUN_KINDS)}"


def demo_knowledge(seed: int = 0) -> list[dict[str, Any]]:
    """The demo's medical knowledge: one dict per fictional disease (see the module docstring).

    Keys: ``disease, department, symptoms`` (list; the last is the invented signature
    symptom), ``treatment, drug, prevalence`` (within the department), ``department_share``,
    ``doctors`` (the department's fictional doctors) and ``description``.
    """
    from faker import Faker

    rng = np.random.default_rng([seed, 1_000_003])
    fake = Faker("en_US")
    fake.seed_instance(int(rng.integers(2**31)))
    used: set[str] = set()
    out: list[dict[str, Any]] = []
    for dept, share, _ in DEPARTMENTS:
        vocab = _VOCAB[dept]
        doctors = [f"Dr. {fake.last_name()}" for _ in range(2)]
        for k in range(DISEASES_PER_DEPARTMENT):
            out.append(_disease(rng, used, dept, vocab, {
                "prevalence": DISEASE_PREVALENCE[k], "department_share": share,
                "doctors": doctors}))
    return out


def _fresh(used: set[str], draw: Callable[[], str], key: Callable[[str], str] = str) -> str:
    """Draw until ``key`` of the draw is not in ``used``; record it there and return it."""
    while True:
        value = draw()
        if key(value) not in used:
            used.add(key(value))
            return value


def _disease(rng: np.random.Generator, used: set[str], dept: str, vocab: dict[str, Any],
             facts: dict[str, Any]) -> dict[str, Any]:
    """One fictional disease of ``dept`` (names new to ``used``); ``facts``: its prevalence,
    department share and doctors."""
    name = _fresh(used, lambda: _disease_name(rng, _pick(rng, vocab["stems"])), str.lower)
    real = [str(s) for s in rng.choice(vocab["symptoms"], size=3, replace=False)]
    signature = _fresh(used, lambda: _pick(rng, _SIGNATURE_FORMS).format(
        sens=_pick(rng, _SENSATIONS),
        part=_pick(rng, vocab["parts"]),
        color=_pick(rng, _COLORS),
        taste=_pick(rng, _TASTES),
    ))
    drug = _fresh(used, lambda: _join(_root(rng), _pick(rng, vocab["drug_suffix"])).capitalize())
    mg = int(rng.choice([5, 10, 20, 25, 40, 50, 100, 250]))
    treatment = str(rng.choice(_REGIMENS)).format(drug=drug, mg=mg)
    symptoms = [*real, signature]
    neutral = [re.sub(r"\bmy\b", "the", x) for x in symptoms]
    description = (
        f"{name} is a {dept.lower()} condition. Typical symptoms are "
        f"{', '.join(neutral[:-1])} and, most characteristic, {neutral[-1]}. "
        f"It is treated with {treatment}."
    )
    return {
        "disease": name,
        "department": dept,
        "symptoms": symptoms,
        "treatment": treatment,
        "drug": drug,
        "prevalence": facts["prevalence"],
        "department_share": facts["department_share"],
        "doctors": facts["doctors"],
        "description": description,
    }


# ------------------------------------------------------------------------------- patients


def _phone(rng: np.random.Generator) -> str:
    area = f"{rng.integers(2, 10)}{rng.integers(0, 10)}{rng.integers(0, 10)}"
    exch = f"{rng.integers(2, 10)}{rng.integers(0, 10)}{rng.integers(0, 10)}"
    line = f"{int(rng.integers(0, 10000)):04d}"
    form = int(rng.integers(5))
    return [
        f"({area}) {exch}-{line}",
        f"{area}-{exch}-{line}",
        f"{area}.{exch}.{line}",
        f"+1 {area} {exch} {line}",
        f"+1-{area}-{exch}-{line}",
    ][form]


def _email(rng: np.random.Generator, fake: Any, first: str, last: str) -> str:
    f = re.sub(r"[^a-z]", "", first.lower())
    la = re.sub(r"[^a-z]", "", last.lower())
    num = int(rng.integers(1, 100))
    year = int(rng.integers(55, 100))
    local = [
        f"{f}.{la}",
        f"{f[0]}{la}{num}",
        f"{la}.{f[0]}",
        f"{f}{year}",
        f"{f}_{la}",
        f"{f}{la[:3]}{num}",
    ][int(rng.integers(6))]
    domain = fake.free_email_domain() if rng.random() < 0.8 else fake.domain_name()
    return f"{local}@{domain}"


def _patients(
    rng: np.random.Generator, n_messages: int, knowledge: list[dict[str, Any]], exclude: set[str]
) -> list[dict[str, Any]]:
    """Patients with unique name / phone / e-mail and a message count summing to n."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(int(rng.integers(2**31)))
    dept_p = np.array([d[1] for d in DEPARTMENTS])
    dept_p = dept_p / dept_p.sum()
    by_dept = {d[0]: [k for k in knowledge if k["department"] == d[0]] for d in DEPARTMENTS}
    seen = set(exclude)
    patients: list[dict[str, Any]] = []
    total = 0
    while total < n_messages:
        while True:
            first, last = fake.first_name(), fake.last_name()
            name = f"{first} {last}"
            if name not in seen:
                break
        seen.add(name)
        while (phone := _phone(rng)) in seen:
            pass
        seen.add(phone)
        while (email := _email(rng, fake, first, last)) in seen:
            pass
        seen.add(email)
        dept = DEPARTMENTS[int(rng.choice(len(DEPARTMENTS), p=dept_p))][0]
        options = by_dept[dept]
        prev = np.array([k["prevalence"] for k in options])
        disease = options[int(rng.choice(len(options), p=prev / prev.sum()))]
        count = min(int(rng.geometric(0.6)), 6, n_messages - total)
        total += count
        patients.append(
            {
                "name": name,
                "first": first,
                "phone": phone,
                "email": email,
                "knowledge": disease,
                "count": count,
            }  # fmt: skip
        )
    return patients


# ------------------------------------------------------------------------------- messages


def _ing(symptom: str) -> str:
    return f"having {symptom}"


def _typo(word: str, rng: np.random.Generator) -> str:
    i = int(rng.integers(1, len(word) - 1))
    kind = int(rng.integers(3))
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == 1:
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]


def _add_typos(text: str, rng: np.random.Generator) -> str:
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha() and w.islower()]
    if not candidates:
        return text
    k = min(len(candidates), int(rng.integers(1, 3)))
    for i in rng.choice(candidates, size=k, replace=False):
        words[int(i)] = _typo(words[int(i)], rng)
    return " ".join(words)


def _structure(k: int, rng: np.random.Generator) -> list[str]:
    options = {
        2: [["intro_sym", "contact_cue"]],
        3: [["intro", "symptoms", "contact_cue"], ["intro_sym", "body", "contact_cue"],
            ["intro_sym", "cue", "contact"]],
        4: [["intro", "symptoms", "body", "contact_cue"], ["intro_sym", "body", "cue", "contact"],
            ["intro", "symptoms", "cue", "contact"]],
        5: [["intro", "symptoms", "body", "cue", "contact"],
            ["intro_sym", "symptoms", "body", "cue", "contact"],
            ["intro", "symptoms", "cue", "phone", "email"],
            ["intro_sym", "body", "cue", "contact", "closing"]],
    }  # fmt: skip
    choices = options[k]
    return choices[int(rng.integers(len(choices)))]


def _pick(rng: np.random.Generator, items: list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _message(rng: np.random.Generator, patient: dict[str, Any], urgency: str) -> str:
    know = patient["knowledge"]
    syms = list(know["symptoms"])
    chosen = [syms[int(i)] for i in rng.permutation(len(syms))[:3]]
    slots = {
        "s1": chosen[0],
        "s2": chosen[1],
        "s3": chosen[2],
        "s1_ing": _ing(chosen[0]),
        "dur": _pick(rng, _DURATIONS),
        "doctor": _pick(rng, know["doctors"]),
        "dept": know["department"],
        "dept_lower": know["department"].lower(),
        "treatment": know["treatment"],
        "drug": know["drug"],
        "cue": _pick(rng, _SHORT_CUES[urgency]),
        **_SECRET_MARKS,
    }
    k = int(rng.choice(5, p=[0.10, 0.20, 0.30, 0.25, 0.15])) + 1
    if k == 1:
        parts = [_pick(rng, _ONE_LINERS)]
    else:
        pools = {
            "intro": _INTROS,
            "intro_sym": _INTRO_SYMPTOMS,
            "symptoms": _SYMPTOMS,
            "cue": _CUES[urgency],
            "contact": _CONTACT,
            "contact_cue": _CONTACT_CUE,
            "phone": _PHONE_ONLY,
            "email": _EMAIL_ONLY,
            "closing": _CLOSINGS,
        }
        parts = []
        for slot in _structure(k, rng):
            if slot == "body":
                pool = _DISEASE if rng.random() < 0.7 else _TREATMENT
                parts.append(_pick(rng, pool))
            else:
                parts.append(_pick(rng, pools[slot]))
    text = " ".join(p.format(**slots) for p in parts)
    text = text[0].upper() + text[1:]
    if rng.random() < 0.125:
        text = _add_typos(text, rng)
    for key, mark in _SECRET_MARKS.items():
        value = know["disease"] if key == "disease" else patient[key]
        text = text.replace(mark, value)
    return text


def _generate(
    n: int, seed: int, stream: int, prefix: str, exclude: set[str] | None = None
) -> pd.DataFrame:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    knowledge = demo_knowledge(seed)
    rng = np.random.default_rng([seed, stream])
    patients = _patients(rng, n, knowledge, exclude or set())
    urg_mix = {d[0]: np.array(d[2]) for d in DEPARTMENTS}
    rows: list[dict[str, str]] = []
    for pid, patient in enumerate(patients, start=1):
        know = patient["knowledge"]
        for _ in range(patient["count"]):
            mix = urg_mix[know["department"]]
            urgency = URGENCIES[int(rng.choice(3, p=mix / mix.sum()))]
            rows.append(
                {
                    "patient_id": f"{prefix}{pid:05d}",
                    "text": _message(rng, patient, urgency),
                    "department": know["department"],
                    "urgency": urgency,
                    "disease": know["disease"],
                    "patient_name": patient["name"],
                    "phone": patient["phone"],
                    "email": patient["email"],
                }
            )
    order = rng.permutation(len(rows))
    return pd.DataFrame([rows[int(i)] for i in order]).reset_index(drop=True)


def make_demo_corpus(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """``n`` fictional patient messages (the private split; deterministic given ``seed``)."""
    return _generate(n, seed, stream=1, prefix="P")


def write_demo_corpus(
    out_dir: str | Path, n: int = 600, seed: int = 0, test_n: int = 300
) -> dict[str, Path]:
    """Write ``private.csv``, ``test.csv`` (disjoint patients) and ``knowledge.json``.

    Returns ``{"private": ..., "test": ..., "knowledge": ...}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    private = make_demo_corpus(n, seed)
    exclude = set(private["patient_name"]) | set(private["phone"]) | set(private["email"])
    test = _generate(test_n, seed, stream=2, prefix="T", exclude=exclude)
    paths = {
        "private": out / "private.csv",
        "test": out / "test.csv",
        "knowledge": out / "knowledge.json",
    }
    private.to_csv(paths["private"], index=False)
    test.to_csv(paths["test"], index=False)
    paths["knowledge"].write_text(
        json.dumps(demo_knowledge(seed), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return paths
