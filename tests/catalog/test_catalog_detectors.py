"""Built-in detectors (catalog/detectors.py): every common credential format is found, in prose and in
code; code expressions that merely name a secret are not; personal numbers are checked by their
libraries (libphonenumber, python-stdnum) before they count."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from catalog import detectors
from catalog.tagging import Tagger

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import detect as bench_detect  # noqa: E402

FAMILIES = {fam: Tagger(r) for fam, r in bench_detect.FAMILY_RULES.items()}
PROSE = "Thanks for the review.\nThe rollout is on Tuesday; ping me if the dashboard breaks.\n"
CODE = "def handler(event):\n    items = [x for x in event['items'] if x]\n    return len(items)\n"


@pytest.mark.parametrize("name", sorted(bench_detect.formats()))
def test_each_format_is_found_in_prose_and_code(name):
    fam, gen, prose_c, code_c = bench_detect.formats()[name]
    rng = random.Random(name)
    for ctx, carriers, base in (("prose", prose_c, PROSE), ("code", code_c, CODE)):
        for carrier in carriers:
            text, s, e = bench_detect._plant(rng, base, carrier, gen(rng))
            spans = FAMILIES[fam].tag(pa.array([text]))
            assert any(sp.start < e and sp.end > s for sp in spans), (name, ctx, text)


@pytest.mark.parametrize("line", [
    "key = want_bytes(secret_key)", "secret_key = os.environ.get('SECRET_KEY')",
    "if password is None):", "password = None):", "self.password = password",
    "def login(user, password: str, token: Optional[str] = None):", "client = Client(api_key=api_key)",
    "password = new_password", "API_KEY = os.getenv(\"API_KEY\")", "headers['X-Access-Token'] = token",
    "password = settings.DATABASE_PASSWORD", "auth_token = self._auth_token", "password: '********'",
    "db_password = '{{ vault.db_password }}'", "password = \"${DB_PASSWORD}\"", "the password: is required",
    "our secret: plans for the offsite", "see https://example.com:8080/path@v2",
])
def test_code_expressions_are_not_secrets(line):
    assert FAMILIES["credentials"].tag(pa.array([line])) == [], line


@pytest.mark.parametrize("text,want", [
    ("password = 'hunter2x'", "hunter2x"), ("DB_PASSWORD=Tr0ub4dor", "Tr0ub4dor"),
    ("postgres://app:s3cr3t!@db:5432/x", "s3cr3t!"), ("password: correcthorse", "correcthorse"),
])
def test_literal_passwords_are(text, want):
    spans = FAMILIES["credentials"].tag(pa.array([text]))
    assert [text[s.start:s.end] for s in spans] == [want]


def test_numbers_are_checked_by_their_libraries():
    t = Tagger([{"secret_class": c, "kind": "detector", "patterns": [c]}
                for c in ("phone", "payment_card", "iban", "national_id")])
    text = ("version 1.2+20080419-1, card 4111 1111 1111 1111 and 4111 1111 1111 1112, "
            "IBAN GB82 WEST 1234 5698 7654 32 vs GB82 WEST 1234 5698 7654 33, ssn 078-05-1120 and 123-45-6789, "
            "phone +44 20 7946 0958")
    got = {s.secret_id for s in t.tag(pa.array([text]))}
    assert got == {"payment_card:4111111111111111", "iban:GB82WEST12345698765432", "national_id:123456789",
                   "phone:+442079460958"}


def test_the_nanp_shortcut_answers_as_libphonenumber():
    """The +1 shortcut of the phone check (no library parse) gives the library's answer: generated
    numbers in every spelling it takes, and near misses it must leave to the library."""
    import random

    from catalog.detectors import _nanp_possible, _nanp_shortcut_holds, _phone_possible, _phone_possible_lib

    assert _nanp_shortcut_holds()
    rng = random.Random(7)
    seps = ["-", ".", " ", ""]
    taken = 0
    for _ in range(150):
        area = str(rng.randint(0, 999)).zfill(3)
        a, b = str(rng.randint(0, 999)).zfill(3), str(rng.randint(0, 9999)).zfill(4)
        s1, s2, s3 = (rng.choice(seps) for _ in range(3))
        head = f"({area})" if rng.random() < 0.3 else area
        value = f"+1{s1}{head}{s2}{a}{s3}{b}" + ("" if rng.random() < 0.9 else rng.choice(["5", "-12"]))
        fast = _nanp_possible(value)
        if fast is not None:
            taken += 1
            assert fast == _phone_possible_lib(value), value
        assert _phone_possible(value) == _phone_possible_lib(value), value
    assert taken > 50
    for miss in ("+1-155-010-1234", "+1-055-010-1234", "+1-555-010-12345", "+44-555-010-1234", "+1-(555-010-1234"):
        assert _nanp_possible(miss) is None, miss


def test_every_detect_secrets_plugin_runs_on_re2():
    import importlib
    import inspect
    import pkgutil

    import detect_secrets.plugins as plugins
    from detect_secrets.plugins.base import RegexBasedDetector

    total = 0
    for info in pkgutil.iter_modules(plugins.__path__):
        mod = importlib.import_module(f"detect_secrets.plugins.{info.name}")
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if (cls.__module__ == mod.__name__ and issubclass(cls, RegexBasedDetector) and cls is not RegexBasedDetector
                    and name not in detectors._SKIP_PLUGINS):
                total += len(list(cls().denylist))
    pats = detectors._detect_secrets_patterns()
    assert len(pats) == total  # none lost in translation to RE2
    names = {p.sub.rsplit("_", 1)[0] if p.sub[-1].isdigit() else p.sub for p in pats}
    for want in ("aws_key", "git_hub_token", "git_lab_token", "jwt_token", "open_ai", "send_grid", "slack",
                 "stripe", "twilio_key", "azure_storage_key", "basic_auth", "npm"):
        assert want in names, (want, sorted(names))
