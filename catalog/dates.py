"""Timestamps in the forms sources actually write, beyond what DuckDB's ISO-8601 cast reads.

DuckDB parses ISO-8601 (the fast path, vectorised). The few values it cannot read come here, one by
one: RFC 2822 / 5322 (mail headers, Debian changelog trailers: "Mon, 02 Jan 2023 13:06:21 +0100"),
ISO with a space and a numeric offset ("2006-01-02 15:04:05 -0700", git's default), compact ISO
("20060102T150405Z"), epoch milliseconds (13 digits), and month-name dates ("Jan 2, 2006",
"2 January 2006 15:04"). Numeric day/month orders ("02/01/2006") are ambiguous between the US and
everywhere else and stay a `bad timestamp` rather than a guess. Values without a zone are UTC.
"""
from __future__ import annotations

import email.utils
import re
from datetime import datetime, timezone

_FORMATS = (
    "%Y-%m-%d %H:%M:%S %z", "%Y-%m-%d %H:%M:%S.%f %z", "%Y-%m-%d %H:%M %z", "%Y-%m-%dT%H:%M:%S %z",
    "%Y%m%dT%H%M%SZ", "%Y%m%dT%H%M%S%z", "%Y%m%d%H%M%S",
    "%b %d, %Y", "%B %d, %Y", "%b %d, %Y %H:%M", "%B %d, %Y %H:%M", "%b %d, %Y %I:%M %p", "%B %d, %Y %I:%M %p",
    "%d %b %Y", "%d %B %Y", "%d %b %Y %H:%M", "%d %B %Y %H:%M", "%d %b %Y %H:%M:%S", "%d %B %Y %H:%M:%S",
    "%a %b %d %H:%M:%S %Y", "%a %b %d %H:%M:%S %Y %z",  # asctime (mbox separators, `git log` default)
    "%d-%b-%Y %H:%M:%S", "%d/%b/%Y:%H:%M:%S %z",        # Apache/nginx logs
)
_MILLIS = re.compile(r"^\d{12,13}(?:\.\d+)?$")


def parse_timestamp(value: str) -> str | None:
    """An ISO-8601 string with offset that DuckDB casts, or None when the value is no date we know."""
    v = " ".join(value.strip().split())
    if not v or len(v) > 80:
        return None
    if _MILLIS.match(v):
        return datetime.fromtimestamp(float(v) / 1000, timezone.utc).isoformat()
    if v[:1].isalpha() or re.match(r"^\d{1,2} [A-Za-z]{3} \d{4} \d", v):
        try:  # RFC 2822 first: the commonest non-ISO form (mail, changelogs)
            dt = email.utils.parsedate_to_datetime(v)
        except (TypeError, ValueError, IndexError):
            dt = None
        if dt is not None:
            return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).isoformat()
    for fmt in _FORMATS:
        try:
            dt = datetime.strptime(v, fmt)
        except ValueError:
            continue
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).isoformat()
    return None
