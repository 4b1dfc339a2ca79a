"""Kubernetes' label syntax (apimachinery's ``validation.IsQualifiedName`` and
``IsValidLabelValue``): what the API server accepts as a label key and value."""

from __future__ import annotations

import re

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NAME = 63
MAX_PREFIX = 253


def is_label_key(key: str) -> bool:
    """An optional DNS subdomain prefix and ``/``, then a name of at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    if slash and (key.count("/") > 1 or not prefix or len(prefix) > MAX_PREFIX
                  or not _DNS_SUBDOMAIN.fullmatch(prefix)):  # fmt: skip
        return False
    return 0 < len(name) <= MAX_NAME and bool(_NAME.fullmatch(name))


def is_label_value(value: str) -> bool:
    """Empty, or at most 63 letters, digits, ``-``, ``_`` and ``.``, alphanumeric at both ends."""
    return value == "" or (len(value) <= MAX_NAME and bool(_NAME.fullmatch(value)))
