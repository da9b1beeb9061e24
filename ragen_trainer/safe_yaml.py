"""YAML from users, read with bounds: the one loader for configs, ``--set`` values and every other YAML ragen reads.

``yaml.safe_load`` constructs no Python objects beyond plain data, but it is not bounded: a few hundred bytes of
nested aliases (a "billion laughs") describe a value of billions of items, which the first ``repr`` or walk of it
(an error message, a config dump) tries to build, and YAML nested some thousands of levels deep ends in a
``RecursionError`` inside the composer. :func:`load_yaml` refuses both with a ``ValueError`` that says what was wrong
and what is accepted, before any value is built:

* nesting deeper than :data:`MAX_DEPTH` levels;
* a document whose values, counted with every alias expanded, number more than :data:`MAX_NODES` (a config has
  some hundreds; aliases themselves are fine while their expansion stays under the bound);
* text longer than :data:`MAX_BYTES` (:func:`load_yaml_file`, which also refuses what is not a regular file).

It also refuses a mapping that names one key twice (``yaml.safe_load`` keeps the last silently, so a config that sets
``actor_lr`` at line 3 and again at line 7 would train with the second value and nobody would know): the error names
the key and both lines. Keys brought in by a merge (``<<: *base``) may be overridden, as YAML intends.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from ragen_trainer.fileio import read_text_bounded

#: Deepest nesting of sequences and mappings accepted.
MAX_DEPTH = 64
#: Most values (scalars, sequences, mappings) a document may hold once every alias is expanded.
MAX_NODES = 10_000
#: Largest YAML file read.
MAX_BYTES = 1 << 20


class _Bounded(ValueError):
    pass


class _DuplicateKey(ValueError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose composer counts its nesting (the composer recurses once per level)."""

    def __init__(self, stream: str, max_depth: int) -> None:
        super().__init__(stream)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                mark = self.peek_event().start_mark
                raise _Bounded(f"nested deeper than {self._max_depth} levels (at line {mark.line + 1}); at most "
                               f"{self._max_depth} levels of lists and mappings are accepted")  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Checked on the mapping's own keys, before SafeConstructor flattens merges (``<<``) into it: a key given
        # beside a merge overrides the merged one on purpose, while the same key written twice is a mistake.
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, str] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeConstructor refuses it with its own message
                    continue
                mark = key_node.start_mark
                where = f"line {mark.line + 1}"
                if first is not None:
                    if first.startswith(f"{where},"):  # both on one line (a flow mapping): the columns tell them apart
                        where = f"{where}, column {mark.column + 1}"
                    else:
                        first = first.split(",")[0]
                    shown = repr(key) if len(repr(key)) <= 80 else repr(key)[:77] + "..."
                    raise _DuplicateKey(f"invalid YAML: duplicate key {shown} at {where} (first at {first}); each "
                                        "key may appear once in a mapping")  # fmt: skip
                seen[key] = f"{where}, column {mark.column + 1}"
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """How many values ``node`` stands for with every alias expanded (an alias is the same node object again), or
    ``limit + 1`` as soon as it is known to be more than ``limit``; each distinct node is counted once (memoised), so
    this is fast even for exponential expansions. Depth is bounded by the loader, so the recursion is too."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        known = sizes.get(id(n))
        if known is not None:
            return known
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children: list[yaml.Node] = list(n.value)
        elif isinstance(n, yaml.MappingNode):
            children = [part for pair in n.value for part in pair]
        else:
            children = []
        for child in children:
            total = min(total + size(child), limit + 1)
        sizes[id(n)] = total
        return total

    return size(node)


def load_yaml(text: str, what: str = "YAML", *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """Parse one YAML document safely (plain data only) within the bounds of the module docstring.

    ``ValueError`` naming ``what`` for text that is not valid YAML, nests deeper than ``max_depth``, expands to
    more than ``max_nodes`` values or names a key twice in one mapping. An empty document is ``None``."""
    loader = _BoundedLoader(text, max_depth)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, max_nodes) > max_nodes:
            raise _Bounded(f"expands to more than {max_nodes:,} values once its aliases (*name) are expanded; at most "
                           f"{max_nodes:,} are accepted (a YAML alias bomb?)")  # fmt: skip
        return loader.construct_document(node)
    except (_Bounded, _DuplicateKey) as exc:
        raise ValueError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what}: not valid YAML ({exc})") from None
    except RecursionError:  # a guard: the depth bound should have stopped it first
        raise ValueError(f"{what}: nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | os.PathLike[str], what: str = "YAML file", *, max_bytes: int = MAX_BYTES) -> Any:
    """:func:`load_yaml` of a file that must be a regular file of at most ``max_bytes`` of UTF-8 text.

    ``FileNotFoundError`` when it is missing, ``OSError`` when it cannot be read, ``ValueError`` naming ``what`` and
    the file for everything else (not a regular file, too large, not UTF-8, not valid YAML, beyond the bounds)."""
    label = f"{what} {str(path)!r}"
    try:
        text = read_text_bounded(path, max_bytes, what)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return load_yaml(text, label)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "load_yaml", "load_yaml_file"]
