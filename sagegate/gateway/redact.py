"""What the gateway may show of a value that can carry a secret: a URL's userinfo (``user:pass@``)
becomes ``***@`` wherever a URL is shown (admin routes, the dashboard, logs, metric labels) or names
a backend to other replicas (Redis keys); requests still go to the URL as configured."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"


def redact_url(url: str) -> str:
    """``url`` without its credentials (unchanged when it has none; a URL that does not parse is
    hidden whole after its scheme, rather than shown)."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{HIDDEN}@{host}"))
    except ValueError:
        return url.split("://", 1)[0] + "://" + HIDDEN


class RedactUrls(logging.Filter):
    """Hides the credentials of any URL among a log record's arguments (httpx logs each request's
    URL at INFO and DEBUG, userinfo included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any("://" in str(a) and "@" in str(a) for a in args):
            record.args = tuple(redact_url(str(a)) if "://" in str(a) and "@" in str(a) else a for a in args)
        return True


_FILTER = RedactUrls()


def redact_client_logs() -> None:
    """Put :class:`RedactUrls` on the HTTP client's loggers (once per process)."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
