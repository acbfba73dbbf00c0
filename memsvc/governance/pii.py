"""Personal-data detectors and the screen that redacts or rejects what they find.

Pure functions over text. Precision comes first: every detector needs a checksum (cards,
IBANs, routing numbers: python-stdnum's), a registered number plan (phones, via
libphonenumber's metadata), a strict official format (US SSN, UK NI number) or a keyword in
front ("my passport number is", "OTP:", "my password is"). Dates, times, prices, years,
versions, zip codes, quantities, order and tracking numbers pass untouched.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import phonenumbers
from stdnum import iban, luhn, numdb
from stdnum.us import rtn, ssn

# Re-exported: the screen's callers name placeholders through this module.
from memsvc.governance.placeholders import LABELS as LABELS
from memsvc.governance.placeholders import placeholder as placeholder
from memsvc.governance.placeholders import placeholder_kinds as placeholder_kinds
from memsvc.governance.placeholders import placeholder_spans as placeholder_spans
from memsvc.governance.placeholders import tidy_placeholders as tidy_placeholders
from memsvc.governance.policy import PII_KINDS, REDACT, REJECT, STORE

# The noun of a kind in error messages.
NOUNS = {
    "card_number": "a payment card number",
    "government_id": "a government id number",
    "bank_account": "a bank account number",
    "password": "a password",
    "secret": "an API key, access token or private key",
    "one_time_code": "a one-time code",
    "email": "an email address",
    "phone": "a phone number",
}
DEFAULT_PHONE_REGIONS = ("US", "GB")


@dataclass(frozen=True, order=True)
class Span:
    """Personal data of one kind at text[start:end]."""

    start: int
    end: int
    kind: str


# -- checksums -------------------------------------------------------------------------------
# Luhn, IBAN (per-country length and structure, mod 97), ABA routing numbers and SSN ranges
# are python-stdnum's; only the card networks' prefixes are kept here (stdnum has none).


def card_prefix_valid(digits: str) -> bool:
    """The issuer prefix (IIN) belongs to a card network that issues numbers of this length."""
    n = len(digits)
    if n < 13 or n > 19 or len(set(digits)) == 1:
        return False
    p2, p3, p4 = int(digits[:2]), int(digits[:3]), int(digits[:4])
    if digits[0] == "4":  # Visa
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:  # Mastercard
        return n == 16
    if p2 in (34, 37):  # American Express
        return n == 15
    if p4 == 6011 or 644 <= p3 <= 649 or p2 == 65:  # Discover
        return 16 <= n <= 19
    if p2 == 62:  # UnionPay
        return 16 <= n <= 19
    if 3528 <= p4 <= 3589:  # JCB
        return 16 <= n <= 19
    if 300 <= p3 <= 305 or p2 in (36, 38, 39) or p4 == 3095:  # Diners Club
        return 14 <= n <= 19
    if 2200 <= p4 <= 2204:  # Mir
        return 16 <= n <= 19
    if p2 in (50, 56, 57, 58, 63, 67) or p2 == 60 or p2 in (81, 82):  # Maestro, RuPay
        return 13 <= n <= 19
    return False


# -- detectors ---------------------------------------------------------------------------------

# Runs of digit groups separated by one space or dash, not glued to letters or decimals.
_DIGIT_RUN = re.compile(r"(?<![\w.,/#@-])\d+(?:[ -]\d+)*", re.ASCII)
_GROUP = re.compile(r"\d+", re.ASCII)
_CARD_LAYOUTS = ((4, 6, 5), (4, 6, 4))


def _card_layout_ok(lengths: Sequence[int]) -> bool:
    if len(lengths) == 1:
        return True
    if tuple(lengths) in _CARD_LAYOUTS:
        return True
    return all(n == 4 for n in lengths[:-1]) and 1 <= lengths[-1] <= 4


def _card_prefix_layout_ok(groups: Sequence[re.Match[str]], i: int, j: int) -> bool:
    """Groups i..j-1 (all but the last of a window ending at j) can start a card layout."""
    inner = len(groups[j - 1].group())
    return inner == 4 or (inner == 6 and j - 1 == i + 1 and len(groups[i].group()) == 4)


def _glued_after(text: str, end: int) -> bool:
    """The match continues as a word, a decimal or a slash-date right after ``end``."""
    if end >= len(text):
        return False
    char = text[end]
    if char.isalnum() or char in "_@":
        return True
    return char in ".,/:" and end + 1 < len(text) and text[end + 1].isdigit()


def find_cards(text: str) -> Iterator[Span]:
    """13-19 digit card numbers, grouped as cards are, Luhn-checked, from a real network."""
    for run in _DIGIT_RUN.finditer(text):
        groups = list(_GROUP.finditer(text, run.start(), run.end()))
        i = 0
        while i < len(groups):
            found = None
            digits = ""
            for j in range(i, len(groups)):
                if j > i and not _card_prefix_layout_ok(groups, i, j):
                    break
                digits += groups[j].group()
                if len(digits) > 19:
                    break
                window = groups[i : j + 1]
                separators = {text[g.end()] for g in window[:-1]}
                if (
                    len(digits) >= 13
                    and len(separators) <= 1
                    and _card_layout_ok([len(g.group()) for g in window])
                    and not (j == len(groups) - 1 and _glued_after(text, groups[j].end()))
                    and luhn.is_valid(digits)
                    and card_prefix_valid(digits)
                ):
                    found = j
            if found is not None and _is_reference(text, groups[i].start()):
                found = None
            if found is None:
                i += 1
                continue
            yield Span(groups[i].start(), groups[found].end(), "card_number")
            i = found + 1


_IBAN = re.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){10,30}(?![\w])", re.ASCII)
_BBAN_FIELD = re.compile(r"(\d+)!", re.ASCII)


@functools.cache
def _iban_length(country: str) -> int | None:
    """Characters in the country's IBANs, from python-stdnum's copy of the SWIFT registry
    (GB: "4!a6!n8!n", a four-letter bank code then 6 and 8 digits: 22 with the 4 in front);
    None: the country has no IBANs."""
    bban = numdb.get("iban").info(country)[0][1].get("bban")
    return None if bban is None else 4 + sum(map(int, _BBAN_FIELD.findall(bban)))


def find_ibans(text: str) -> Iterator[Span]:
    """IBANs (compact or in groups of four) that python-stdnum accepts: the country's length
    and layout, its national check where stdnum has one, and the mod-97 check."""
    for m in _IBAN.finditer(text):
        length = _iban_length(m.group()[:2])
        if length is None:
            continue
        # Take exactly the country's length of characters; the rest may be another word.
        count, end = 0, m.start()
        for end in range(m.start(), m.end()):
            if text[end] != " ":
                count += 1
            if count == length:
                break
        end += 1
        if count != length or _glued_after(text, end):
            continue
        if iban.is_valid(text[m.start() : end]):
            yield Span(m.start(), end, "bank_account")


_SSN = re.compile(r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])", re.ASCII)
# python-stdnum has no UK NI module; the format (with HMRC's never-issued prefixes) is all
# there is to check: the number carries no check digit.
_UK_NI = re.compile(
    r"(?<![\w])(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
    r"(?: ?\d{2}){3} ?[A-D](?![\w])",
    re.ASCII,
)
# Words right before a number that make it a business reference, not personal data.
_REFERENCE_BEFORE = re.compile(
    r"\b(?:order|invoice|tracking|track|ref|reference|confirmation|booking|reservation|ticket"
    r"|policy|case|serial|part|model|sku|item|isbn|po|receipt|transaction|claim|flight"
    r"|shipment|parcel|package|product|room|gate|seat|lot|batch|version)"
    r"\s*(?:number|no\.?|num|nr|#|id|code)?\s*(?:is|was|:|=|-)?\s*#?\s*$",
    re.I,
)


def _is_reference(text: str, start: int) -> bool:
    return _REFERENCE_BEFORE.search(text[max(0, start - 40) : start]) is not None


def find_ssns(text: str) -> Iterator[Span]:
    """US social security numbers written NNN-NN-NNNN, issued ranges only."""
    for m in _SSN.finditer(text):
        if ssn.is_valid(m.group()) and not _is_reference(text, m.start()):
            yield Span(m.start(), m.end(), "government_id")


def find_uk_ni(text: str) -> Iterator[Span]:
    """UK National Insurance numbers (QQ 12 34 56 C), excluding never-issued prefixes."""
    for m in _UK_NI.finditer(text):
        yield Span(m.start(), m.end(), "government_id")


# What may stand between a keyword and its value: "number", "is", ":", "#", "my"...
_FILLER = re.compile(
    r"(?:\s+|[:#=]|-(?!\d)|\b(?:numbers?|no\.?|num|nr|id|card|code|is|was|are|reads|says"
    r"|it's|its|it is|it was|that's|my|the|of|mine|would be|will be|should be|set to"
    r"|changed to|changed it to|to)\b)*",
    re.I,
)
_LINKERS = re.compile(r"[:=]|\b(?:is|was|are|reads|says|it's|it is|be|to)\b", re.I)


def _value_after(text: str, pos: int, value: re.Pattern[str]) -> tuple[re.Match[str], bool] | None:
    """The value right after a keyword (skipping filler words); and whether a linker
    ("is", ":", "=") stood between them."""
    filler = _FILLER.match(text, pos)
    assert filler is not None
    if filler.end() - pos > 40:
        return None
    m = value.match(text, filler.end())
    if m is None:
        return None
    return m, _LINKERS.search(filler.group()) is not None


# An id value: alphanumeric chunks that hold digits, joined by single spaces or dashes.
_ID_VALUE = re.compile(r"(?:[A-Z0-9]*\d[A-Z0-9]*)(?:[ -][A-Z0-9]*\d[A-Z0-9]*)*(?![\w])", re.I)
_DATE_LIKE = re.compile(
    r"^(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}|\d{4})$", re.ASCII
)
_GOV_KEYWORD = re.compile(
    r"\b(?:passport|national\s+(?:id|identity|identification|insurance)|social\s+security"
    r"|social\s+insurance|ssn|(?:sin|tin|itin|ein|nin|nino)\s*(?:number|no\.?|#)"
    r"|driver'?s?\s+licen[cs]e|driving\s+licen[cs]e|licen[cs]e\s+(?:number|no\.?|#)"
    r"|tax\s+(?:id|identification|file|reference)|aadhaa?r|pan\s+(?:card|number)"
    r"|nhs\s+number|identity\s+(?:card|number|document)"
    r"|personal\s+(?:id|identity|identification)\s*(?:number|code)?|personnummer|dni|nie|cpf"
    r"|curp|medicare\s+(?:card|number)|health\s+(?:card|insurance)\s+number|voter\s+id"
    r"|residence\s+permit|green\s+card|alien\s+(?:registration\s+)?number)\b",
    re.I,
)


def find_keyword_ids(text: str) -> Iterator[Span]:
    """Government ids named by a keyword: "my passport number is X1234567"."""
    for key in _GOV_KEYWORD.finditer(text):
        found = _value_after(text, key.end(), _ID_VALUE)
        if found is None:
            continue
        m, _ = found
        value = m.group()
        digits = sum(c.isdigit() for c in value)
        alnum = sum(c.isalnum() for c in value)
        plausible = digits >= 5 and 5 <= alnum <= 24 and not _DATE_LIKE.match(value)
        if plausible and not _glued_after(text, m.end()):
            yield Span(m.start(), m.end(), "government_id")


_BANK_KEYWORD = re.compile(
    r"\b(?:(?:bank\s+)?account\s*(?:number|no\.?|num|#)|acct\.?(?:\s*(?:number|no\.?|#))?"
    r"|(?:bank|checking|savings|current)\s+account|routing(?:\s+(?:number|no\.?|#))?"
    r"|aba(?:\s+(?:number|no\.?|#))?|sort\s*code|bsb(?:\s+number)?|ifsc(?:\s+code)?"
    r"|transit\s+number)\b",
    re.I,
)
_ACCOUNT_VALUE = re.compile(r"\d+(?:[ -]\d+)*(?![\w])", re.ASCII)


def find_bank_accounts(text: str) -> Iterator[Span]:
    """Account, routing and sort-code numbers named by a keyword ("account number 12345678")."""
    for key in _BANK_KEYWORD.finditer(text):
        found = _value_after(text, key.end(), _ACCOUNT_VALUE)
        if found is None:
            continue
        m, _ = found
        digits = re.sub(r"\D", "", m.group())
        keyword = key.group().lower()
        if keyword.startswith(("routing", "aba")) and not rtn.is_valid(digits):
            continue
        if 6 <= len(digits) <= 17 and not _glued_after(text, m.end()):
            yield Span(m.start(), m.end(), "bank_account")


_PASSWORD_KEYWORD = re.compile(
    r"\b(?P<pin>pin(?:\s*(?:code|number|no\.?))?|(?:door|alarm|gate|garage|keypad|lock|locker"
    r"|safe)\s+(?:code|combination|pin)|combination)\b"
    r"|\b(?:pass(?:word|code|phrase)s?|pass\s+phrase|passwd|pwd|wi-?fi\s+key)\b"
    r"(?:\s+(?:for|to|on|of)\s+(?:my\s+|the\s+|our\s+)?[\w.'-]+(?:\s+(?:account|app|login"
    r"|site|wifi|wi-fi|router|email|laptop|phone))?)?",
    re.I,
)
_QUOTED = re.compile(r"[\"\u201c'\u2018]([^\"\u201d'\u2019\n]{1,80})[\"\u201d'\u2019]")
_TOKEN = re.compile(r"[^\s\"'\u201c\u201d\u2018\u2019]{3,64}")
_PIN_VALUE = re.compile(r"\d{4,8}(?![\w])", re.ASCII)
# Words after "password is" that describe it rather than state it.
_NOT_SECRETS = frozenset(
    """
    too very really not the a an same different strong weak long short easy hard simple secure
    safe expired wrong incorrect correct right saved stored changed reset required needed
    something still also just my your his her their our in on at for of and or but that this
    it there here now being been protected set updated case sensitive forgotten lost blank
    empty what which where how why who when locked missing invalid valid new old mine yours
    written somewhere manager managers hint hints policy policies please so only always never
    one ones like about
    """.split()  # noqa: SIM905
)


def _secret_token(text: str, start: int) -> tuple[int, int] | None:
    quoted = _QUOTED.match(text, start)
    if quoted is not None:
        return quoted.start(1), quoted.end(1)
    token = _TOKEN.match(text, start)
    if token is None:
        return None
    value = token.group().rstrip(".,;:!?)]}")
    if len(value) < 3 or value.lower() in _NOT_SECRETS:
        return None
    return token.start(), token.start() + len(value)


def find_passwords(text: str) -> Iterator[Span]:
    """Passwords, PINs and door codes stated outright: "my password is X", "PIN: 4821"."""
    for key in _PASSWORD_KEYWORD.finditer(text):
        if key.group("pin"):
            found = _value_after(text, key.end(), _PIN_VALUE)
            if found is not None and not _glued_after(text, found[0].end()):
                yield Span(found[0].start(), found[0].end(), "password")
            continue
        filler = _FILLER.match(text, key.end())
        assert filler is not None
        if filler.end() - key.end() > 40 or not _LINKERS.search(filler.group()):
            continue
        secret = _secret_token(text, filler.end())
        if secret is not None:
            yield Span(secret[0], secret[1], "password")


# Credentials by their issuer's format: each has a fixed prefix and a length no prose meets.
_PROVIDER_TOKENS = re.compile(
    r"(?<![\w-])(?:"
    r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,247}"  # Stripe secret and restricted keys
    r"|whsec_[A-Za-z0-9]{20,}"  # Stripe webhook secrets
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}"  # AWS key ids
    r"|(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,251}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{22,251}"  # GitHub fine-grained tokens
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[abposre]-[A-Za-z0-9-]{10,}"  # Slack (xoxb-, xoxp-...)
    r"|sk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API keys
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWTs
    r"|npm_[A-Za-z0-9]{36}"  # npm
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r")(?![\w-])"
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*)",
    re.S,
)
# A credential named by a keyword ("the api key is ...", "aws secret: ..."): a value with
# letters and digits, 16+ characters, no spaces.
_SECRET_KEYWORD = re.compile(
    r"\b(?:api[\s_-]?key|access[\s_-]?key(?:[\s_-]?id)?|secret(?:[\s_-]access)?[\s_-]?key"
    r"|(?:client|app|aws|api)[\s_-]?secret|secret|(?:access|auth|bearer|api|refresh|session)"
    r"[\s_-]?token|token|bearer)\b",
    re.I,
)
_SECRET_VALUE = re.compile(r"[A-Za-z0-9+/=_.~-]{16,512}(?![\w+/=.~-])")


def _looks_like_key(value: str) -> bool:
    """Mixed as generated keys are (not a word, a date or a number): letters and digits, or
    both cases with a digit or a base64 symbol."""
    letters = sum(c.isalpha() for c in value)
    digits = sum(c.isdigit() for c in value)
    if letters >= 4 and digits >= 2:
        return True
    mixed_case = any(c.islower() for c in value) and any(c.isupper() for c in value)
    return mixed_case and (digits >= 1 or "/" in value or "+" in value)


_AWS_KEY_ID = re.compile(r"(?<![\w])(?:AKIA|ASIA)[A-Z0-9]{16}(?![\w])")
# After a key id: up to 40 characters of punctuation and words ("with secret", "/"), then
# 40 characters of base64.
_AWS_SECRET_AFTER = re.compile(
    r"[^A-Za-z0-9+]{1,10}?(?:[A-Za-z ]{0,30}?[:=\s]+)?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)


def find_secrets(text: str) -> Iterator[Span]:
    """API keys and tokens of the common providers (Stripe sk_live_/sk_test_, AWS AKIA... and
    the secret after it, GitHub ghp_/github_pat_, Slack xoxb-, OpenAI/Anthropic sk-, Google
    AIza, JWTs...), private key blocks, and key-like values after "api key", "secret",
    "token"."""
    if "-----BEGIN" in text:
        for m in _PRIVATE_KEY.finditer(text):
            yield Span(m.start(), m.end(), "secret")
    for m in _PROVIDER_TOKENS.finditer(text):
        yield Span(m.start(), m.end(), "secret")
    for key in _SECRET_KEYWORD.finditer(text):
        found = _value_after(text, key.end(), _SECRET_VALUE)
        if found is None:
            continue
        m, _ = found
        value = m.group().rstrip(".")
        if _looks_like_key(value):
            yield Span(m.start(), m.start() + len(value), "secret")
    # An AWS secret access key: 40 characters of base64 right after an access key id.
    for key in _AWS_KEY_ID.finditer(text):
        pair = _AWS_SECRET_AFTER.match(text, key.end())
        if pair is not None and _looks_like_key(pair.group(1)):
            yield Span(pair.start(1), pair.end(1), "secret")


_CVV_KEYWORD = re.compile(
    r"\b(?:cvv2?|cvc2?|cid|card\s+(?:security|verification)\s+(?:code|value|number)"
    r"|security\s+code\s+(?:on|of)\s+(?:the|my)\s+card)\b",
    re.I,
)
_CVV_VALUE = re.compile(r"\d{3,4}(?![\w])", re.ASCII)
_OTP_KEYWORD = re.compile(
    r"\b(?:otp|totp|2fa|mfa"
    r"|(?:verification|verify|security|login|log-in|sign-in|signin|auth|authentication"
    r"|authorization|access|one[- ]time|2fa|two[- ]factor|mfa|sms|text)\s+(?:code|pin|passcode)"
    r"|one[- ]time\s+(?:password|passcode|pin)"
    r"|code\s+(?:(?:that|which|they|you|we|i|the\s+\w+)\s+)?(?:just\s+)?"
    r"(?:sent|texted|emailed|got|received)(?:\s+(?:me|you|us|to\s+me))?)\b",
    re.I,
)
_OTP_VALUE = re.compile(r"(?:\d{3,4}[ -]\d{3,4}|\d{4,8})(?![\w])", re.ASCII)


def find_card_codes(text: str) -> Iterator[Span]:
    """Card security codes (CVV/CVC) named as such: part of the card data."""
    for key in _CVV_KEYWORD.finditer(text):
        found = _value_after(text, key.end(), _CVV_VALUE)
        if found is not None and not _glued_after(text, found[0].end()):
            yield Span(found[0].start(), found[0].end(), "card_number")


def find_one_time_codes(text: str) -> Iterator[Span]:
    """Verification codes: "verification code 482913", "OTP: 4821", "the code they sent is"."""
    for key in _OTP_KEYWORD.finditer(text):
        found = _value_after(text, key.end(), _OTP_VALUE)
        if found is not None and not _glued_after(text, found[0].end()):
            yield Span(found[0].start(), found[0].end(), "one_time_code")


_EMAIL = re.compile(
    r"(?<![\w.+%-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,63})@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])",
    re.ASCII,
)


def find_emails(text: str) -> Iterator[Span]:
    for m in _EMAIL.finditer(text):
        yield Span(m.start(), m.end(), "email")


_PHONE_CONTEXT = re.compile(
    r"\b(?:call|calls|called|calling|phone|number|cell|cellphone|mobile|tel|telephone|text"
    r"|texts|sms|whatsapp|signal|reach|contact|fax|landline|dial|ring|ph|hotline|extension)\b",
    re.I,
)


# Candidates libphonenumber examines per text: bounds the time of a text made of digits.
_PHONE_MAX_TRIES = 200
# Digits joined by at most four non-word characters: libphonenumber's candidates are digit
# groups separated by up to four punctuation marks, and no valid number (country code
# included) has fewer than 7 digits. A text without such a run needs no matcher: the matcher
# costs about 0.5 ms a text, the rest of the screen about 0.05 ms.
_PHONE_RUN = re.compile(r"\d(?:\W{0,4}\d)*")


def _may_hold_phone(text: str) -> bool:
    return any(sum(c.isdigit() for c in m.group()) >= 7 for m in _PHONE_RUN.finditer(text))


def find_phones(text: str, regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> Iterator[Span]:
    """Phone numbers valid in their numbering plan: international (+...) anywhere, national
    ones of the given regions. Bare digit strings need a phone word nearby ("call me on")."""
    if sum(c.isdigit() for c in text) < 7 or not _may_hold_phone(text):
        return
    seen: set[tuple[int, int]] = set()
    for region in regions:
        matcher = phonenumbers.PhoneNumberMatcher(
            text, region, phonenumbers.Leniency.VALID, max_tries=_PHONE_MAX_TRIES
        )
        for match in matcher:
            where = (match.start, match.end)
            if where in seen:
                continue
            seen.add(where)
            raw = match.raw_string
            glued_before = match.start > 0 and (
                text[match.start - 1].isalnum() or text[match.start - 1] in "-/_#@"
            )
            if glued_before or _glued_after(text, match.end) or _is_reference(text, match.start):
                continue
            formatted = any(c in raw for c in "+() -.")
            if not formatted and not _PHONE_CONTEXT.search(
                text[max(0, match.start - 40) : match.start]
            ):
                continue
            yield Span(match.start, match.end, "phone")


# Most specific first: a span overlapping an earlier detector's span is dropped.
def detect(text: str, *, phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> list[Span]:
    """Every span of personal data in the text, sorted, non-overlapping."""
    if not text:
        return []
    chosen: list[Span] = []
    detectors: tuple[Iterator[Span], ...] = (
        find_secrets(text),
        find_cards(text),
        find_ibans(text),
        find_card_codes(text),
        find_passwords(text),
        find_one_time_codes(text),
        find_bank_accounts(text),
        find_keyword_ids(text),
        find_ssns(text),
        find_uk_ni(text),
        find_emails(text),
    )
    for spans in detectors:
        for span in spans:
            if all(span.end <= c.start or span.start >= c.end for c in chosen):
                chosen.append(span)
    # Phones last, in the text with what was found blanked out (a phone overlapping it would
    # be dropped anyway): a card number alone no longer wakes the costly matcher.
    masked = text
    for span in chosen:
        masked = masked[: span.start] + "x" * (span.end - span.start) + masked[span.end :]
    for span in find_phones(masked, phone_regions):
        if all(span.end <= c.start or span.start >= c.end for c in chosen):
            chosen.append(span)
    return sorted(chosen)


# -- the screen --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Screened:
    """A text after screening: what to store and what was found."""

    text: str
    # Kinds replaced by a label, each once, in PII_KINDS order.
    redactions: tuple[str, ...]
    # Kinds the policy rejects; the caller must not store the text (it is redacted anyway).
    rejected_kinds: tuple[str, ...]
    # (kind, action applied) for every span found: what the metrics count.
    found: tuple[tuple[str, str], ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(LABELS[k] for k in self.redactions)

    @property
    def kept(self) -> bool:
        """Some personal data stays in the text (the "store" action)."""
        return any(action == STORE for _, action in self.found)


def effective_action(
    policy: Mapping[str, str], kind: str, *, core: bool = False, may_reject: bool = True
) -> str:
    """The action for a kind: core memory never stores personal data; where a write cannot
    be refused (an episode's text), "reject" redacts."""
    action = policy.get(kind, REDACT)
    if action == STORE and core:
        return REDACT
    if action == REJECT and not may_reject:
        return REDACT
    return action


def screen(
    text: str,
    policy: Mapping[str, str],
    *,
    core: bool = False,
    may_reject: bool = True,
    phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS,
) -> Screened:
    """Apply a policy (kind -> store / redact / reject) to every span found in the text.
    Rejected spans are redacted too, so the returned text never holds them."""
    spans = detect(text, phone_regions=phone_regions)
    if not spans:
        return Screened(text, (), ())
    parts: list[str] = []
    cursor = 0
    found: list[tuple[str, str]] = []
    for span in spans:
        action = effective_action(policy, span.kind, core=core, may_reject=may_reject)
        found.append((span.kind, action))
        if action == STORE:
            continue
        parts.append(text[cursor : span.start])
        parts.append(placeholder(span.kind))
        cursor = span.end
    parts.append(text[cursor:])
    redacted = {k for k, a in found if a == REDACT}
    rejected = {k for k, a in found if a == REJECT}
    return Screened(
        "".join(parts),
        tuple(k for k in PII_KINDS if k in redacted),
        tuple(k for k in PII_KINDS if k in rejected),
        tuple(found),
    )


def unknown_phone_regions(regions: Sequence[str]) -> list[str]:
    """The region codes libphonenumber does not know (a configuration check)."""
    return [r for r in regions if r not in phonenumbers.SUPPORTED_REGIONS]
