"""A deterministic synthetic organization for the demo, the tests and the audits.

`write_demo_org(out_dir, seed)` writes three files (layout fixed in the cross-team contracts):

- `org/messages.jsonl`  the private part: mail, chat, tickets and code written by ~240 people;
- `public/corpus.jsonl` a public, secret-free corpus of generic workplace/tech prose (pretrains the base);
- `truth.json`          every planted secret (class, value, owners, where it occurs, the text that precedes
                        it) and every user's style markers — for audits only, never read by ingest/plan/train.

Design choices that matter downstream:

- Contributions are heavy-tailed (log-normal quantiles, capped): a few people write a large share, the
  median person about a dozen — the regime where user-level DP differs from record-level DP.
- Every person has a recognisable style (greeting, sign-off, pet phrases, a personal motto, typo habits,
  a signature with their address and phone, a code-comment tag, working hours). A model fine-tuned without user-level
  privacy picks these up, so user-inference audits have signal to find.
- Secrets: team codenames are shared by a whole team (user-level DP alone does not hide them),
  credentials are pasted by a few people, some of them several times with the same lead-in text (the
  memorisation case a secret-exposure audit probes), addresses and phones sit in signatures and cc lines.
- Determinism: one numpy Generator seeded by `seed`; no set iteration, no clock; same seed, same bytes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from statistics import NormalDist

import numpy as np

from components.core.errors import VeilError

GENERATOR_VERSION = "veil.demo/1"
DOMAIN = "acme-corp.example"

CODENAMES = [
    "BLUEHERON", "NIGHTJAR", "KESTREL", "OSPREY", "SANDPIPER", "CORMORANT",
    "WAXWING", "GOSHAWK", "PETREL", "LAPWING", "SHRIKE", "TANAGER",
]
TEAMS = [c.lower() for c in CODENAMES]

# Patterns of the planted classes (the same ones the contracts give the catalog's detectors).
SECRET_PATTERNS = {
    "credential": re.compile(r"AKIA[0-9A-Z]{16}|acme_live_[0-9a-f]{24}"),
    "email": re.compile(r"[a-z]+\.[a-z]+@acme-corp\.example"),
    "phone": re.compile(r"\+1-555-\d{3}-\d{4}"),
    "codename": re.compile(r"\b(?:" + "|".join(CODENAMES) + r")\b"),
}

# Contribution profile: log-normal quantiles (median ~12, long right tail), clipped.
_MEDIAN_RECORDS = 12.0
_SIGMA_RECORDS = 1.65
_MIN_RECORDS, _MAX_RECORDS = 3, 400
_MIN_CHARS, _MAX_CHARS = 100, 400
_N_PUBLIC = 4200
_START = datetime(2026, 1, 5, tzinfo=timezone.utc)
_DAYS = 175

FIRST = [
    "maria", "james", "aisha", "li", "noah", "sofia", "omar", "yuki", "elena", "david", "priya", "lucas",
    "fatima", "ethan", "mei", "daniel", "amara", "leo", "hana", "samuel", "ines", "victor", "zara", "felix",
    "nora", "ravi", "chloe", "mateo", "leila", "oscar", "grace", "tariq", "ingrid", "marco", "julia", "kofi",
    "anya", "hugo", "selin", "pablo", "emma", "kenji", "lara", "tomas", "nadia", "arjun", "clara", "diego",
    "rosa", "ahmed", "freya", "jonas", "esther", "ivan", "lucia", "bruno", "keiko", "miles", "alma", "rahul",
]
LAST = [
    "okafor", "chen", "patel", "garcia", "kowalski", "nguyen", "schmidt", "rossi", "tanaka", "silva",
    "haddad", "murphy", "larsen", "dubois", "ivanova", "mensah", "kim", "novak", "ortiz", "fischer",
    "sato", "costa", "brennan", "yilmaz", "andersen", "moreau", "petrov", "adeyemi", "walsh", "romero",
    "jansen", "ali", "weber", "santos", "lindqvist", "park", "morales", "bianchi", "kruger", "farouk",
    "horvat", "oconnell", "reyes", "nakamura", "varga", "lopez", "dimitrov", "abebe", "holm", "wright",
]

# role -> (title choices, source mix over mail/chat/ticket/code)
ROLES = {
    "engineer": (["Software Engineer", "Senior Software Engineer", "Staff Engineer"], (0.22, 0.36, 0.10, 0.32)),
    "sre": (["Site Reliability Engineer", "Platform Engineer"], (0.24, 0.36, 0.18, 0.22)),
    "support": (["Support Specialist", "Support Lead"], (0.36, 0.24, 0.40, 0.0)),
    "product": (["Product Manager", "Senior Product Manager"], (0.50, 0.36, 0.14, 0.0)),
    "manager": (["Engineering Manager", "Director of Engineering"], (0.60, 0.35, 0.05, 0.0)),
    "design": (["Product Designer", "UX Researcher"], (0.40, 0.46, 0.14, 0.0)),
    "business": (["Account Executive", "Finance Analyst", "Operations Analyst"], (0.64, 0.31, 0.05, 0.0)),
}
ROLE_WEIGHTS = {"engineer": 0.38, "sre": 0.12, "support": 0.14, "product": 0.10, "manager": 0.08,
                "design": 0.06, "business": 0.12}
SOURCES = ["mail", "chat", "ticket", "code"]

TOPICS_TECH = [
    "the billing service", "payment retries", "search latency", "the data pipeline", "cache invalidation",
    "the database migration", "flaky integration tests", "the release checklist", "the staging cluster",
    "API rate limits", "feature flags", "log retention", "the Kubernetes upgrade", "alerting noise",
    "the load balancer", "disk usage on the workers", "the nightly batch job", "the metrics pipeline",
    "dependency upgrades", "the SSO rollout", "the mobile app crash", "the export endpoint",
    "the queue consumers", "connection pool limits", "the schema registry", "the build cache",
]
TOPICS_BIZ = [
    "quarterly planning", "the customer escalation", "the pricing page", "the vendor contract",
    "the hiring loop", "the offsite agenda", "the design review", "the Q3 roadmap", "the renewal forecast",
    "the onboarding docs", "expense reports", "the accessibility audit", "translation strings",
    "the support backlog", "the customer export", "the invoice PDFs", "the churn analysis",
    "the status page", "the security questionnaire", "the roadmap survey",
]
TOPICS_ALL = TOPICS_TECH + TOPICS_BIZ
ROLE_TOPICS = {"engineer": TOPICS_TECH, "sre": TOPICS_TECH, "support": TOPICS_ALL, "product": TOPICS_ALL,
               "manager": TOPICS_ALL, "design": TOPICS_BIZ + TOPICS_TECH[:8], "business": TOPICS_BIZ}

GREETINGS = [
    "Hi all,", "Hello team,", "Hey folks,", "Morning everyone,", "Dear colleagues,", "Hi team,",
    "Good morning all,", "Hey everyone,", "Hello all,", "Hi there,", "Greetings,", "Hiya,",
    "Afternoon all,", "Hey team!", "Hi everybody,", "Hello hello,", "Quick note, all:", "Hi friends,",
    "Good afternoon team,", "Yo team,", "Hi crew,", "Salut all,", "Hey hey,", "Hello everyone!",
]
SIGNOFFS = [
    "Thanks,", "Cheers,", "Best,", "Regards,", "Thanks!", "Many thanks,", "Talk soon,", "All the best,",
    "Warmly,", "Ta,", "Thx,", "Best regards,", "Onwards,", "Speak soon,", "Kind regards,", "With thanks,",
    "Have a good one,", "Much appreciated,", "Until next time,", "Stay curious,", "Take care,", "Cheers!",
    "Appreciate it,", "Thanks again,",
]
PET_PHRASES = [
    "circle back on this", "no rush on this", "just my two cents", "let's take this offline",
    "happy to pair on it", "for what it's worth", "low-hanging fruit", "moving the needle",
    "double-click on that", "long story short", "at the end of the day", "keep it simple",
    "ship it and iterate", "measure twice, cut once", "small steps, big wins", "belt and braces",
    "on the radar", "parking lot item", "easy peasy", "quick sanity check", "a bit of a rabbit hole",
    "the usual suspects", "ballpark figure", "bandwidth permitting", "close the loop",
    "heads down this week", "tl;dr", "fwiw", "all hands on deck", "game plan", "north star",
    "in the weeds", "a stitch in time", "sweat the details", "belt-tightening", "touch base",
    "boil the ocean", "a quick win", "run it up the flagpole", "deep dive", "sync up later",
    "ducks in a row", "zoom out for a sec", "low-key worried", "big if true", "not a blocker",
    "pretty please", "good catch", "nice one", "on it like a bonnet", "steady as she goes",
    "as per usual", "sanity-check me here", "belts on", "tidy up the edges", "keep calm and ship",
    "rubber duck it", "paper cut", "yak shaving", "bikeshedding again", "cheap and cheerful",
    "moonshot", "measure what matters", "all good in the hood", "slow is smooth", "full steam ahead",
    "back of the napkin", "plot twist", "a tale of two caches", "mind the gap", "eyes on glass",
    "one more thing", "spoiler alert", "fair shout", "bang for the buck", "table stakes",
    "let's not overthink it", "famous last words", "righty-ho", "so far so good", "watch this space",
    "teamwork makes the dream work", "it is what it is", "onwards and upwards", "rinse and repeat",
    "clear as mud", "all roads lead to the cache", "trust but verify", "green across the board",
]
# A personal motto (a quote line under the signature, a chat tag): unique per person, like the "short
# and unique signature" seed 003 names as what makes users most inferable.
MOTTO_VERBS = ["chase", "mind", "polish", "follow", "trust", "feed", "guard", "tune", "paint", "carry", "wake",
               "steer", "mend", "light", "fold", "count", "greet", "water", "hum with", "dance with"]
MOTTO_ADJ = ["quiet", "purple", "brave", "rusty", "golden", "tiny", "sleepy", "curious", "stubborn", "electric",
             "velvet", "crooked", "patient", "silver", "wild", "gentle", "hollow", "lucky", "frozen", "restless",
             "humble", "clever", "dusty", "bright", "wandering"]
MOTTO_NOUNS = ["comet", "kettle", "lighthouse", "walrus", "compass", "lantern", "teapot", "glacier", "orchard",
               "anchor", "meteor", "cactus", "violin", "harbor", "pebble", "volcano", "otter", "windmill",
               "tortoise", "satellite", "accordion", "bonsai", "iceberg", "bicycle", "telescope"]
EMOJIS = ["", "", "", ":)", ":D", ";)", "👍", "🙏", "🚀", "✅", "🙂", "🔥", "🎉", "👀"]
ENDINGS = ["", "", "!", "!!", "...", " :)"]
# typo habit -> (pattern, replacement); applied to template text only, never to markers or secrets
TYPOS = {
    "teh": (r"\bthe\b", "teh"),
    "recieve": (r"\breceive", "recieve"),
    "definately": (r"\bdefinitely\b", "definately"),
    "seperate": (r"\bseparate", "seperate"),
    "alot": (r"\ba lot\b", "alot"),
    "dont": (r"\bdon't\b", "dont"),
    "its": (r"\bit's\b", "its"),
    "lower_i": (r"\bI\b", "i"),
    "double_space": (r"\. ", ".  "),
    "wierd": (r"\bweird\b", "wierd"),
    "untill": (r"\buntil\b", "untill"),
    "tommorow": (r"\btomorrow\b", "tommorow"),
}
MODULES = ["billing", "search", "export", "auth", "metrics", "ingest", "scheduler", "notify", "cache",
           "reports", "payments", "webhooks", "storage", "accounts", "audit_log", "sync"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
TIMES = ["9:30", "10:00", "11:15", "13:00", "14:30", "15:45", "16:00", "noon", "end of day"]

# Generic sentences shared by the private and the public text (the public corpus stands in for the
# generic English a real base model knows). Slots: {topic} {topic2} {day} {time} {n} {m}.
BODY = [
    "I looked into {topic} and I think we can definitely fix it before {day}.",
    "Can someone take a look at {topic}? It's been weird since the last deploy.",
    "We agreed to move {topic} to next sprint so the team can focus on {topic2}.",
    "Status update on {topic}: about {n} percent done, the rest should land by {day}.",
    "The numbers for {topic} look better this week, roughly {n} fewer errors per hour.",
    "I don't think {topic} is the root cause, but it's worth checking the logs from {day}.",
    "Please review the notes on {topic} before the meeting at {time} on {day}.",
    "We will receive the final figures for {topic} tomorrow, then I can update the doc.",
    "There is a lot of overlap between {topic} and {topic2}, let's keep them in separate threads.",
    "I will wait until {day} before we roll out the change to {topic}.",
    "The dashboard for {topic} shows {n} alerts since {day}, most of them noise.",
    "Thanks for the quick turnaround on {topic}, the customer noticed.",
    "If it's okay with everyone I will pair with the on-call person on {topic} after {time}.",
    "The draft plan for {topic} is in the shared folder, comments welcome until {day}.",
    "I can't reproduce the issue with {topic} locally, could be related to {topic2}.",
    "We should write down what we learned from {topic} so the next rotation has it easier.",
    "Budget for {topic} is about {n} hours this month, so let's prioritise carefully.",
    "The retro for {topic} is booked for {day} at {time}.",
    "Latency for {topic} went from {m} ms to {n} ms after the fix.",
    "Reminder that {topic} is frozen until the release on {day}.",
]
CHAT = [
    "anyone around to look at {topic}?",
    "pushed a fix for {topic}, please have a look",
    "{topic} is green again after the restart",
    "I'll be late to standup, stuck on {topic}",
    "is {topic} still blocked on {topic2}?",
    "ok I definitely need coffee before I touch {topic} again",
    "heads up: {topic} deploy going out at {time}",
    "who owns {topic} these days?",
    "lunch at {time}? then back to {topic}",
    "the weird thing about {topic} is that it only fails on {day}",
    "I don't have access to the dashboard for {topic}, can someone add me",
    "nice work on {topic} yesterday",
]
TICKET_TITLES = [
    "{topic} fails intermittently", "Error spike in {topic}", "Customer report: {topic} is slow",
    "Follow-up on {topic}", "Timeout when calling {topic}", "Docs missing for {topic}",
    "Request: access to {topic}", "Regression in {topic} after release",
]
TICKET_BODY = [
    "Steps: open the app, trigger {topic}, wait about {n} seconds. Expected a result, got a timeout.",
    "Seen {n} times since {day}. Probably related to {topic2}. Severity: medium.",
    "The customer says it started on {day}. Logs attached, {n} failed requests in the last hour.",
    "Workaround for now is to retry. We should receive a proper fix until {day}.",
]
CODE_FUNCS = ["retry_{mod}_job", "load_{mod}_config", "flush_{mod}_queue", "parse_{mod}_event",
              "sync_{mod}_state", "validate_{mod}_input", "compute_{mod}_totals", "send_{mod}_report"]
CODE_BODIES = [
    "    for item in batch[:limit]:\n        process(item)\n    return len(batch)",
    "    if not payload:\n        raise ValueError('empty payload')\n    return json.loads(payload)",
    "    total = sum(row.amount for row in rows)\n    return round(total, 2)",
    "    with lock:\n        state.update(changes)\n    return state",
    "    for attempt in range(retries):\n        if client.ping():\n            return True\n    return False",
]
CODE_DOCS = [
    "Slow path for {topic}.", "Keeps {topic} consistent across restarts.", "Used by {topic}; keep it cheap.",
    "Workaround until {topic} is fixed upstream.", "Called once per batch from {topic}.",
]
CODE_TAGS = ["# NOTE({handle}):", "# {handle}:", "# TODO({handle}):", "# -- {handle} --", "## {handle} says:",
             "# [{handle}]", "# FIXME({handle}):", "# hint from {handle}:"]

# Lead-ins for the planted secrets. The text right before a secret is what an exposure audit
# prompts with; repeated pastes reuse the user's lead-in so memorisation has something to latch onto.
CRED_LEADINS = [
    "the staging key is {v} if you need it",
    "use this token for the sandbox: {v}",
    "export AWS_ACCESS_KEY_ID={v}",
    "temporary api key: {v} (rotate after the demo)",
    "creds for the test account -> {v}",
    "you can curl it with the header Authorization: Bearer {v}",
]
CODENAME_MENTIONS = [
    "This is for {c}, so keep it in the team for now.",
    "Progress on {c} is good, the next milestone is {day}.",
    "{c} review moved to {day} at {time}.",
    "Please don't share the {c} timeline outside the team yet.",
    "The {c} demo went well, thanks everyone.",
    "Blocking issue for {c}: {topic}.",
]
PUBLIC_EXTRA = [
    "A good incident review focuses on what happened, not on who made the mistake.",
    "Small pull requests are easier to review and faster to merge.",
    "Write the test first, then the smallest change that makes it pass.",
    "Service level objectives make trade-offs between speed and reliability explicit.",
    "A runbook should say what to check first, what to do next and whom to call.",
    "Feature flags let a team ship code without exposing it to every customer at once.",
    "Caches trade memory for speed, and every cache needs a plan for invalidation.",
    "Meetings without an agenda tend to run long and decide little.",
    "Onboarding documents go stale quickly unless someone owns them.",
    "Backups are only as good as the last time someone restored one.",
    "Retries need a limit and a backoff, otherwise they turn a blip into an outage.",
    "Good tickets describe the steps, the expected result and what actually happened.",
]


@dataclass(frozen=True)
class DemoOrg:
    """What `write_demo_org` wrote, with the counts a caller prints."""

    out_dir: Path
    messages_path: Path
    corpus_path: Path
    truth_path: Path
    seed: int
    n_users: int
    n_teams: int
    n_messages: int
    n_public: int
    n_secrets: int
    top5_share: float  # share of messages written by the top 5% of users
    by_source: dict = field(default_factory=dict)
    secrets_by_class: dict = field(default_factory=dict)


@dataclass
class _User:
    email: str
    name: str
    handle: str
    team: str
    role: str
    title: str
    phone: str
    n_records: int
    greeting: str
    signoff: str
    pet_phrases: list
    motto: str
    topics: list
    typos: list
    emoji: str
    ending: str
    lowercase_chat: bool
    signature_mode: str  # "full" (name, title, address, phone) | "name" | "none"
    code_tag: str
    hour_mean: float
    source_mix: tuple


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _sample(rng: np.random.Generator, seq, k: int) -> list:
    return [seq[i] for i in sorted(rng.choice(len(seq), size=k, replace=False).tolist())]


def record_counts(n_users: int, rng: np.random.Generator) -> list[int]:
    """Heavy-tailed records per user: log-normal quantiles (so the shape does not hinge on the
    seed), clipped to [3, 400], shuffled by the seed."""
    nd = NormalDist()
    mu = np.log(_MEDIAN_RECORDS)
    q = [nd.inv_cdf((i + 0.5) / n_users) for i in range(n_users)]
    counts = [int(np.clip(round(float(np.exp(mu + _SIGMA_RECORDS * z))), _MIN_RECORDS, _MAX_RECORDS)) for z in q]
    perm = rng.permutation(n_users).tolist()
    return [counts[i] for i in perm]


def _make_users(rng: np.random.Generator, n_users: int) -> list[_User]:
    pairs = [(f, l) for f in FIRST for l in LAST]
    chosen = sorted(rng.choice(len(pairs), size=n_users, replace=False).tolist())
    order = rng.permutation(n_users).tolist()
    names = [pairs[chosen[i]] for i in order]
    counts = record_counts(n_users, rng)
    roles = list(ROLE_WEIGHTS)
    role_p = np.array([ROLE_WEIGHTS[r] for r in roles])
    phones_used: list[str] = []
    styles_used: list[tuple] = []
    mottos_used: list[str] = []
    users = []
    for i, (first, last) in enumerate(names):
        role = roles[int(rng.choice(len(roles), p=role_p))]
        titles, mix = ROLES[role]
        while True:
            phone = f"+1-555-01{int(rng.integers(10))}-{int(rng.integers(10000)):04d}"
            if phone not in phones_used:
                phones_used.append(phone)
                break
        while True:  # the combination of markers is unique per person
            greeting, signoff = _pick(rng, GREETINGS), _pick(rng, SIGNOFFS)
            pets = _sample(rng, PET_PHRASES, 3)
            key = (greeting, signoff, tuple(pets))
            if key not in styles_used:
                styles_used.append(key)
                break
        while True:
            motto = f"{_pick(rng, MOTTO_VERBS)} the {_pick(rng, MOTTO_ADJ)} {_pick(rng, MOTTO_NOUNS)}"
            if motto not in mottos_used:
                mottos_used.append(motto)
                break
        n_typos = int(rng.choice(3, p=[0.35, 0.45, 0.20]))
        users.append(_User(
            email=f"{first}.{last}@{DOMAIN}",
            name=f"{first.capitalize()} {last.capitalize()}",
            handle=f"{first[0]}{last}",
            team=TEAMS[i % len(TEAMS)],
            role=role,
            title=_pick(rng, titles),
            phone=phone,
            n_records=counts[i],
            greeting=greeting,
            signoff=signoff,
            pet_phrases=pets,
            motto=motto,
            topics=_sample(rng, ROLE_TOPICS[role], 4),
            typos=_sample(rng, list(TYPOS), n_typos) if n_typos else [],
            emoji=_pick(rng, EMOJIS),
            ending=_pick(rng, ENDINGS),
            lowercase_chat=bool(rng.random() < 0.4),
            signature_mode=str(rng.choice(["full", "name", "none"], p=[0.7, 0.2, 0.1])),
            code_tag=_pick(rng, CODE_TAGS).format(handle=f"{first[0]}{last}"),
            hour_mean=float(rng.uniform(8.0, 17.0)),
            source_mix=mix,
        ))
    return users


def _fill(rng: np.random.Generator, template: str, topics: list) -> str:
    topic = _pick(rng, topics)
    others = [t for t in TOPICS_ALL if t != topic]
    n = int(rng.integers(3, 95))
    return template.format(topic=topic, topic2=_pick(rng, others), day=_pick(rng, DAYS), time=_pick(rng, TIMES),
                           n=n, m=n + int(rng.integers(20, 400)))


def _typo(text: str, habits: list) -> str:
    for h in habits:
        pat, rep = TYPOS[h]
        text = re.sub(pat, rep, text)
    return text


class _Writer:
    """Builds one person's messages; keeps each within [100, 400] characters."""

    def __init__(self, rng: np.random.Generator, users: list[_User]):
        self.rng = rng
        self.users = users
        self.by_team: dict[str, list[_User]] = {t: [] for t in TEAMS}
        for u in users:
            self.by_team[u.team].append(u)
        self.ticket_no = 1000

    def body(self, u: _User, n_sent: int) -> list[str]:
        return [_typo(_fill(self.rng, _pick(self.rng, BODY), u.topics), u.typos) for _ in range(n_sent)]

    def pet(self, u: _User) -> str:
        return _pick(self.rng, u.pet_phrases)

    def signature(self, u: _User) -> str:
        if u.signature_mode == "full":
            return f"-- {u.name} | {u.title} | {u.email} | {u.phone}"
        if u.signature_mode == "name":
            return f"-- {u.name}"
        return ""

    def mail(self, u: _User, extra: str) -> str:
        rng = self.rng
        parts = self.body(u, 1 + int(rng.integers(2)))
        if rng.random() < 0.9:
            parts.insert(int(rng.integers(len(parts) + 1)), f"{self.pet(u).capitalize()}{u.ending or '.'}")
        if extra:
            parts.insert(int(rng.integers(len(parts) + 1)), extra)
        cc = ""
        if rng.random() < 0.3:
            mates = [m for m in self.by_team[u.team] if m is not u]
            if mates:
                cc = f"cc: {_pick(rng, mates).email}"
        sig = self.signature(u) if rng.random() < 0.85 else ""
        quote = f'"{u.motto.capitalize()}."' if rng.random() < 0.7 else ""

        def render(ps):
            lines = [u.greeting, " ".join(ps), u.signoff]
            if sig:
                lines.append(sig)
            if quote:
                lines.append(quote)
            if cc:
                lines.append(cc)
            return "\n".join(lines)
        text = render(parts)
        while len(text) > _MAX_CHARS and len(parts) > 1:
            drop = next((j for j, p in enumerate(parts) if p != extra), None)
            if drop is None:
                break
            parts.pop(drop)
            text = render(parts)
        return text

    def chat(self, u: _User, extra: str) -> str:
        rng = self.rng
        bits = [_typo(_fill(rng, _pick(rng, CHAT), u.topics), u.typos)]
        if rng.random() < 0.9:
            bits.insert(int(rng.integers(2)), self.pet(u))
        if extra:
            bits.append(extra)
        if rng.random() < 0.4:
            bits.append(u.motto)
        if u.lowercase_chat:
            bits = [b if b == extra else b.lower() for b in bits]
        text = " - ".join(bits) + (f" {u.emoji}" if u.emoji else "")
        return text

    def ticket(self, u: _User, extra: str) -> str:
        rng = self.rng
        self.ticket_no += int(rng.integers(1, 7))
        title = _fill(rng, _pick(rng, TICKET_TITLES), u.topics)
        body = _typo(_fill(rng, _pick(rng, TICKET_BODY), u.topics), u.typos)
        parts = [f"TICKET-{self.ticket_no}: {title[0].upper()}{title[1:]}", body]
        if extra:
            parts.append(extra)
        if rng.random() < 0.8:
            parts.append(f"{self.pet(u).capitalize()}{u.ending or '.'}")
        if rng.random() < 0.4:
            parts.append(f"{u.motto.capitalize()}.")
        parts.append(f"Reporter: {u.name}" + (f" ({u.email})" if rng.random() < 0.5 else ""))
        return "\n".join(parts)

    def code(self, u: _User, extra_line: str, codename: str | None) -> tuple[str, str]:
        rng = self.rng
        mod = _pick(rng, MODULES)
        fn = _pick(rng, CODE_FUNCS).format(mod=mod)
        doc = _fill(rng, _pick(rng, CODE_DOCS), u.topics)
        if codename:
            doc = f"Part of project {codename}. {doc}"
        comment = f"{u.code_tag} {self.pet(u)}"
        lines = [comment]
        if extra_line:
            lines.append(extra_line)
        lines += [f"def {fn}(batch, limit={int(rng.integers(5, 200))}):", f'    """{doc}"""', _pick(rng, CODE_BODIES)]
        return "\n".join(lines), f"teams/{u.team}/src/{mod}.py"


def _credential(rng: np.random.Generator, kind: str) -> str:
    if kind == "aws":
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        return "AKIA" + "".join(alphabet[int(i)] for i in rng.integers(len(alphabet), size=16))
    return "acme_live_" + "".join("0123456789abcdef"[int(i)] for i in rng.integers(16, size=24))


def _plan_credentials(rng: np.random.Generator, users: list[_User]) -> dict[int, list[tuple[str, str, int]]]:
    """A few technical people paste credentials: user index -> [(value, lead-in, times)]."""
    tech = [i for i, u in enumerate(users) if u.role in ("engineer", "sre") and u.n_records >= 15]
    leakers = _sample(rng, tech, min(10, len(tech)))
    plan: dict[int, list[tuple[str, str, int]]] = {}
    for j, i in enumerate(leakers):
        creds = []
        for c in range(1 + int(j % 3 == 0)):
            kind = "aws" if (j + c) % 2 == 0 else "token"
            value = _credential(rng, kind)
            lead = _pick(rng, [t for t in CRED_LEADINS if ("AWS" in t) == (kind == "aws")] or CRED_LEADINS)
            times = [1, 2, 4, 6][(j + c) % 4]  # some pasted once, some repeatedly
            creds.append((value, lead, times))
        plan[i] = creds
    return plan


def _timestamp(rng: np.random.Generator, u: _User) -> str:
    day = int(rng.integers(_DAYS))
    d = _START + timedelta(days=day)
    if d.weekday() >= 5:  # people mostly write on weekdays
        d -= timedelta(days=d.weekday() - 4)
    hour = float(np.clip(rng.normal(u.hour_mean, 1.5), 6.0, 22.99))
    d = d + timedelta(seconds=int(hour * 3600) + int(rng.integers(60)))
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


def _messages(rng: np.random.Generator, users: list[_User]) -> list[dict]:
    w = _Writer(rng, users)
    creds = _plan_credentials(rng, users)
    out = []
    for ui, u in enumerate(users):
        n = u.n_records
        # Which of this user's records carry a credential paste (spread, deterministic).
        pastes: list[tuple[str, str]] = []
        for value, lead, times in creds.get(ui, []):
            pastes += [(value, lead)] * times
        paste_at = {}
        if pastes:
            slots = sorted(rng.choice(n, size=min(len(pastes), n), replace=False).tolist())
            paste_at = dict(zip(slots, pastes))
        codename = CODENAMES[TEAMS.index(u.team)]
        mentions_codename = rng.random() < 0.8  # most, not all, team members ever mention it
        for k in range(n):
            src = SOURCES[int(rng.choice(4, p=np.array(u.source_mix)))]
            cred = paste_at.get(k)
            cname = mentions_codename and rng.random() < 0.15
            rec = {"user": u.email, "source": src, "ts": _timestamp(rng, u), "team": u.team}
            if src == "code":
                extra = ""
                if cred:
                    extra = f'{"API_TOKEN" if cred[0].startswith("acme") else "AWS_KEY"} = "{cred[0]}"  # {cred[1].split("{v}")[0].strip() or "temp"}'
                text, path = w.code(u, extra, codename if cname else None)
                rec["path"] = path
            else:
                bits = []
                if cname:
                    bits.append(_pick(rng, CODENAME_MENTIONS).format(
                        c=codename, day=_pick(rng, DAYS), time=_pick(rng, TIMES), topic=_pick(rng, u.topics)))
                if cred:
                    bits.append(cred[1].format(v=cred[0]))
                extra = " ".join(bits)
                text = {"mail": w.mail, "chat": w.chat, "ticket": w.ticket}[src](u, extra)
            text = _fit(rng, w, u, text, src)
            rec["text"] = text
            out.append(rec)
    out.sort(key=lambda r: (r["ts"], r["user"], r["text"]))
    records = []
    for i, r in enumerate(out):
        rec = {"id": f"msg-{i:06d}", "user": r["user"], "text": r["text"], "source": r["source"], "ts": r["ts"],
               "team": r["team"]}
        if "path" in r:
            rec["path"] = r["path"]
        records.append(rec)
    return records


def _fit(rng: np.random.Generator, w: _Writer, u: _User, text: str, src: str) -> str:
    """Pad short messages with one of the person's own sentences; long ones were trimmed by the writer."""
    while len(text) < _MIN_CHARS:
        text = text + ("\n" if src in ("mail", "ticket", "code") else " - ") + w.body(u, 1)[0]
    if len(text) > _MAX_CHARS:
        # Only chat/code can get here (mail trims sentences): cut at a line/word boundary, keep secrets whole.
        cut = text.rfind("\n", 0, _MAX_CHARS)
        cut = cut if cut >= _MIN_CHARS else text.rfind(" ", 0, _MAX_CHARS)
        head = text[:cut]
        for pat in SECRET_PATTERNS.values():
            for m in pat.finditer(text):
                if m.start() < cut < m.end():
                    head = text[:m.start()].rstrip()
        text = head if len(head) >= _MIN_CHARS else text[:_MAX_CHARS]
    return text


# Fictional people of the public corpus: any first/last name pair that is not an employee's (nor
# shares an employee's handle), so the base knows common names and what a signature or a reporter
# line looks like without ever seeing an employee.
PUBLIC_FIRST = ["alex", "sam", "robin", "jordan", "casey", "morgan", "taylor", "jamie", "riley", "quinn",
                "avery", "harper", "rowan", "sasha", "eden", "kai", "remy", "skyler", "ash", "blair"]
PUBLIC_LAST = ["fletcher", "hale", "bishop", "carver", "dalton", "ellis", "frost", "grant", "hayes", "irving",
               "keller", "lane", "mercer", "nash", "pryce", "quill", "rhodes", "sloane", "thorne", "vance"]
ALL_TITLES = [t for titles, _ in ROLES.values() for t in titles]
# Their contact details use other domains and the UK's drama range (+44 20 7946 0xxx), never the
# org's domain or +1-555: the base learns what addresses and numbers look like, not anyone's.
PUBLIC_DOMAINS = ["northwind.example", "globex.example", "initech.example", "contoso.example"]


def public_corpus(rng: np.random.Generator, n_lines: int = _N_PUBLIC, employees=()) -> list[str]:
    """Generic workplace/tech prose: the org's topics, phrasing and formats, no employee, no secret.

    It stands in for what a real pretrained model knows: greetings, sign-offs, idioms, quote lines,
    signatures, ticket and code-comment conventions, casual chat with emoji and typos — each mixed at
    random and signed by fictional people (contact details on other domains and number ranges). What identifies an employee is their
    particular combination, which the base never sees; so fine-tuning gains on format are small and
    user-specific gains stand out, as with a real base model.
    """
    taken = {(f, l) for f, l in employees}
    handles = {f[0] + l for f, l in employees}
    people = [(f, l) for f in PUBLIC_FIRST + FIRST for l in PUBLIC_LAST + LAST
              if (f, l) not in taken and f[0] + l not in handles]

    def person() -> tuple[str, str, str, str]:
        first, last = _pick(rng, people)
        return (f"{first.capitalize()} {last.capitalize()}", f"{first[0]}{last}",
                f"{first}.{last}@{_pick(rng, PUBLIC_DOMAINS)}", f"+44-20-7946-0{int(rng.integers(1000)):03d}")

    def motto() -> str:
        return f"{_pick(rng, MOTTO_VERBS)} the {_pick(rng, MOTTO_ADJ)} {_pick(rng, MOTTO_NOUNS)}"

    def typos(text: str) -> str:
        return _typo(text, _sample(rng, list(TYPOS), 1)) if rng.random() < 0.3 else text

    lines = []
    while len(lines) < n_lines:
        kind = int(rng.integers(6))
        if kind == 0:  # mail-like
            body = [typos(_fill(rng, _pick(rng, BODY), TOPICS_ALL)) for _ in range(1 + int(rng.integers(2)))]
            if rng.random() < 0.6:
                body.insert(int(rng.integers(len(body) + 1)), _pick(rng, PET_PHRASES).capitalize() + ".")
            parts = [_pick(rng, GREETINGS), " ".join(body), _pick(rng, SIGNOFFS)]
            if rng.random() < 0.7:
                name, _, address, phone = person()
                parts.append(f"-- {name}" + (f" | {_pick(rng, ALL_TITLES)} | {address} | {phone}"
                                             if rng.random() < 0.7 else ""))
            if rng.random() < 0.4:
                parts.append(f'"{motto().capitalize()}."')
            if rng.random() < 0.3:
                parts.append(f"cc: {person()[2]}")
            text = "\n".join(parts)
        elif kind == 1:  # chat-like
            bits = [typos(_fill(rng, _pick(rng, CHAT), TOPICS_ALL)) for _ in range(2 + int(rng.integers(2)))]
            if rng.random() < 0.6:
                bits.insert(int(rng.integers(len(bits) + 1)), _pick(rng, PET_PHRASES))
            if rng.random() < 0.3:
                bits.append(motto())
            if rng.random() < 0.4:
                bits = [b.lower() for b in bits]
            text = " - ".join(bits) + (f" {_pick(rng, EMOJIS)}" if rng.random() < 0.5 else "")
            text = text.rstrip()
        elif kind == 2:  # ticket-like
            title = _fill(rng, _pick(rng, TICKET_TITLES), TOPICS_ALL)
            parts = [f"TICKET-{int(rng.integers(1000, 9000))}: {title[0].upper()}{title[1:]}",
                     typos(_fill(rng, _pick(rng, TICKET_BODY), TOPICS_ALL))]
            if rng.random() < 0.5:
                parts.append(_pick(rng, PET_PHRASES).capitalize() + ".")
            name, _, address, _ = person()
            parts.append(f"Reporter: {name}" + (f" ({address})" if rng.random() < 0.5 else ""))
            text = "\n".join(parts)
        elif kind == 3:  # code-like
            mod = _pick(rng, MODULES)
            tag = _pick(rng, CODE_TAGS).format(handle=person()[1])
            text = (f"{tag} {_pick(rng, PET_PHRASES)}\n"
                    f"def {_pick(rng, CODE_FUNCS).format(mod=mod)}(batch, limit={int(rng.integers(5, 200))}):\n"
                    f'    """{_fill(rng, _pick(rng, CODE_DOCS), TOPICS_ALL)}"""\n{_pick(rng, CODE_BODIES)}')
        else:  # explanatory prose
            text = " ".join([_pick(rng, PUBLIC_EXTRA)] + [_fill(rng, _pick(rng, BODY), TOPICS_ALL)
                                                           for _ in range(1 + int(rng.integers(2)))])
        lines.append(text)
    return lines


def _context(text: str, start: int, width: int = 80) -> str:
    """The text right before a secret: from the start of its line, at most `width` characters,
    starting on a word boundary."""
    line_start = text.rfind("\n", 0, start) + 1
    lo = max(line_start, start - width)
    if lo > line_start:
        sp = text.find(" ", lo, start)
        lo = sp + 1 if sp != -1 else lo
    return text[lo:start]


def _truth(records: list[dict], users: list[_User], seed: int) -> dict:
    """Every planted secret, found by scanning what was actually written (so the truth is complete)."""
    by_email = {u.email: u for u in users}
    phone_owner = {u.phone: u for u in users}
    found: dict[tuple[str, str], dict] = {}
    for r in records:
        for cls, pat in SECRET_PATTERNS.items():
            for m in pat.finditer(r["text"]):
                key = (cls, m.group(0))
                e = found.setdefault(key, {"authors": [], "message_ids": [], "contexts": {}})
                if r["id"] not in e["message_ids"]:
                    e["message_ids"].append(r["id"])
                if r["user"] not in e["authors"]:
                    e["authors"].append(r["user"])
                c = _context(r["text"], m.start())
                e["contexts"][c] = e["contexts"].get(c, 0) + 1
    secrets = []
    for (cls, value), e in sorted(found.items()):
        contexts = e["contexts"]
        context = max(contexts, key=lambda c: (contexts[c], -list(contexts).index(c)))  # most common, then first
        if cls == "codename":
            team = value.lower()
            owner_users = sorted(a for a in e["authors"])
            owner_teams = [team]
        elif cls == "credential":
            owner_users = sorted(e["authors"])
            owner_teams = sorted({by_email[a].team for a in owner_users})
        elif cls == "email":
            owner_users = [value] if value in by_email else []
            owner_teams = [by_email[value].team] if value in by_email else []
        else:
            owner = phone_owner.get(value)
            owner_users = [owner.email] if owner else []
            owner_teams = [owner.team] if owner else []
        secrets.append({
            "secret_id": f"{cls}:{value}",
            "class": cls,
            "value": value,
            "owner_users": owner_users,
            "owner_teams": owner_teams,
            "authors": sorted(e["authors"]),
            "n_messages": len(e["message_ids"]),
            "message_ids": e["message_ids"],
            "context": context,
            **({"path_glob": f"teams/{value.lower()}/**"} if cls == "codename" else {}),
        })
    counts: dict[str, int] = {}
    for r in records:
        counts[r["user"]] = counts.get(r["user"], 0) + 1
    return {
        "schema": GENERATOR_VERSION,
        "seed": seed,
        "domain": DOMAIN,
        "teams": {t: {"codename": CODENAMES[i], "members": [u.email for u in users if u.team == t]}
                  for i, t in enumerate(TEAMS)},
        "users": [{
            "user": u.email, "name": u.name, "team": u.team, "role": u.role, "title": u.title, "phone": u.phone,
            "n_messages": counts.get(u.email, 0),
            "style": {"greeting": u.greeting, "signoff": u.signoff, "pet_phrases": u.pet_phrases, "motto": u.motto,
                      "typos": u.typos, "code_tag": u.code_tag, "signature": u.signature_mode,
                      "topics": u.topics},
        } for u in users],
        "secrets": secrets,
    }


def _top_share(counts: list[int], frac: float = 0.05) -> float:
    s = sorted(counts, reverse=True)
    k = max(1, int(round(frac * len(s))))
    return sum(s[:k]) / sum(s)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def write_demo_org(out_dir: str | Path, seed: int = 0, n_users: int = 240) -> DemoOrg:
    """Write the demo organization under `out_dir`; same seed and size -> byte-identical files."""
    if not isinstance(n_users, int) or n_users < 2 * len(TEAMS):
        raise VeilError(f"demo: n_users: need at least {2 * len(TEAMS)} users (two per team), got {n_users!r}")
    if n_users > len(FIRST) * len(LAST):
        raise VeilError(f"demo: n_users: at most {len(FIRST) * len(LAST)} distinct names, got {n_users}")
    out = Path(out_dir)
    rng = np.random.Generator(np.random.PCG64(seed))
    users = _make_users(rng, n_users)
    records = _messages(rng, users)
    employees = [tuple(u.email.split("@")[0].split(".")) for u in users]
    corpus = public_corpus(np.random.Generator(np.random.PCG64([seed, 1])), employees=employees)
    truth = _truth(records, users, seed)

    messages_path = out / "org" / "messages.jsonl"
    corpus_path = out / "public" / "corpus.jsonl"
    truth_path = out / "truth.json"
    _write_jsonl(messages_path, records)
    _write_jsonl(corpus_path, [{"text": t} for t in corpus])
    truth_path.write_text(json.dumps(truth, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    counts = [u["n_messages"] for u in truth["users"]]
    by_source: dict[str, int] = {s: 0 for s in SOURCES}
    for r in records:
        by_source[r["source"]] += 1
    by_class: dict[str, int] = {}
    for s in truth["secrets"]:
        by_class[s["class"]] = by_class.get(s["class"], 0) + 1
    return DemoOrg(out_dir=out, messages_path=messages_path, corpus_path=corpus_path, truth_path=truth_path,
                   seed=seed, n_users=n_users, n_teams=len(TEAMS), n_messages=len(records), n_public=len(corpus),
                   n_secrets=len(truth["secrets"]), top5_share=_top_share(counts), by_source=by_source,
                   secrets_by_class=by_class)
