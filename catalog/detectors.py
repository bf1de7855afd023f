"""Built-in secret detectors, from well-kept libraries, run on RE2 (linear time, no backtracking).

- **credentials**: every regex plugin of detect-secrets (Yelp) — AWS, Artifactory, Azure storage,
  basic-auth URLs (database URLs included), Cloudant, Discord, GitHub, GitLab, IBM, JWT, Mailchimp,
  npm, OpenAI, private keys, PyPI, SendGrid, Slack, Softlayer, Square, Stripe, Telegram, Twilio —
  translated to RE2 syntax at import (lookarounds become consuming classes, the value is the
  plugin's capture group), plus formats detect-secrets 1.5 lacks (Google API keys, Anthropic,
  Hugging Face, npm/GitHub fine-grained tokens, Azure connection-string keys, whole PEM blocks) and a
  keyword-assignment detector for passwords whose value is checked not to be code
  (`want_bytes(secret_key)`, `os.environ.get(`, `None):` are expressions, not secrets).
- **phone**: candidates by RE2, kept only if `phonenumbers` (libphonenumber) says the number is valid
  (national forms, region US) or possible (with a `+` country code); normalized to E.164.
- **payment_card**: 13–19 digits with a known issuer prefix and a valid Luhn checksum (python-stdnum).
- **iban**: python-stdnum's IBAN check (country length and mod-97).
- **national_id**: US SSN (python-stdnum's area/group/serial rules; dashed form only), UK NINO, Spanish
  DNI/NIE, French NIR, Italian codice fiscale — each validated by python-stdnum.
- **email**: RE2 pattern (unchanged).
- **high_entropy** (opt-in, not a default): a quoted string whose Shannon entropy is over
  detect-secrets' limits (base64 4.5, hex 3.0) — recall on unknown token formats, at a price in false
  positives on code (see bench/detect.py).

Names and postal addresses need an NER model; none ships with Veil (no local model is assumed).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable

import re2

DETECTOR_VERSION = "2"


@dataclass(frozen=True)
class Pattern:
    sub: str                      # sub-detector name (detector = "<family>.<sub>")
    regex: str                    # RE2 syntax
    group: int | None = 0         # the secret's group; None: the first group that matched, else 0
    check: Callable[[str, str, int, int], bool] | None = None   # (value, text, start, end) -> keep?
    prefilter: str | None = None  # a looser RE2 pattern every match contains (None: loosen(regex))
    normalize: Callable[[str], str] | None = None


# -- credentials ----------------------------------------------------------------------------------
def _to_re2(p: str) -> str:
    """detect-secrets' Python patterns in RE2 syntax: `(?<=\\W)|(?<=^)` → `(?:^|\\W)` (consumes one
    character; the secret is a capture group, so its span is unchanged), `(?!…)` dropped,
    repeats over RE2's limit of 1000 capped (a longer token still matches: its first 1000 chars).
    A pattern that still does not compile is left out (a test checks none is, on the pinned version)."""
    p = p.replace("(?:(?<=\\W)|(?<=^))", "(?:^|\\W)")
    # "not followed by" checks are dropped: at worst a longer token's prefix matches (still a secret);
    # as a consuming class inside a capture group they would swallow a character into the value.
    p = re.sub(r"\(\?!(?:\\w|\[[^\]]*\])\)", "", p)
    p = re.sub(r"\{(\d+),(\d{4,})\}", lambda m: "{%s,1000}" % m.group(1), p)
    return p


# Plugins that are not credentials (public IPs) or that duplicate a stronger pattern below.
_SKIP_PLUGINS = {"IPPublicDetector", "PrivateKeyDetector"}


def _detect_secrets_patterns() -> list[Pattern]:
    from detect_secrets.plugins.base import RegexBasedDetector
    import detect_secrets.plugins as plugins

    out: list[Pattern] = []
    opts = re2.Options()
    opts.log_errors = False
    for info in sorted(pkgutil.iter_modules(plugins.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"detect_secrets.plugins.{info.name}")
        for name, cls in sorted(inspect.getmembers(mod, inspect.isclass)):
            if cls.__module__ != mod.__name__ or not issubclass(cls, RegexBasedDetector) or cls is RegexBasedDetector:
                continue
            if name in _SKIP_PLUGINS:
                continue
            for i, rx in enumerate(cls().denylist):
                p = _to_re2(rx.pattern)
                flags = ("i" if rx.flags & re.IGNORECASE else "") + ("s" if rx.flags & re.DOTALL else "")
                if rx.flags & re.VERBOSE:
                    p = re.sub(r"\s+#[^\n]*|\s+", "", p)
                if flags:
                    p = f"(?{flags})" + p
                try:
                    re2.compile(p, opts)
                except re2.error:  # pragma: no cover - checked by a test on the pinned version
                    continue
                sub = re.sub(r"Detector$", "", name)
                sub = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", sub).lower() + (f"_{i}" if i else "")
                out.append(Pattern(sub, p, None))
    return out


_QUOTE = "\"'`"
_CODE_WORDS = {"none", "null", "nil", "true", "false", "undefined", "self", "this", "str", "string", "bytes",
               "int", "bool", "any", "optional", "required", "object", "text", "char", "varchar", "secret",
               "password", "token", "key", "value", "void", "const", "var", "let", "function", "return", "new",
               "redacted", "changeme", "example", "placeholder", "dummy", "xxx", "your_password", "yourpassword",
               "mypassword", "your-password", "secretkey", "api_key", "apikey", "passwd", "pwd"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
_PLACEHOLDER = re.compile(r"^(.)\1{3,}$|^[*xX.\-_]+$|^<.*>?$|\$\{|\{\{|%\(|^%s$|^\$[A-Za-z_]")


def _assignment_ok(value: str, text: str, start: int, end: int) -> bool:
    """A keyword assignment's value is a secret, not code: the false positives of a naive
    `password = …` pattern on source code are expressions (`want_bytes(secret_key)`,
    `os.environ.get(`, `None):`, `self.password`, type hints `password: str`)."""
    if len(value) < 4:
        return False
    quoted = start > 0 and text[start - 1] in _QUOTE
    after = text[end:end + 1]
    if any(c in value for c in "()[]{}<>") or after in ("(", "[", "."):
        return False
    low = value.lower()
    if low in _CODE_WORDS or _PLACEHOLDER.search(value):
        return False
    if quoted:
        # a quoted literal is the value itself — unless it is a name: an environment variable, a dict
        # key or an HTTP header named for a credential ("API_KEY", "refresh_token", "X-Access-Token")
        return not (re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:[_-]+[A-Za-z0-9]+)+", value)
                    and re.search(r"(?i)pass|pwd|secret|token|key|auth|cred", value))
    if _ATTR.match(value):  # settings.SECRET_KEY, os.environ
        return False
    if _IDENT.match(value) and ("_" in value or value.islower()) and re.search(r"pass|pwd|secret|token|key", low):
        return False  # a variable named for what it holds: `api_key=api_key`, `password=password_hash`
    if _IDENT.match(value):
        # `password = new_password` in code: an identifier after ` = ` is a variable. In .env/ini/prose
        # (`PASSWORD=hunter2`, `password: hunter2`) it is the value; a digit makes a literal likely.
        sep = text[max(0, start - 3):start]
        if any(c.isdigit() for c in value):
            return True
        return "=" not in sep or not sep.startswith(" ") and not sep.endswith(" ")
    return True


# Bare "secret"/"token" are words of prose ("our secret: plans"); as a suffix (APP_SECRET=, refresh_token:)
# they name a credential.
_KEYWORDS = (r"password|passwd|pwd|passphrase|[_-]secret|api[_-]?key|apikey|access[_-]?key|access[_-]?token|"
             r"auth[_-]?token|client[_-]?secret|secret[_-]?key|private[_-]?key|bearer[_-]?token|[_-]token")
_KEYWORD = (r"(?i)(?:^|[^A-Za-z0-9])[A-Za-z0-9_.-]{0,40}?(?:" + _KEYWORDS + r")[\"']?\s{0,3}(?::=|=>|=|:)\s{0,3}"
            r"[\"'`]?([^\s\"'`,;]{4,200})")
_KEYWORD_PREFILTER = r"(?i)(?:" + _KEYWORDS + r")[\"']?\s*[:=]"

_EXTRA_CREDENTIALS = [
    Pattern("aws_access_key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    Pattern("github_token", r"\bgh[pousr]_[A-Za-z0-9]{36,251}\b"),
    Pattern("github_pat", r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b"),
    Pattern("gitlab_token", r"\bgl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|oas)-[A-Za-z0-9_\-]{20,64}"),
    Pattern("slack_token", r"\bxox[abposre]-[A-Za-z0-9-]{10,250}"),
    Pattern("slack_webhook", r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/]{20,120}"),
    Pattern("stripe_key", r"\b(?:sk|rk)_(?:live|test)_[0-9a-zA-Z]{24,247}\b"),
    Pattern("live_api_key", r"\b[A-Za-z0-9]{2,32}_live_[A-Za-z0-9]{16,128}\b"),
    Pattern("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    Pattern("google_oauth_secret", r"\bGOCSPX-[0-9A-Za-z_\-]{28}"),
    Pattern("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,200}T3BlbkFJ[A-Za-z0-9_\-]{20,200}"),
    Pattern("anthropic_key", r"\bsk-ant-(?:api|admin)\d{2}-[A-Za-z0-9_\-]{80,120}"),
    Pattern("huggingface_token", r"\bhf_[A-Za-z]{34}\b"),
    Pattern("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    Pattern("pypi_token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,1000}"),
    Pattern("sendgrid_key", r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}\b"),
    Pattern("twilio_key", r"\b(?:AC|SK)[0-9a-f]{32}\b"),
    Pattern("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    Pattern("azure_connection_key",
            r"(?i)(?:AccountKey|SharedAccessKey|SharedAccessSignature|sig)=([A-Za-z0-9+/%]{30,120}={0,2})", 1),
    Pattern("private_key", r"-----BEGIN [A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                           r"-----END [A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----",
            prefilter=r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY"),
    Pattern("url_password", r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,20}://[^\s:/@]{1,128}:([^\s@/]{1,256})@[A-Za-z0-9.\-\[]", 1,
            check=lambda v, t, s, e: not v.startswith(("$", "{", "<", "*")) and v.lower() not in _CODE_WORDS),
    Pattern("password_assignment", _KEYWORD, 1, check=_assignment_ok,
            prefilter=_KEYWORD_PREFILTER),
]


def credential_patterns() -> list[Pattern]:
    return _EXTRA_CREDENTIALS + [p for p in _detect_secrets_patterns()]


# -- phones ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=65_536)
def _phone_number(value: str):
    """libphonenumber's parse (region US for national forms), or None; cached: the same number recurs
    (signatures) and parsing is the costly part of tagging phones."""
    import phonenumbers

    try:
        return phonenumbers.parse(value, "US")
    except phonenumbers.NumberParseException:
        return None


def _phone_possible_lib(value: str) -> tuple[bool, str | None]:
    """(possible, E.164 when possible), by libphonenumber."""
    import phonenumbers

    n = _phone_number(value)
    if n is None or not phonenumbers.is_possible_number(n):
        return False, None
    return True, phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.E164)


# +1 and ten digits whose area code starts 2–9, in the usual spellings: libphonenumber reads these as
# country 1 (NANP), national number the ten digits (no national prefix to strip: it is '1'), and
# ten digits are a possible NANP length, so the answer is (True, '+1' + digits). Its parse costs
# ~100–250 µs a distinct number — the tagger's costliest step on phone-heavy text; this is a regex.
_NANP_PLUS = re.compile(r"\+1[-. ]?(?:\(([2-9][0-9]{2})\)|([2-9][0-9]{2}))[-. ]?([0-9]{3})[-. ]?([0-9]{4})", re.ASCII)
_NANP_PROBES = ("+1-212-555-0123", "+1 (907) 010-4567", "+1.555.010.1234", "+12065550100")


@functools.lru_cache(maxsize=1)
def _nanp_shortcut_holds() -> bool:
    """Whether this libphonenumber answers the probes as `_NANP_PLUS` assumes (its metadata could
    change): if not, every number goes to the library."""
    return all(_phone_possible_lib(v) == _nanp_possible(v) for v in _NANP_PROBES)


def _nanp_possible(value: str) -> tuple[bool, str | None] | None:
    m = _NANP_PLUS.fullmatch(value)
    if m is None:
        return None
    area = m.group(1) or m.group(2)
    return True, "+1" + area + m.group(3) + m.group(4)


@functools.lru_cache(maxsize=65_536)
def _phone_possible(value: str) -> tuple[bool, str | None]:
    """(possible, E.164 when possible). tests/catalog/test_catalog_detectors.py checks the NANP
    shortcut against the library on generated numbers."""
    fast = _nanp_possible(value)
    if fast is not None and _nanp_shortcut_holds():
        return fast
    return _phone_possible_lib(value)


@functools.lru_cache(maxsize=65_536)
def _phone_valid(value: str) -> bool:
    """Valid in some region: the costly test (it walks every region of the country code, 25 for +1),
    so it is asked only where a plain possible number is not enough."""
    import phonenumbers

    n = _phone_number(value)
    return n is not None and phonenumbers.is_valid_number(n)


def _phone_check(value: str, text: str, start: int, end: int) -> bool:
    before = text[start - 1:start]
    if before and (before.isalnum() or before in ".~+-_/:"):  # a version (1.2+20080419), an id, a path
        return False
    digits = sum(c.isdigit() for c in value)
    if not 7 <= digits <= 15:
        return False
    # With an explicit +country code the writer meant a phone number: a possible one is enough.
    if value.lstrip().startswith("+"):
        return _phone_possible(value)[0]
    return _phone_valid(value)


def norm_phone(value: str) -> str:
    """E.164 when libphonenumber can parse it (region US for national forms), else '+'/digits."""
    e164 = _phone_possible(value)[1]
    if e164:
        return e164
    digits = re.sub(r"\D", "", value)
    return ("+" + digits) if value.lstrip().startswith("+") else digits


PHONE = [
    Pattern("phone_international", r"\+\d{1,3}(?:[-. ]?\(?\d{1,5}\)?){2,5}\b", check=_phone_check,
            prefilter=r"\+\d"),
    Pattern("phone_nanp", r"(?:\(\d{3}\)\s?|\b\d{3}[-. ])\d{3}[-. ]\d{4}\b", check=_phone_check,
            prefilter=r"\d\d\d[-. ]\d\d\d\d"),
]


# -- cards, IBANs, national ids --------------------------------------------------------------------
_CARD_PREFIX = re.compile(r"^(?:4\d{12}(?:\d{3}){0,2}|5[1-5]\d{14}|2(?:2[2-9][1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)\d{12}"
                          r"|3[47]\d{13}|6(?:011|5\d\d)\d{12,15}|3(?:0[0-5]|[68]\d)\d{11,16}|35(?:2[89]|[3-8]\d)\d{12,15}"
                          r"|62\d{14,17})$")


def _card_check(value: str, text: str, start: int, end: int) -> bool:
    from stdnum import luhn

    digits = re.sub(r"[ \-]", "", value)
    return bool(_CARD_PREFIX.match(digits)) and luhn.is_valid(digits)


def _digits(v: str) -> str:
    return re.sub(r"\D", "", v)


def _iban_check(value: str, text: str, start: int, end: int) -> bool:
    from stdnum import iban

    return iban.is_valid(value)


def _compact_upper(v: str) -> str:
    return re.sub(r"[\s\-]", "", v).upper()


def _stdnum_check(module: str) -> Callable[[str, str, int, int], bool]:
    def check(value: str, text: str, start: int, end: int) -> bool:
        mod = importlib.import_module(f"stdnum.{module}")
        return bool(mod.is_valid(value))
    return check


CARD = [Pattern("payment_card", r"\b(?:\d[ \-]?){12,18}\d\b", check=_card_check, normalize=_digits)]
IBAN = [Pattern("iban", r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b", check=_iban_check,
                normalize=_compact_upper, prefilter=r"[A-Z][A-Z]\d\d ?[A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9]")]
NATIONAL_ID = [
    Pattern("us_ssn", r"\b\d{3}-\d{2}-\d{4}\b", check=_stdnum_check("us.ssn"), normalize=_digits),
    Pattern("gb_nino", r"\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b",
            check=_stdnum_check("gb.nino"), normalize=_compact_upper),
    Pattern("es_dni", r"\b(?:\d{8}|[XYZ]\d{7})-?[A-Z]\b", check=_stdnum_check("es.nif"), normalize=_compact_upper),
    Pattern("fr_nir", r"\b[12] ?\d{2} ?(?:0[1-9]|1[0-2]) ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2}\b",
            check=_stdnum_check("fr.nir"), normalize=_compact_upper),
    Pattern("it_codice_fiscale", r"\b[A-Z]{6}\d{2}[A-EHLMPR-T]\d{2}[A-Z]\d{3}[A-Z]\b",
            check=_stdnum_check("it.codicefiscale"), normalize=_compact_upper),
]

EMAIL = [Pattern("email", r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b",
                 prefilter=r"@[A-Za-z0-9-]+\.")]


# -- entropy (opt-in) -----------------------------------------------------------------------------
def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in (s.count(x) for x in set(s)))


def _entropy_check(value: str, text: str, start: int, end: int) -> bool:
    if re.fullmatch(r"[0-9a-fA-F]+", value):
        return _entropy(value) > 3.0 and len(value) >= 32
    return _entropy(value) > 4.5


HIGH_ENTROPY = [Pattern("high_entropy", r"[\"'`]([A-Za-z0-9+/=_\-]{20,500})[\"'`]", 1, check=_entropy_check,
                        prefilter=r"[\"'`][A-Za-z0-9+/=_\-][A-Za-z0-9+/=_\-][A-Za-z0-9+/=_\-][A-Za-z0-9+/=_\-]")]
