"""Secret detection: recall per format and false-positive rate, on prose and on source code, for the
built-in detectors (catalog/detectors.py) next to the previous hand-written patterns (baseline).

    python bench/detect.py                # table
    python bench/detect.py --json --plants 100

Ordinary records come from this machine: prose = entries of the real Debian changelogs under
/usr/share/doc/*/changelog.Debian.gz (maintainers' own words, with their real addresses), code =
30-line chunks of the Python standard library under /usr/lib/python3*/ and of the top-level modules of
the installed third-party packages (web frameworks, cloud SDKs: where `secret_key`, `token`, `password`
are everyday names). Tokens are generated per
format with the structure real ones have (prefixes, lengths, alphabets, checksums: GitHub's CRC32,
Luhn, IBAN mod 97, SSN area rules, JWT's base64url JSON), then planted into a random ordinary record
in a carrier that fits the context (prose: "here is the key: …"; code: `API_KEY = "…"`, a call
argument, a connection string). A plant counts as found when a span of the right detector family
overlaps the token. The false-positive rate is the share of *unplanted* ordinary records that the
credential detector (or the card / IBAN / national-id detectors) flags at all; emails and phones in
changelogs are real and not counted as false positives.

Target: ≥ 95 % recall on common credential formats, ≤ 1 % of ordinary records flagged.
"""
from __future__ import annotations

import argparse
import base64
import glob
import gzip
import json
import os
import random
import re
import string
import sys
import time
import zlib
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.tagging import Tagger  # noqa: E402

ALNUM = string.ascii_letters + string.digits
B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def _r(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b62(n: int, width: int) -> str:
    out = ""
    while n:
        n, d = divmod(n, 62)
        out = B62[d] + out
    return out.rjust(width, "0")


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _luhn_complete(rng, prefix: str, length: int) -> str:
    body = prefix + _r(rng, string.digits, length - len(prefix) - 1)
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return body + str((10 - total % 10) % 10)


def _card(rng) -> str:
    prefix = rng.choice(["4", "51", "55", "2221", "37", "34", "6011"])
    n = _luhn_complete(rng, prefix, 15 if prefix in ("34", "37") else 16)
    if rng.random() < 0.5:  # as printed on the card
        n = " ".join([n[:4], n[4:10], n[10:]]) if len(n) == 15 else " ".join(n[i:i + 4] for i in range(0, 16, 4))
    return n


def _iban(rng) -> str:
    country, bban = rng.choice([("DE", _r(rng, string.digits, 18)), ("GB", "WEST" + _r(rng, string.digits, 14)),
                                ("FR", _r(rng, string.digits, 23)), ("NL", "ABNA" + _r(rng, string.digits, 10))])
    num = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(num) % 97
    raw = f"{country}{check:02d}{bban}"
    return " ".join(raw[i:i + 4] for i in range(0, len(raw), 4)) if rng.random() < 0.5 else raw


def _phone(rng) -> str:
    import phonenumbers

    region = rng.choice(["US", "GB", "DE", "FR", "IN", "BR", "AU", "JP"])
    ex = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE)
    nat = str(ex.national_number)
    # vary the last digits, keep the number valid for its region
    for _ in range(50):
        cand = nat[:-3] + _r(rng, string.digits, 3)
        n = phonenumbers.parse("+" + str(ex.country_code) + cand)
        if phonenumbers.is_valid_number(n):
            break
    else:
        n = ex
    fmt = phonenumbers.PhoneNumberFormat.INTERNATIONAL if region != "US" or rng.random() < 0.5 \
        else phonenumbers.PhoneNumberFormat.NATIONAL
    return phonenumbers.format_number(n, fmt)


def _ssn(rng) -> str:
    while True:
        area = rng.randint(1, 899)
        if area != 666:
            return f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"


def _pem(rng) -> str:
    kind = rng.choice(["RSA ", "EC ", "OPENSSH ", ""])
    body = "\n".join(_r(rng, string.ascii_letters + string.digits + "+/", 64) for _ in range(rng.randint(4, 12)))
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{body}\n-----END {kind}PRIVATE KEY-----"


def _password(rng) -> str:
    return _r(rng, ALNUM, rng.randint(6, 10)) + rng.choice("!#%^*-+") + _r(rng, string.digits, 2)


# format -> (family, generator, prose carriers, code carriers); "{t}" is the token.
def formats():
    def gh(rng):
        body = _r(rng, ALNUM, 30)
        return "ghp_" + body + _b62(zlib.crc32(body.encode()), 6)

    def jwt(rng):
        h = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        p = _b64url(json.dumps({"sub": str(rng.randint(1, 10**9)), "name": "x", "iat": rng.randint(1.5e9, 1.8e9)}).encode())
        return f"{h}.{p}.{_b64url(rng.randbytes(32))}"

    prose_key = ["here is the key: {t} — rotate it after the demo", "use {t} for the staging account",
                 "token for the CI bot is {t}", "I pasted {t} into the config, sorry"]
    code_key = ['API_KEY = "{t}"', 'client = Client(token="{t}")', "headers = {{'Authorization': 'Bearer {t}'}}",
                'config["token"] = "{t}"']
    F = {
        "aws_access_key": ("credentials", lambda r: "AKIA" + _r(r, string.ascii_uppercase + string.digits, 16), prose_key, code_key),
        "aws_secret_key": ("credentials", lambda r: _r(r, ALNUM + "+/", 40),
                           ["aws_secret_access_key = {t}", "AWS_SECRET_ACCESS_KEY={t}"],
                           ['aws_secret_access_key = "{t}"', "AWS_SECRET_ACCESS_KEY: '{t}'"]),
        "github_token": ("credentials", gh, prose_key, code_key),
        "github_fine_grained": ("credentials", lambda r: "github_pat_" + _r(r, ALNUM, 22) + "_" + _r(r, ALNUM, 59), prose_key, code_key),
        "gitlab_token": ("credentials", lambda r: "glpat-" + _r(r, ALNUM + "_-", 20), prose_key, code_key),
        "slack_token": ("credentials", lambda r: f"xoxb-{r.randint(10**10, 10**12)}-{r.randint(10**10, 10**12)}-{_r(r, ALNUM, 24)}", prose_key, code_key),
        "slack_webhook": ("credentials", lambda r: f"https://hooks.slack.com/services/T{_r(r, ALNUM.upper(), 8)}/B{_r(r, ALNUM.upper(), 8)}/{_r(r, ALNUM, 24)}", prose_key, code_key),
        "stripe_key": ("credentials", lambda r: "sk_live_" + _r(r, ALNUM, r.choice([24, 99])), prose_key, code_key),
        "jwt": ("credentials", jwt, prose_key, code_key),
        "google_api_key": ("credentials", lambda r: "AIza" + _r(r, ALNUM + "_-", 35), prose_key, code_key),
        "openai_key": ("credentials", lambda r: "sk-proj-" + _r(r, ALNUM + "_-", 74) + "T3BlbkFJ" + _r(r, ALNUM + "_-", 74), prose_key, code_key),
        "anthropic_key": ("credentials", lambda r: "sk-ant-api03-" + _r(r, ALNUM + "_-", 93) + "AA", prose_key, code_key),
        "huggingface_token": ("credentials", lambda r: "hf_" + _r(r, string.ascii_letters, 34), prose_key, code_key),
        "npm_token": ("credentials", lambda r: "npm_" + _r(r, ALNUM, 36), prose_key, code_key),
        "sendgrid_key": ("credentials", lambda r: f"SG.{_r(r, ALNUM + '_-', 22)}.{_r(r, ALNUM + '_-', 43)}", prose_key, code_key),
        "twilio_key": ("credentials", lambda r: r.choice(["AC", "SK"]) + _r(r, "0123456789abcdef", 32), prose_key, code_key),
        "azure_storage_key": ("credentials", lambda r: base64.b64encode(r.randbytes(64)).decode(),
                              ["connection string: DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={t};EndpointSuffix=core.windows.net"],
                              ['CONN = "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={t};EndpointSuffix=core.windows.net"']),
        "private_key": ("credentials", _pem, ["my deploy key, keep it safe:\n{t}"], ['KEY = """{t}"""']),
        "database_url_password": ("credentials", _password,
                                  ["prod db is postgres://app:{t}@db.internal:5432/app"],
                                  ['DATABASE_URL = "postgresql://app:{t}@db.internal:5432/app"',
                                   'engine = create_engine("mysql://root:{t}@localhost/test")']),
        "basic_auth_url": ("credentials", _password, ["mirror at https://deploy:{t}@repo.example.com/simple"],
                           ['INDEX = "https://deploy:{t}@repo.example.com/simple"']),
        "password_assignment": ("credentials", _password, ["password: {t}", "DB_PASSWORD={t}"],
                                ['password = "{t}"', 'db_password: "{t}"', 'connect(user="app", password="{t}")']),
        # personal data (not in the credential target)
        "phone": ("phone", _phone, ["call me on {t} tomorrow", "mobile {t}"], ['SUPPORT_PHONE = "{t}"']),
        "payment_card": ("payment_card", _card,
                         ["card {t}, exp 09/27"], ['TEST_CARD = "{t}"']),
        "iban": ("iban", _iban, ["please wire it to {t}"], ['IBAN = "{t}"']),
        "us_ssn": ("national_id", _ssn, ["my SSN is {t}"], ['ssn = "{t}"']),
    }
    return F


COMMON_CREDENTIALS = [k for k, v in formats().items() if v[0] == "credentials"]

# The hand-written patterns before this benchmark (DETECTOR_VERSION 1), run with Python `re`.
BASELINE = [
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b", r"\bgh[pousr]_[A-Za-z0-9]{30,255}\b",
    r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b", r"\bxox[abposr]-[A-Za-z0-9-]{10,250}",
    r"\b[A-Za-z0-9]{2,32}_live_[A-Za-z0-9]{16,128}\b",
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]{0,16384}?-----END [A-Z0-9 ]*PRIVATE KEY-----",
    r"(?i)(?<![A-Za-z0-9])(?:password|passwd|pwd|passphrase|client[_-]?secret|secret[_-]?key|secret[_-]?access[_-]?key|"
    r"api[_-]?key|access[_-]?token|auth[_-]?token)\s*[:=]\s*[\"']?([^\s\"',;]{4,200})",
]


def prose_records(limit: int, rng) -> list[str]:
    trailer = re.compile(r"^ -- .+ <[^>]+>  .+$")
    out: list[str] = []
    files = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))
    rng.shuffle(files)
    for f in files:
        body: list[str] = []
        try:
            for line in gzip.open(f, "rt", encoding="utf-8", errors="replace"):
                if trailer.match(line):
                    if body:
                        out.append("\n".join(body))
                    body = []
                elif line.startswith("  "):
                    body.append(line.rstrip("\n"))
        except (OSError, EOFError):
            continue
        if len(out) >= limit:
            break
    return out[:limit]


CODE_GLOBS = ("/usr/lib/python3*/*.py", "/usr/lib/python3*/*/*.py",
              # third-party code too (web frameworks, cloud SDKs: where secret-ish names abound)
              str(Path(sys.prefix) / "lib/python3*/site-packages/*/*.py"))


def code_records(limit: int, rng, lines: int = 30) -> list[str]:
    files = sorted({f for g in CODE_GLOBS for f in glob.glob(g)})
    rng.shuffle(files)
    out: list[str] = []
    for f in files:
        try:
            src = Path(f).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for i in range(0, len(src), lines):
            chunk = "\n".join(src[i:i + lines])
            if chunk.strip():
                out.append(chunk)
        if len(out) >= limit * 2:
            break
    rng.shuffle(out)
    return out[:limit]


def _plant(rng, record: str, carrier: str, token: str) -> tuple[str, int, int]:
    line = carrier.replace("{t}", "\x00")
    lines = record.split("\n")
    at = rng.randint(0, len(lines))
    lines.insert(at, line)
    text = "\n".join(lines)
    start = text.index("\x00")
    return text.replace("\x00", token), start, start + len(token)


FAMILY_RULES = {fam: [{"secret_class": fam, "kind": "detector", "patterns": [fam]}]
                for fam in ("credentials", "phone", "payment_card", "iban", "national_id", "email")}


def _found(spans, start, end) -> set[int]:
    return {s.row for s in spans if s.start < end and s.end > start}


def run(plants: int, ordinary: int, seed: int) -> dict:
    rng = random.Random(seed)
    corpora = {"prose": prose_records(ordinary, rng), "code": code_records(ordinary, rng)}
    taggers = {fam: Tagger(r) for fam, r in FAMILY_RULES.items()}
    base_rx = [re.compile(p) for p in BASELINE]
    out: dict = {"formats": {}, "false_positives": {}, "corpus": {k: len(v) for k, v in corpora.items()}}
    t0 = time.perf_counter()
    for name, (fam, gen, prose_c, code_c) in formats().items():
        row = {"family": fam}
        for ctx, carriers in (("prose", prose_c), ("code", code_c)):
            texts, where = [], []
            for _ in range(plants):
                rec = rng.choice(corpora[ctx])
                text, s, e = _plant(rng, rec, rng.choice(carriers), gen(rng))
                texts.append(text)
                where.append((s, e))
            spans = taggers[fam].tag(pa.array(texts))
            hit = sum(1 for i, (s, e) in enumerate(where)
                      if any(sp.row == i and sp.start < e and sp.end > s for sp in spans))
            row[f"{ctx}_recall"] = hit / plants
            if fam == "credentials":
                bhit = 0
                for text, (s, e) in zip(texts, where):
                    if any(m.start(m.lastindex or 0) < e and m.end(m.lastindex or 0) > s
                           for rx in base_rx for m in rx.finditer(text)):
                        bhit += 1
                row[f"{ctx}_recall_baseline"] = bhit / plants
        out["formats"][name] = row
    for ctx, recs in corpora.items():
        arr = pa.array(recs)
        fp = {}
        for fam in ("credentials", "phone", "payment_card", "iban", "national_id"):
            spans = taggers[fam].tag(arr)
            flagged = {s.row for s in spans}
            fp[fam] = {"flagged": len(flagged), "rate": len(flagged) / max(1, len(recs)),
                       "examples": sorted({recs[s.row][s.start:s.end][:60] for s in spans})[:8]}
        bflag = sum(1 for t in recs if any(rx.search(t) for rx in base_rx))
        fp["credentials_baseline"] = {"flagged": bflag, "rate": bflag / max(1, len(recs))}
        out["false_positives"][ctx] = fp
    cred = [out["formats"][k] for k in COMMON_CREDENTIALS]
    for ctx in ("prose", "code"):
        out[f"credential_recall_{ctx}"] = sum(r[f"{ctx}_recall"] for r in cred) / len(cred)
        out[f"credential_recall_{ctx}_baseline"] = sum(r[f"{ctx}_recall_baseline"] for r in cred) / len(cred)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out["target"] = {"credential_recall": 0.95, "max_flagged": 0.01}
    out["meets_target"] = (min(out["credential_recall_prose"], out["credential_recall_code"]) >= 0.95
                           and all(out["false_positives"][c]["credentials"]["rate"] <= 0.01 for c in corpora))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plants", type=int, default=100, help="planted tokens per format and context")
    ap.add_argument("--ordinary", type=int, default=3000, help="ordinary records per context")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.plants, a.ordinary, a.seed)
    if a.json:
        print(json.dumps(res, indent=2, sort_keys=True))
        return 0
    print(f"{'format':24} {'family':13} {'prose':>7} {'(base)':>7} {'code':>7} {'(base)':>7}")
    for name, r in res["formats"].items():
        pb = f"{r['prose_recall_baseline']:.0%}" if "prose_recall_baseline" in r else ""
        cb = f"{r['code_recall_baseline']:.0%}" if "code_recall_baseline" in r else ""
        print(f"{name:24} {r['family']:13} {r['prose_recall']:>7.0%} {pb:>7} {r['code_recall']:>7.0%} {cb:>7}")
    print(f"{'credentials (mean)':38} {res['credential_recall_prose']:>7.1%} {res['credential_recall_prose_baseline']:>7.1%} "
          f"{res['credential_recall_code']:>7.1%} {res['credential_recall_code_baseline']:>7.1%}")
    print()
    print(f"ordinary records flagged (prose: {res['corpus']['prose']} Debian changelog entries, "
          f"code: {res['corpus']['code']} 30-line chunks of stdlib + installed packages)")
    for ctx, fp in res["false_positives"].items():
        for fam, v in fp.items():
            ex = ("  e.g. " + " | ".join(repr(x) for x in v.get("examples", [])[:3])) if v.get("examples") else ""
            print(f"  {ctx:6} {fam:22} {v['flagged']:>5} {v['rate']:>7.2%}{ex}")
    print(f"\nmeets target (≥95 % credential recall, ≤1 % flagged): {res['meets_target']}   ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
