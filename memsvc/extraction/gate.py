"""The quality gate: phatic and housekeeping speech yields no memory (pure functions)."""

from __future__ import annotations

import re

# Whole-utterance patterns of talk about the conversation itself: greetings, audio checks,
# acknowledgements, farewells. An utterance is dropped only when it consists of nothing else.
_PHATIC_PARTS = [
    r"(?:hi|hello|hey|hiya|howdy|good (?:morning|afternoon|evening|night))(?: there| everyone| all)?",
    r"(?:can|could) you (?:hear|see) me(?: now| okay| ok| alright| well)?",
    r"(?:can|could) (?:everyone|everybody|you all|y'?all) (?:hear|see) me(?: now)?",
    r"(?:are|is) (?:you|everyone|anybody|anyone) (?:there|still there|with me)",
    r"(?:i|we) (?:can(?:'t| ?not)?|couldn'?t) (?:hear|see) (?:you|anything)",
    r"you(?:'re| are) (?:breaking up|on mute|muted|cutting out|frozen)",
    r"(?:sorry,? )?(?:i was|you were) (?:on )?mute(?:d)?",
    r"(?:let me|i'?ll) (?:share|stop sharing) (?:my|the) screen",
    r"(?:one|just a) (?:sec|second|moment|minute)",
    r"(?:hold on|hang on|wait)(?: a (?:sec|second|moment|minute))?",
    r"(?:ok(?:ay)?|alright|all right|sure|yes|yeah|yep|yup|no|nope|right|cool|great|nice|perfect"
    r"|got it|i see|makes sense|sounds good|fine|mm+|hmm+|uh+|um+|ah+|oh)",
    r"(?:thanks?|thank you|thx|cheers|much appreciated)(?: (?:so|very) much)?(?: for (?:that|everything|your help))?",
    r"(?:bye|goodbye|bye-bye|see you|see ya|talk (?:to you )?(?:soon|later)|take care|have a (?:good|nice|great) (?:one|day|night|evening|weekend))",
    r"how are you(?: doing)?(?: today)?",
    r"(?:i'?m|i am) (?:good|fine|ok(?:ay)?|great)(?:,? (?:thanks|thank you))?(?:,? (?:and|how about) you)?",
    r"nice to (?:meet|see|talk to) you",
    r"(?:are )?we (?:good|done|all set)",
    r"(?:is )?this (?:thing )?on",
    r"testing(?:,? testing)?(?:,? (?:one|1),? (?:two|2)(?:,? (?:three|3))?)?",
]
_PART = "(?:" + "|".join(_PHATIC_PARTS) + ")"
_PHATIC = re.compile(
    rf"^\s*{_PART}(?:[\s,.!?;:…-]+{_PART})*[\s,.!?;:…-]*$",
    re.IGNORECASE,
)
_WORD = re.compile(r"\w+", re.UNICODE)
# Phatic utterances are short; checking only short ones also bounds the regex's work.
_MAX_PHATIC_CHARS = 160


def is_phatic(text: str) -> bool:
    """True when the utterance is only greetings, audio checks, acknowledgements or farewells."""
    if not _WORD.search(text):
        return True
    if len(text) > _MAX_PHATIC_CHARS:
        return False
    return bool(_PHATIC.match(text))
