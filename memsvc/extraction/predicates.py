"""The predicates extraction knows, and the closed vocabularies behind them."""

from __future__ import annotations

from memsvc.storage.model import NEGATION_PREFIX

# Predicates a person has one current value of: a new value supersedes the old one, but only
# when a current, affirmative statement about the same subject says so (guardrails.py).
SINGLE_VALUED = frozenset(
    {"name", "lives_in", "works_at", "occupation", "diet", "birthday", "origin", "age"}
    | {"relationship_status"}
)


def negation_of(predicate: str) -> str:
    """The stored predicate of a negated statement ("works_at" -> "not_works_at")."""
    if not predicate or predicate.startswith(NEGATION_PREFIX):
        return predicate
    return NEGATION_PREFIX + predicate


def is_negation(predicate: str) -> bool:
    return predicate.startswith(NEGATION_PREFIX)


def affirmative(predicate: str) -> str:
    """The predicate a negation negates ("not_works_at" -> "works_at")."""
    return predicate.removeprefix(NEGATION_PREFIX)


# Historical predicate -> the current predicate it must not overwrite.
HISTORICAL_OF = {"lived_in": "lives_in", "worked_at": "works_at", "was": "occupation"}
# Predicates that reverse each other: a statement of one ends the other of the same object.
OPPOSITE = {"likes": "dislikes", "dislikes": "likes"}

# Closed vocabularies: a word list is the right tool for these (spaCy tags the words; whether a
# noun names a relative, a pet, a diet or a job is a lexicon question, not a parsing one).
DIETS = frozenset(
    {
        "vegetarian",
        "vegan",
        "pescatarian",
        "pescetarian",
        "flexitarian",
        "keto",
        "paleo",
        "kosher",
        "halal",
        "gluten-free",
        "dairy-free",
        "lactose-intolerant",
        "teetotal",
        "teetotaler",
        "sober",
    }
)
RELATIVES = frozenset(
    {
        "daughter",
        "son",
        "wife",
        "husband",
        "partner",
        "spouse",
        "boyfriend",
        "girlfriend",
        "fiance",
        "fiancé",
        "fiancee",
        "fiancée",
        "mother",
        "mom",
        "mum",
        "mommy",
        "father",
        "dad",
        "daddy",
        "parent",
        "brother",
        "sister",
        "sibling",
        "grandmother",
        "grandma",
        "granny",
        "grandfather",
        "grandpa",
        "grandson",
        "granddaughter",
        "grandchild",
        "aunt",
        "uncle",
        "cousin",
        "niece",
        "nephew",
        "friend",
        "bff",
        "boss",
        "manager",
        "colleague",
        "coworker",
        "co-worker",
        "roommate",
        "flatmate",
        "neighbor",
        "neighbour",
        "kid",
        "child",
        "baby",
        "stepdaughter",
        "stepson",
        "stepmother",
        "stepfather",
        "stepmom",
        "stepdad",
        "twin",
        "mentor",
        "teacher",
        "therapist",
        "doctor",
    }
)
PETS = frozenset(
    {
        "dog",
        "cat",
        "puppy",
        "pup",
        "kitten",
        "kitty",
        "parrot",
        "bird",
        "rabbit",
        "bunny",
        "hamster",
        "guinea pig",
        "horse",
        "pony",
        "fish",
        "goldfish",
        "turtle",
        "tortoise",
        "snake",
        "lizard",
        "gecko",
        "ferret",
        "pet",
    }
)
JOBS = frozenset(
    {
        "engineer",
        "developer",
        "programmer",
        "designer",
        "teacher",
        "nurse",
        "doctor",
        "physician",
        "surgeon",
        "dentist",
        "lawyer",
        "attorney",
        "accountant",
        "architect",
        "chef",
        "cook",
        "baker",
        "pilot",
        "driver",
        "farmer",
        "scientist",
        "researcher",
        "professor",
        "lecturer",
        "student",
        "writer",
        "author",
        "journalist",
        "editor",
        "artist",
        "painter",
        "musician",
        "singer",
        "actor",
        "actress",
        "photographer",
        "pharmacist",
        "therapist",
        "psychologist",
        "counselor",
        "counsellor",
        "consultant",
        "analyst",
        "manager",
        "entrepreneur",
        "founder",
        "salesperson",
        "plumber",
        "electrician",
        "carpenter",
        "mechanic",
        "firefighter",
        "officer",
        "soldier",
        "veteran",
        "retiree",
        "paramedic",
        "veterinarian",
        "vet",
        "librarian",
        "barista",
        "waiter",
        "waitress",
        "cashier",
        "worker",
        "freelancer",
        "intern",
        "dancer",
        "coach",
        "trainer",
        "instructor",
        "tutor",
        "secretary",
        "assistant",
        "clerk",
        "banker",
        "economist",
        "translator",
        "midwife",
        "caregiver",
        "janitor",
        "cleaner",
        "gardener",
        "technician",
        "administrator",
        "director",
        "ceo",
        "cto",
        "owner",
        "blogger",
        "streamer",
        "youtuber",
    }
)
# Words after "call me" / "my name is" that are never a name.
NOT_NAMES = frozenset(
    {
        "later",
        "back",
        "tomorrow",
        "tonight",
        "today",
        "now",
        "soon",
        "anytime",
        "whenever",
        "sometime",
        "again",
        "crazy",
        "old-fashioned",
        "lazy",
        "maybe",
        "please",
        "when",
        "if",
        "after",
        "before",
        "at",
        "on",
        "in",
        "morning",
        "evening",
        "afternoon",
        "night",
        "asap",
        "anything",
        "whatever",
        "sir",
        "madam",
        "ma'am",
    }
)
# Verbs that, after "I want to" / "I'd like to" / "I need to", make a request of the assistant
# rather than state a personal goal.
REQUEST_VERBS = frozenset(
    {
        "know",
        "ask",
        "check",
        "confirm",
        "talk",
        "speak",
        "book",
        "order",
        "cancel",
        "change",
        "say",
        "tell",
        "hear",
        "pay",
        "reschedule",
        "schedule",
        "update",
        "delete",
        "report",
        "understand",
        "reset",
        "transfer",
        "renew",
        "file",
        "request",
        "upgrade",
        "downgrade",
        "verify",
    }
)
