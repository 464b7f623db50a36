"""Structured logs: one JSON object a line, with the session and its policy version on every line.

    configure_logging("json")          # `tether gateway --log-format json`
    log_context.set(session)           # the Bridge servicer, in each session's task

A line logged inside a session's task carries `session`, `policy` and `policy_version` (read when
the line is formatted, so a version switch shows at once); other lines carry them as null. Strings
from clients are JSON-escaped (no control characters reach the log) and cut at `MAX_FIELD` chars.

    >>> import logging
    >>> record = logging.LogRecord("tether.gateway", logging.INFO, __file__, 1, "step %d\\n", (3,), None)
    >>> line = JsonFormatter().format(record)
    >>> import json; d = json.loads(line); d["msg"], d["session"], d["level"]
    ('step 3\\n', None, 'INFO')
"""

from __future__ import annotations

import contextvars
import json
import logging
import time

log_context: contextvars.ContextVar = contextvars.ContextVar("tether_session", default=None)
MAX_FIELD = 4096


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        session = log_context.get()
        policy = getattr(session, "policy", None)
        out = {
            "t": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": _cut(record.getMessage()),
            "session": getattr(session, "id", None),
            "policy": getattr(policy, "name", None),
            "policy_version": getattr(policy, "version", None),
        }
        if record.exc_info:
            out["exc"] = _cut(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=True)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[:MAX_FIELD] + f"...[{len(text) - MAX_FIELD} more]"


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """The root logger's handler: "text" (the gateway's usual lines) or "json"."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
