"""Reading the files a user names (scenarios, sweeps, profiles, traces): bounded, strictly decoded,
parsed with a nesting limit; every failure one :class:`~sim.errors.ConfigError` line.

* :func:`read_bytes` / :func:`read_text`: a regular file (not a directory, FIFO or device) of at
  most :data:`~sim.limits.MAX_TEXT_BYTES`; text must be UTF-8 (a UTF-16/32 byte-order mark or
  NUL bytes are named as such, and a stray byte by its offset).
* :func:`load_yaml`: YAML nested at most :data:`~sim.limits.MAX_NESTING` levels, checked on the
  raw text before PyYAML sees it (PyYAML's scanner is quadratic in flow nesting: 20,000 levels
  took two minutes, and its composer recurses once per level), and holding at most
  :data:`~sim.limits.MAX_YAML_VALUES` values once its aliases are expanded (a 340-byte
  "billion laughs" holds 387 million). Aliases themselves are fine. A key given twice in one
  mapping is an error naming it and its lines (PyYAML would keep the last one silently).
* :func:`load_json`: JSON nested at most :data:`~sim.limits.MAX_NESTING` levels; ``NaN`` and
  ``Infinity`` parse (the format validators name where they are).
"""

from __future__ import annotations

import codecs
import json
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.errors import ConfigError
from sim.limits import MAX_NESTING, MAX_TEXT_BYTES, MAX_YAML_VALUES


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def is_file(path: str | Path) -> bool:
    """``Path.is_file`` that is false, not an error, for names too long or otherwise unusable."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def candidate_paths(path: str | Path, base_dir: str | Path) -> list[Path]:
    """Where a file a scenario names is looked for, in order: as given when absolute, else in the
    scenario file's folder (``base_dir``), in ``scenarios/`` (shipped files), in the working directory."""
    from sim.package_data import SCENARIO_DIR

    p = Path(path)
    return [p] if p.is_absolute() else [Path(base_dir) / p, SCENARIO_DIR / p, Path.cwd() / p]


def check_file(path: str | Path, key: str, what: str) -> Path:
    """``path`` if it is an existing regular file, else a :class:`ConfigError` saying what it is."""
    p = Path(path)
    try:
        st = p.stat()
    except ValueError:  # an embedded NUL byte
        raise ConfigError(key, str(path), f"an existing {what}") from None
    except OSError as exc:
        raise ConfigError(key, str(path), f"an existing {what} ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(key, str(path), f"a {what}, not a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, str(path), f"a regular {what} (not a FIFO, socket or device)")
    return p


def read_bytes(path: str | Path, key: str, what: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``."""
    p = check_file(path, key, what)
    try:
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(key, str(path), f"a readable {what} ({exc.strerror or type(exc).__name__})") from None
    if len(data) > max_bytes:
        raise ConfigError(key, str(path), f"a {what} of at most {_mib(max_bytes)}")
    return data


_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def decode(data: bytes, source: str, key: str, what: str) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is dropped)."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise ConfigError(key, source, f"a UTF-8 {what} (this one is {name}: save it as UTF-8)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(key, source, f"a UTF-8 {what} (this one holds binary data: byte 0x00 at offset {nul})")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            key, source, f"a UTF-8 {what} (byte 0x{data[exc.start]:02x} on line {line} is not UTF-8)"
        ) from None


def read_text(path: str | Path, key: str, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A UTF-8 text file of at most ``max_bytes`` (see :func:`read_bytes`, :func:`decode`)."""
    return decode(read_bytes(path, key, what, max_bytes), str(path), key, what)


# --- nesting ------------------------------------------------------------------------------------

_DASHES = re.compile(r"(?:-\s+)*")
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|#[^\n]*")
_DEPTH = np.zeros(256, dtype=np.int8)
_DEPTH[[ord("["), ord("{")]] = 1
_DEPTH[[ord("]"), ord("}")]] = -1


def bracket_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of ``text`` outside quoted strings and comments (an upper bound
    on a YAML flow collection's or a JSON document's nesting)."""
    bare = _QUOTED.sub("", text).encode("utf-8", "replace")
    if not bare:
        return 0
    steps = _DEPTH[np.frombuffer(bare, dtype=np.uint8)].astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


#: Bytes :func:`json_depth` scans at a time: its temporaries take ~20 bytes per byte scanned, so a
#: large file (a benchmark result of hundreds of MB) is scanned in pieces.
DEPTH_CHUNK_BYTES = 1 << 22


def json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of JSON text outside strings, vectorised (a profile is ~400 kB)
    and scanned in pieces of :data:`DEPTH_CHUNK_BYTES` bytes. A quote preceded by a backslash counts as
    escaped."""
    b = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    deepest = depth = quotes = 0
    for start in range(0, b.size, DEPTH_CHUNK_BYTES):
        seg = b[start : start + DEPTH_CHUNK_BYTES]
        quote = seg == ord('"')
        quote[1:] &= seg[:-1] != ord("\\")
        if start and b[start - 1] == ord("\\"):
            quote[0] = False
        outside = ((quotes + np.cumsum(quote, dtype=np.int64)) % 2 == 0) & ~quote
        levels = depth + np.cumsum(_DEPTH[seg].astype(np.int32) * outside, dtype=np.int64)
        deepest = max(deepest, int(levels.max(initial=0)))
        depth = int(levels[-1])
        quotes += int(quote.sum())
    return deepest


def check_json_depth(text: str, key: str, source: str) -> None:
    """:class:`ConfigError` when JSON ``text`` nests deeper than :data:`MAX_NESTING` (checked on the
    text: Python's parser would raise ``RecursionError``, and no walk over a large document)."""
    if json_depth(text) > MAX_NESTING:
        raise _too_deep(key, source, "JSON")


def _block_depth(text: str) -> int:
    """Levels of indentation (and ``- `` entries) of YAML's block style, line by line."""
    stack: list[int] = []
    deepest = 0
    for line in text.splitlines():
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(body)
        while stack and stack[-1] >= indent:
            stack.pop()
        stack.append(indent)
        lead = _DASHES.match(body)
        dashes = lead.group(0).count("-") if lead else 0
        deepest = max(deepest, len(stack) + dashes)
    return deepest


def _too_deep(key: str, source: str, kind: str) -> ConfigError:
    return ConfigError(key, source, f"{kind} with a nesting of at most {MAX_NESTING} levels")


def check_nesting(value: Any, key: str, source: str, kind: str = "a document") -> None:
    """:class:`ConfigError` when ``value`` (parsed data) nests deeper than :data:`MAX_NESTING`."""
    todo = [(value, 0)]
    seen: dict[int, int] = {}  # a node shared through aliases is walked again only from deeper down
    while todo:
        node, depth = todo.pop()
        if isinstance(node, (dict, list)):
            if depth >= MAX_NESTING:
                raise _too_deep(key, source, kind)
            if seen.get(id(node), -1) >= depth:
                continue
            seen[id(node)] = depth
            todo.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))


def _expanded_values(node: Any, memo: dict[int, int], key: str, source: str) -> int:
    """Values in ``node`` with every alias expanded (shared nodes counted once per use)."""
    if not isinstance(node, (dict, list)):
        return 1
    hit = memo.get(id(node))
    if hit is not None:
        if hit < 0:
            raise ConfigError(key, source, "YAML without recursive aliases (an alias inside the node it names)")
        return hit
    memo[id(node)] = -1
    children = list(node.items()) if isinstance(node, dict) else node
    total = 1
    for child in children:
        if isinstance(child, tuple):  # a mapping entry: key and value
            total += _expanded_values(child[0], memo, key, source) + _expanded_values(child[1], memo, key, source)
        else:
            total += _expanded_values(child, memo, key, source)
        if total > MAX_YAML_VALUES:
            break
    memo[id(node)] = total
    return total


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _key_path(path: tuple) -> str:
    """``workload.num_requests``, ``zip[0].seed``: where a key sits in a document."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _duplicate_key(loader: yaml.SafeLoader, root: yaml.Node) -> tuple[str, int, int] | None:
    """The first key given twice in one mapping of a composed document (in document order): its
    path and the lines of its two occurrences. PyYAML keeps the last one silently, so a scenario
    that sets ``num_requests`` twice would run the value its reader did not see first."""
    todo: list[tuple[yaml.Node, tuple]] = [(root, ())]
    visited: set[int] = set()  # an aliased node is checked once, wherever it is used
    while todo:
        node, path = todo.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        children: list[tuple[yaml.Node, tuple]] = []
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key: Any = key_node.tag
                # Merge keys (<<) bring keys a mapping may override; complex keys are rare enough
                # that PyYAML's own handling of them stands.
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    # Compared as constructed, as the dict compares them (1 and 1.0 are one key).
                    key = loader.construct_object(key_node)
                    line = key_node.start_mark.line + 1
                    if key in lines:
                        return _key_path((*path, key)), lines[key], line
                    lines[key] = line
                children.append((value_node, (*path, key)))
        elif isinstance(node, yaml.SequenceNode):
            children = [(v, (*path, i)) for i, v in enumerate(node.value)]
        todo.extend(reversed(children))
    return None


def _safe_load(text: str, key: str, source: str) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (ConfigError)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        dup = _duplicate_key(loader, node)
        if dup is not None:
            where, first, second = dup
            lines = f" on line {first}" if first == second else f", on lines {first} and {second}"
            raise ConfigError(
                key, source, f"YAML with each key at most once per mapping ({where} is given twice{lines})"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


_RAISE = object()


def load_yaml(text: str, key: str, source: str, syntax_error: Any = _RAISE) -> Any:
    """``yaml.safe_load(text)`` within the nesting and expansion limits, with each key at most once
    per mapping (module docstring). Text that is not valid YAML raises, or returns ``syntax_error``
    when one is given; a duplicated key always raises."""
    if bracket_depth(text) + _block_depth(text) > MAX_NESTING:
        raise _too_deep(key, source, "YAML")
    try:
        data = _safe_load(text, key, source)
    except yaml.YAMLError as exc:
        if syntax_error is not _RAISE:
            return syntax_error
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(key, source, f"valid YAML ({first}{where})") from None
    except RecursionError:
        raise _too_deep(key, source, "YAML") from None
    except ConfigError:
        raise  # a key given twice, said as such
    except ValueError as exc:
        raise number_error(key, source, exc) from None
    check_nesting(data, key, source, "YAML")
    if _expanded_values(data, {}, key, source) > MAX_YAML_VALUES:
        raise ConfigError(
            key, source, f"YAML of at most {MAX_YAML_VALUES:,} values once its aliases (*name) are expanded"
        )
    return data


def load_json(text: str, key: str, source: str, *, unique_keys: bool = False) -> Any:
    """``json.loads(text)`` nested at most :data:`MAX_NESTING` levels; errors name line and column.
    ``unique_keys``: a key given twice in one object is an error (``json`` keeps the last one
    silently), as it is in a scenario's YAML (:func:`load_yaml`), for a file people edit by hand."""
    check_json_depth(text, key, source)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ConfigError(key, source, f"JSON with each key at most once per object ({k!r} is given twice)")
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=unique if unique_keys else None)
    except json.JSONDecodeError as exc:
        raise ConfigError(key, source, f"valid JSON ({exc.msg}; line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise _too_deep(key, source, "JSON") from None
    except ConfigError:
        raise  # a key given twice, said as such
    except ValueError as exc:
        raise number_error(key, source, exc) from None


def number_error(key: str, source: str, exc: ValueError) -> ConfigError:
    """A parser's ValueError on untrusted text as one line. Python refuses to read an integer of
    more than ``sys.get_int_max_str_digits()`` digits (a guard against quadratic conversion), and
    neither PyYAML nor ``json`` makes that a syntax error: said as the input's limit."""
    import sys

    if isinstance(exc, ConfigError):
        return exc
    if "integer string conversion" in str(exc):
        return ConfigError(key, source, f"numbers of at most {sys.get_int_max_str_digits():,} digits")
    return ConfigError(key, source, f"a readable document ({type(exc).__name__}: {str(exc)[:200]})")
