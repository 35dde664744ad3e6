"""What a job's name and its ``profileKey`` may be, and the key a name implies (pure).

A job's name names its headless Service, is every worker pod's subdomain and prefixes its pod
names, so it must be a DNS-1035 label short enough for ``<name>-g<group>-m<k>``; the CRD's CEL
rules check the same at admission.  Raises :class:`~hetero_operator.api.errors.SpecError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.fields import string

_PROFILE_KEY_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,251}[a-z0-9])?$")
_GENERATED_SUFFIX_RE = re.compile(r"^(?=.*[0-9])[bcdfghjklmnpqrstvwxz2456789]{5}$")
"""Kubernetes ``generateName`` appends 5 characters of this alphabet (apimachinery's
``utilrand.String``: consonants and digits without vowels, 0, 1, 3)."""
_DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""apimachinery's DNS-1035 label: a Service name (``<job>``) and a pod's subdomain (shared/cases/44)."""
MAX_NAME_LENGTH = 50
"""Longest job name: pods ``<name>-g<group>-m<k>`` and hostnames must stay DNS labels (63)."""


def job_name(meta: Mapping[str, Any]) -> str:
    """``metadata.name``, refused unless it can name the job's Service, pods and hostnames.

    Raises:
        SpecError: not a DNS-1035 label of at most :data:`MAX_NAME_LENGTH` characters (the CRD's
            CEL rules say the same at admission), with a name that would do.
    """
    name = string(meta, "name", "metadata.name")
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError("metadata.name", f"must be at most {MAX_NAME_LENGTH} characters (pod names "
                        f"<name>-g<group> must stay DNS labels), got {len(name)}")
    if not _DNS_1035_RE.match(name):
        raise SpecError("metadata.name", f"{name!r} is not a DNS-1035 label: lower-case letters, "
                        "digits and '-', starting with a letter and ending with a letter or digit "
                        "(it names the job's headless Service and is every worker pod's "
                        f"subdomain); e.g. {dns_1035_name(name)!r}")
    return name


def dns_1035_name(name: str) -> str:
    """A DNS-1035 label close to ``name``: lower case, every other character ``-``, a ``job-``
    prefix before a leading digit (``llama-3.1-8b`` -> ``llama-3-1-8b``, ``7b-sft`` ->
    ``job-7b-sft``)."""
    text = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-") or "job"
    if not text[0].isalpha():
        text = f"job-{text}"
    return text[:MAX_NAME_LENGTH].rstrip("-")


def parse_profile_key(t: Mapping[str, Any], path: str) -> str:
    """``spec.training.profileKey``: ``""`` when absent.

    Raises:
        SpecError: not 1-253 characters of a-z, 0-9, ``-``, ``.``, ``_`` that start and end with a
            letter or digit.
    """
    value = t.get("profileKey")
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _PROFILE_KEY_RE.match(value):
        raise SpecError(path, "must be 1-253 characters of a-z, 0-9, '-', '.', '_' starting and "
                        f"ending with a letter or digit, got {value!r}")
    return value


def default_profile_key(job_name: str) -> str:
    """The job name without run suffixes: trailing ``-<digits>`` segments and a trailing
    five-character ``generateName`` suffix that contains a digit are removed
    (``digits-2`` -> ``digits``, ``lm-x7k2q`` -> ``lm``, ``lm-20261201-3`` -> ``lm``).

    Returns:
        The key; the name itself when nothing is left after stripping.
    """
    parts = job_name.split("-")
    while len(parts) > 1 and (parts[-1].isdigit() or _GENERATED_SUFFIX_RE.match(parts[-1])):
        parts.pop()
    return "-".join(parts) or job_name
