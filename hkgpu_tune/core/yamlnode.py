"""Safe YAML for hand-written files: size, depth, alias, tag and character limits, and Node, a
view of the tree that names file:line and the key path in every error."""
from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Any

import yaml

from hkgpu_tune.core.errors import ProfileError


# limits on what is read: a profile is a small hand-written file
MAX_BYTES = 1 << 20      # file size
MAX_DEPTH = 32           # nesting of mappings and lists
MAX_NODES = 20000        # nodes, counting each alias as the whole subtree it repeats
MAX_SCALAR = 4096        # characters in one key or value
# the only tags a profile may carry (explicit or implied): no python objects, binary, dates, sets
TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map")}
# line breaks and control characters never reach a file the tool writes (tab is allowed: whitespace)
_BAD_CHAR = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


class _Loader(yaml.SafeLoader):
    """SafeLoader's composer with a depth limit (the composer recurses; deep nesting is refused
    with a line number instead of a RecursionError)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _tag_name(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def check_tree(root: yaml.Node, file: str) -> None:
    """Refuse what a profile never needs, before any section parser sees it: unknown tags,
    merge keys, control characters, oversized scalars, and aliases that expand too far.
    Each node is visited once (aliases are shared nodes), so this is linear in the file."""
    size: dict[int, int] = {}

    def err(node, path, msg):
        return ProfileError(f"{file}:{node.start_mark.line + 1}: {path or '(top)'}: {msg}")

    def walk(node, path) -> int:
        if id(node) in size:
            return size[id(node)]
        size[id(node)] = 0          # a node under construction (recursive anchors are refused by the composer)
        if node.tag not in TAGS:
            if node.tag == "tag:yaml.org,2002:merge":
                raise err(node, path, "merge keys ('<<') are not supported: write the keys out")
            if node.tag == "tag:yaml.org,2002:timestamp" and isinstance(node, yaml.ScalarNode):
                raise err(node, path, f"{node.value!r} reads as a date: quote it if it is meant as text")
            raise err(node, path, f"the tag {_tag_name(node.tag)} is not allowed in a profile "
                                  "(only strings, numbers, true/false, lists and mappings)")
        n = 1
        if isinstance(node, yaml.ScalarNode):
            if len(node.value) > MAX_SCALAR:
                raise err(node, path, f"a value longer than {MAX_SCALAR} characters")
            if node.tag == "tag:yaml.org,2002:int" and len(node.value) > 100:
                raise err(node, path, "an integer out of range (more than 64 bits)")
            bad = _BAD_CHAR.search(node.value)
            if bad:
                raise err(node, path, f"contains the control character {bad.group()!r} "
                                      "(line breaks and control characters are not allowed)")
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                n += walk(item, f"{path}[{i}]")
        else:
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else "?"
                child = f"{path}.{key}" if path else str(key)
                if isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:merge":
                    raise err(k, child, "merge keys ('<<') are not supported: write the keys out")
                n += walk(k, child) + walk(v, child)
        if n > MAX_NODES:
            raise err(node, path, f"more than {MAX_NODES} values once aliases are expanded "
                                  "(a profile is small; aliases that repeat whole trees are refused)")
        size[id(node)] = n
        return n

    walk(root, "")


_CONSTRUCTOR = yaml.SafeLoader("")


# ---------------------------------------------------------------- node walker
class Node:
    """A YAML node with its file, line and key path, and typed accessors that raise ProfileError."""

    def __init__(self, node: yaml.Node, file: str, path: str):
        self.node, self.file, self.path = node, file, path

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, msg: str) -> ProfileError:
        return ProfileError(f"{self.file}:{self.line}: {self.path or '(top)'}: {msg}")

    def _raw(self) -> str:
        return self.node.value if isinstance(self.node, yaml.ScalarNode) else f"a {self.kind()}"

    def kind(self) -> str:
        if isinstance(self.node, yaml.MappingNode):
            return "mapping"
        if isinstance(self.node, yaml.SequenceNode):
            return "list"
        return "scalar"

    def value(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"expected a single value, got a {self.kind()}")
        try:
            v = _CONSTRUCTOR.construct_object(self.node, deep=True)  # YAML's own typing rules
        except (ValueError, TypeError, OverflowError, yaml.YAMLError):
            raise self.error(f"not a valid value: {self._desc()}") from None
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
            raise self.error(f"an integer out of range (more than 64 bits): {self._desc()}")
        return v

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag.endswith(":null")

    # containers
    def mapping(self, allowed: dict | list | tuple | None = None, required=()) -> dict[str, "Node"]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"expected a mapping, got {self._desc()}")
        out: dict[str, Node] = {}
        for knode, vnode in self.node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise Node(knode, self.file, self.path).error("keys must be plain strings")
            key = str(knode.value)
            child = f"{self.path}.{key}" if self.path else key
            if key in out:
                raise Node(knode, self.file, child).error(
                    f"duplicate key (first at line {out[key].node.start_mark.line + 1})")
            if allowed is not None and key not in allowed:
                near = difflib.get_close_matches(key, list(allowed), n=1)
                hint = f"; did you mean '{near[0]}'?" if near else f"; expected one of: {', '.join(sorted(allowed))}"
                raise Node(knode, self.file, child).error(f"unknown key{hint}")
            out[key] = Node(vnode, self.file, child)
        for k in required:
            if k not in out:
                raise self.error(f"missing required key '{k}'")
        return out

    def items(self) -> list["Node"]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list, got {self._desc()}")
        return [Node(n, self.file, f"{self.path}[{i}]") for i, n in enumerate(self.node.value)]

    def _desc(self) -> str:
        if isinstance(self.node, yaml.ScalarNode):
            v = self.node.value
            return (repr(v) if len(v) <= 64 else repr(v[:60]) + "...") if v != "" else "nothing"
        return f"a {self.kind()}"

    # scalars
    def integer(self, lo: int | None = None, hi: int | None = None) -> int:
        v = self.value() if isinstance(self.node, yaml.ScalarNode) else None
        rng = f" {lo}-{hi}" if lo is not None and hi is not None else (f" >= {lo}" if lo is not None else "")
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"expected an integer{rng}, got {self._desc()}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.error(f"expected an integer{rng}, got {v}")
        return v

    def boolean(self) -> bool:
        v = self.value() if isinstance(self.node, yaml.ScalarNode) else None
        if not isinstance(v, bool):
            raise self.error(f"expected true or false, got {self._desc()}")
        return v

    def string(self, pattern: str | None = None, what: str = "a string") -> str:
        if not isinstance(self.node, yaml.ScalarNode) or self.is_null():
            raise self.error(f"expected {what}, got {self._desc()}")
        v = str(self.node.value)
        if pattern and not re.fullmatch(pattern, v):
            raise self.error(f"expected {what}, got {v!r}")
        return v

    def choice(self, options) -> str:
        v = self.string()
        if v not in options:
            near = difflib.get_close_matches(v, list(options), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise self.error(f"expected one of {', '.join(map(str, options))}, got {v!r}{hint}")
        return v

    def int_or_max(self, lo=1, hi=1 << 20) -> int | str:
        if isinstance(self.node, yaml.ScalarNode) and self.node.value == "max":
            return "max"
        try:
            return self.integer(lo, hi)
        except ProfileError:
            raise self.error(f"expected 'max' or an integer {lo}-{hi}, got {self._desc()}") from None

    def address(self) -> str:
        v = self.string(what="an IP address")
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise self.error(f"expected an IP address, got {v!r}") from None

    def network(self) -> str:
        v = self.string(what="an IP prefix such as 203.0.113.0/24")
        try:
            return str(ipaddress.ip_network(v, strict=True))
        except ValueError as e:
            raise self.error(f"expected an IP prefix such as 203.0.113.0/24, got {v!r} ({e})") from None


def load_yaml_doc(text: str, file: str):
    """Plain data (dicts, lists, scalars) from YAML text, with the same limits and refusals as a
    profile (size, depth, aliases, tags, control characters) but no section schema: for tools
    that merge into a profile before it is parsed as a whole."""
    if len(text) > MAX_BYTES:
        raise ProfileError(f"{file}: larger than {MAX_BYTES} bytes: not a profile")
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            check_tree(root, file)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ProfileError(f"{file}:{mark.line + 1 if mark else 0}: not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"{file}: not valid YAML: {e}") from None
