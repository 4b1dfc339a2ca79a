"""The one reader of the documents gpuguard is given: YAML and JSON files, bounded.

Every file gpuguard parses because someone named it comes through here: ``--config.file``,
``--trust.policy-file``, ``--web.config.file``, the ``--*.http-config-file`` client files,
the actuator's rules and actions files, gpusim's ``--profile`` and a workload's ``--trace``.
Whatever the file holds, reading it costs bounded time and memory and ends in a value or in
one ``ConfigError`` line naming the flag and the file (the CLI prints it and exits 2):

* **size**: a regular file of at most ``MAX_BYTES`` (or the caller's smaller limit), read
  through ``files.read_text`` (``/dev/zero`` or a FIFO is refused, never read);
* **encoding**: UTF-8 (YAML also refuses control characters);
* **depth**: at most ``MAX_DEPTH`` nested lists and mappings. PyYAML's composer and the json
  module recurse once per level; 20,000 ``[`` ran out of stack (a RecursionError traceback);
* **size after aliases**: at most ``MAX_NODES`` values, an alias counting as what it
  stands for, so ten aliases of ten aliases of ... (the "billion laughs") cannot turn a small
  file into a walk of billions;
* **duplicate keys**: refused at any level of a mapping, YAML or JSON (PyYAML and the json
  module keep the last value, so a second ``classes:`` or ``default:`` would silently win);
  a merge key's (``<<``) values may still be overridden by the mapping's own keys;
* **integers**: at most ``MAX_INT_DIGITS`` digits. PyYAML turns ``1:2:3:...`` (base 60)
  into an integer by multiplying in a loop, quadratic in its length: 160 kB took 5.9 s on
  the development machine, and a 1 MiB trust policy would have taken minutes. Python's
  ``int`` refuses 4,301 decimal digits, but not 4 MiB of hexadecimal.

The state files the actuator writes itself (journal, lease) are read with ``files`` and
``json`` directly: they are gpuguard's own, bounded by ``files.read_bytes``' limit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from gpuguard import files

#: A config, rules or actions file larger than this is not one (/dev/zero, a log by mistake).
MAX_BYTES = 4 << 20
#: Nested lists and mappings; gpuguard's own files go 7 deep at most (a rules file).
MAX_DEPTH = 64
#: Values in one document, aliases counted as what they stand for; the largest file gpuguard
#: ships (the alerting rules) has about 1,500.
MAX_NODES = 250_000
#: Digits of an integer (signed 64-bit integers have 19; no setting needs more than 18).
MAX_INT_DIGITS = 18
_INT_TEXT = 2 * MAX_INT_DIGITS  # ``0b``, ``0x``, ``_`` and ``:`` make the text longer


class ConfigError(ValueError):
    """A flag, or a file a flag names, is invalid; the message is one line naming the flag."""


class _Refused(Exception):
    """A limit crossed inside PyYAML's loader (carried out past its own error handling)."""


def read_text(path: os.PathLike[str] | str, flag: str, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``flag`` names, at most ``limit`` bytes."""
    try:
        return files.read_text(path, limit)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: not UTF-8 ({exc.reason})") from None


def read_yaml(path: os.PathLike[str] | str, flag: str, limit: int = MAX_BYTES) -> Any:
    """The YAML document in the file ``flag`` names; anything wrong is one ``ConfigError``."""
    return parse_yaml(read_text(path, flag, limit), f"{flag} {path}")


def read_json(path: os.PathLike[str] | str, flag: str, limit: int = MAX_BYTES) -> Any:
    """The JSON document in the file ``flag`` names; anything wrong is one ``ConfigError``."""
    return parse_json(read_text(path, flag, limit), f"{flag} {path}")


def parse_yaml(text: str, where: str) -> Any:
    """One YAML document within the limits; ``where`` starts the error line."""
    loader = None
    try:
        loader = _BoundedLoader(text)  # refuses control characters here
        return loader.get_single_data()
    except _Refused as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {_first_line(exc)}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept so a deep stack is one line
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    except ValueError as exc:  # a date out of range
        raise ConfigError(f"{where}: invalid YAML: {str(exc)[:80]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_json(text: str, where: str) -> Any:
    """One JSON document within the limits; ``where`` starts the error line."""
    try:
        doc = json.loads(
            text,
            parse_int=_json_int,
            parse_constant=_json_constant,
            object_pairs_hook=_json_object,
        )
    except _Refused as exc:
        raise ConfigError(f"{where}: invalid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid JSON: nested more than {MAX_DEPTH} deep") from None
    except ValueError as exc:  # JSONDecodeError
        raise ConfigError(f"{where}: invalid JSON: {_first_line(exc)}") from None
    try:
        _check_tree(doc)
    except _Refused as exc:
        raise ConfigError(f"{where}: invalid JSON: {exc}") from None
    return doc


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def _check_tree(doc: Any) -> None:
    """MAX_DEPTH and MAX_NODES over a parsed JSON document, without recursing."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values")
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} deep")
            stack.extend((child, depth + 1) for child in children)


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise _Refused(f"the key {key[:40]!r} is given twice in one object")
        doc[key] = value
    return doc


def _json_constant(name: str) -> float:
    raise _Refused(f"{name} is not a number JSON allows")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with gpuguard's limits on depth, size after aliases and
    integers; a limit crossed raises ``_Refused`` at once, before anything is built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[str, int] = {}  # anchor -> values it stands for

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            if anchor in self.anchors and anchor not in self._sizes:
                raise _Refused(f"the alias *{anchor} is inside what it names (a loop)")
            self._count(self._sizes.get(anchor, 1))
            return super().compose_node(parent, index)
        anchor = self.peek_event().anchor
        before = self._nodes
        self._count(1)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if anchor is not None:
            self._sizes[anchor] = self._nodes - before
        return node

    def _count(self, n: int) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values (aliases count as what they stand for)")

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML's own error says so below
                continue
            if twice:
                line = key_node.start_mark.line + 1
                raise _Refused(
                    f"the key {str(key)[:40]!r} is given twice in one mapping (line {line})"
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(str(node.value)) > _INT_TEXT:
            raise _Refused(f"an integer of more than {MAX_INT_DIGITS} digits")
        value: int = super().construct_yaml_int(node)
        if abs(value) >= 10**MAX_INT_DIGITS:
            raise _Refused(f"an integer of more than {MAX_INT_DIGITS} digits")
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
