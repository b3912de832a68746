#!/usr/bin/env python3
"""Fail when the crate's top-level modules import each other in a circle.

The rooms of `src/` (ARCHITECTURE.md's code map) are layered: each may use the rooms below it and
none above. This reads every `crate::ROOM` path in each file of `src/` (in `use` lines and inline
paths alike, comments and strings aside), builds the graph of rooms, and prints every cycle it
finds (exit 1) or the rooms in a valid order (exit 0). A standard-library script, so CI's first
stage can run it before anything is built.

A second rule keeps the store's two backends apart (issue #23): no file under `src/store/sqlite/`
names `store::postgres`, and none under `src/store/postgres/` names `store::sqlite` (nor reaches
the other through `super::super::`); what both need lives in the neutral `store` files.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `use crate::{a, b::c}` groups
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def room_of(rel):
    """The top-level module a file belongs to (`lib.rs`/`main.rs` are the `tally` crate's roots,
    `base.rs` the `tally-base` crate's; the compiler keeps that crate's rooms from naming any
    room of `tally`, and `tally` re-exports them, so one graph covers both)."""
    first = rel.split(os.sep)[0]
    if first in ("lib.rs", "main.rs", "base.rs"):
        return None
    return first[:-3] if first.endswith(".rs") else first


def code_only(text):
    """The text with comments, string literals and char literals blanked out (a small lexer:
    nested block comments, escapes, raw strings `r#"…"#`, and `'x'` told apart from lifetimes)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and \
                re.match(r'r#*"', text[i:i + 40]):
            hashes = len(re.match(r'r(#*)"', text[i:]).group(1))
            end = text.find('"' + "#" * hashes, i + 2 + hashes)
            i = n if end < 0 else end + 1 + hashes
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]).group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def graph():
    edges = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            room = room_of(rel)
            if room is None:
                continue
            with open(path, encoding="utf-8") as fh:
                code = code_only(fh.read())
            targets = set(PATH.findall(code))
            for group in GROUP.findall(code):
                for item in group.split(","):
                    name = item.strip().split("::")[0].strip()
                    if name:
                        targets.add(name)
            for t in targets:
                if t != room and t not in ("self",):
                    edges.setdefault(room, {}).setdefault(t, set()).add(rel)
            edges.setdefault(room, {})
    return edges


# Backend folder -> the other backend's module name it must never name.
BACKENDS = {os.path.join("store", "sqlite"): "postgres", os.path.join("store", "postgres"): "sqlite"}


def backend_crossings(files):
    """(file, other backend) for each file of one backend folder naming the other backend.

    `files` maps a path relative to `src/` to its code (comments and strings removed)."""
    out = []
    for rel, code in sorted(files.items()):
        for folder, other in BACKENDS.items():
            if rel.startswith(folder + os.sep):
                if re.search(r"\b(?:store|super::super)::%s\b" % other, code):
                    out.append((rel, other))
    return out


def store_files():
    files = {}
    for folder in BACKENDS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for f in names:
                if f.endswith(".rs"):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding="utf-8") as fh:
                        files[os.path.relpath(path, ROOT)] = code_only(fh.read())
    return files


def cycles(edges):
    """Strongly connected components with more than one room (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def self_test():
    """The detector itself: a circle of three rooms is found, a layered graph is not."""
    circle = {"a": {"b": {"a.rs"}}, "b": {"c": {"b.rs"}}, "c": {"a": {"c.rs"}}, "d": {"a": {"d.rs"}}}
    layered = {"a": {"b": {"a.rs"}}, "b": {"c": {"b.rs"}}, "c": {}, "d": {"a": {"d.rs"}}}
    assert cycles(circle) == [["a", "b", "c"]], cycles(circle)
    assert cycles(layered) == [], cycles(layered)
    code = code_only("let q = '\"'; // crate::x\nlet s = \"crate::y\"; crate::z::f(); let r = r#\"crate::w\"#;")
    assert PATH.findall(code) == ["z"], PATH.findall(code)
    sq, pg = os.path.join("store", "sqlite", "x.rs"), os.path.join("store", "postgres", "y.rs")
    crossing = {sq: "use crate::store::postgres::PgStore;", pg: "use crate::store::sqlite::tx::SqliteTx;"}
    apart = {sq: "use crate::store::StoreError;", pg: "use postgres::Client; use crate::store::tx::Tx;"}
    assert backend_crossings(crossing) == [(pg, "sqlite"), (sq, "postgres")], backend_crossings(crossing)
    assert backend_crossings(apart) == [], backend_crossings(apart)


def main():
    self_test()
    crossings = backend_crossings(store_files())
    for rel, other in crossings:
        print("store backends: %s names store::%s (the backend folders never import each other)" % (rel, other))
    edges = graph()
    found = cycles(edges)
    if not found:
        print("module cycles: none among %d rooms" % len(edges))
        return 1 if crossings else 0
    for comp in found:
        print("module cycle among: " + ", ".join(comp))
        for a in comp:
            for b in comp:
                if b in edges.get(a, {}):
                    files = sorted(edges[a][b])
                    print("  %s -> %s  (%s)" % (a, b, ", ".join(files[:4]) + (" …" if len(files) > 4 else "")))
    return 1


if __name__ == "__main__":
    sys.exit(main())
