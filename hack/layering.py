#!/usr/bin/env python3
"""Check that imports between the crate's top-level modules point one way: down.

Layers, lowest to highest:
    0 util, metrics   1 apis   2 scheduling   3 state   4 disruption
    5 controllers, cloudprovider (same layer; they may import each other)
    6 operator   7 tools (and src/main.rs)

Rule: code in src/<top>/... or src/<top>.rs may refer to crate::<x> only when x is in the
layer of <top> or a lower one. References are paths in `use` trees (grouped forms included),
inline paths such as `crate::operator::leader::error_chain(..)`, and `super::`/`self::`/
child-module paths resolved against the file's module path, so a `super::super::x` that
climbs out of a top-level module is caught. Comments and string literals are ignored;
src/lib.rs and src/main.rs are exempt. Hits in test code (a `#[cfg(test)]` module, inline or
in its own file, tests.rs, *_tests.rs) are listed apart as test-only and never fail the check.
Prints `file:line: <layer> imports <layer> (crate::path)`; exits 1 on any other violation.

--cycles also lists file-level import cycles inside each top-level module (informational).
Edges are non-test references between files of one top-level module, other than a module's
references to its own parent; names re-exported with `pub use` are followed to the defining
file, and `pub use` statements are not edges.
"""
import argparse
import os
import re
import sys

LAYERS = {"util": 0, "metrics": 0, "apis": 1, "scheduling": 2, "state": 3, "disruption": 4,
          "controllers": 5, "cloudprovider": 5, "operator": 6, "tools": 7}
NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|\bb?r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|\'(?:\\.|[^\\\'\n])\'', re.S)
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*([;{])")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")
USE = re.compile(r"\b(pub(?:\([\w:]+\))?\s+)?use\s+([^;]*);")
INLINE_PATH = re.compile(r"(?<![\w:$])\w+(?:::\w+)+")


def block(text, brace):
    """(start, end) offsets of the brace-delimited block opening at `brace`."""
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return brace, i
    return brace, len(text)


def use_paths(body, base):
    """Expand a use tree into paths of (segment, offset); an alias becomes an 'as x' segment."""
    toks = [(m.group(), base + m.start()) for m in re.finditer(r"::|[{},*]|\w+", body)] + [("", 0)]
    out = []

    def tree(i, path):
        while toks[i][0] not in ("", "{"):
            path = path + [toks[i]]
            if toks[i + 1][0] == "as":
                path, i = path + [("as " + toks[i + 2][0], toks[i + 2][1])], i + 2
            if toks[i + 1][0] != "::":
                out.append(path)
                return i + 1
            i += 2
        if toks[i][0] == "{":
            i += 1
            while toks[i][0] not in ("", "}"):
                i = tree(i, path)
                i += toks[i][0] == ","
            i += 1
        return i

    tree(0, [])
    return out


class File:
    def __init__(self, root, rel, mods):
        self.rel, self.mods = rel, mods
        self.mod = tuple(p for p in rel[4:-3].split("/") if p not in ("mod", "lib", "main"))
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        self.text = NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
        self.inline = [(m.group(1),) + block(self.text, m.end() - 1) for m in INLINE_MOD.finditer(self.text)]
        self.tests = [block(self.text, m.end() - 1) for m in TEST_MOD.finditer(self.text) if m.group(2) == "{"]
        self.test_file = rel.endswith("/tests.rs") or rel.endswith("_tests.rs")

    def line(self, off):
        return self.text.count("\n", 0, off) + 1

    def is_test(self, off):
        return self.test_file or any(a < off < b for a, b in self.tests)

    def resolve(self, segs):
        """Path from the crate root as (name, offset) pairs, or None for other crates and locals."""
        first, off = segs[0]
        here = self.mod + tuple(n for n, a, b in self.inline if a < off < b)
        if first == "crate":
            base, segs = [], segs[1:]
        elif first in ("self", "super") or here + (first,) in self.mods:
            base = [(m, off) for m in here]
            while segs and segs[0][0] in ("self", "super"):
                base, segs = base[:-1] if segs[0][0] == "super" else base, segs[1:]
        else:
            return None
        path = base + [s for s in segs if not s[0].startswith("as ")]
        return (path[:-1] if path and path[-1][0] == "self" else path) or None

    def refs(self):
        """Yield (path, offset, is_pub_use, alias) for every reference into this crate."""
        spans = []
        for m in USE.finditer(self.text):
            spans.append(m.span())
            for segs in use_paths(m.group(2), m.start(2)):
                alias = [s[3:] for s, _ in segs if s.startswith("as ")]
                if (path := self.resolve(segs)):
                    yield path, segs[-1][1], bool(m.group(1)), (alias or [path[-1][0]])[0]
        for m in INLINE_PATH.finditer(self.text):
            if not any(a <= m.start() < b for a, b in spans):
                names = m.group().split("::")
                offs = [m.start() + len("::".join(names[:i])) + 2 * (i > 0) for i in range(len(names))]
                if (path := self.resolve(list(zip(names, offs)))):
                    yield path, m.start(), False, None


def cycles(files, mods):
    """Print the cycles (strongly connected components) of the file graph, with their edges."""
    reexports = {f.mod + (alias,): tuple(n for n, _ in path)
                 for f in files for path, _, pub, alias in f.refs() if pub and alias != "*"}
    edges = {}
    for f in files:
        for path, off, pub, _ in f.refs():
            names = tuple(n for n, _ in path)
            for _ in range(5):  # follow re-exports to the defining file
                k = max(k for k in range(len(names) + 1) if names[:k] in mods)
                if reexports.get(names[:k + 1], names[:k + 1]) == names[:k + 1]:
                    break
                names = reexports[names[:k + 1]] + names[k + 1:]
            g = mods[names[:k]]
            # A module's use of its own parent (the module that declares it and shares its types
            # with it) is how Rust nests modules, not a cycle.
            parent = g.mod == f.mod[:-1]
            if g is not f and g.mod[:1] == f.mod[:1] and not parent and not pub and not f.is_test(off):
                edges.setdefault(f.rel, {}).setdefault(g.rel, []).append(f"{f.rel}:{f.line(off)} {'::'.join(names)}")
    reach = {}

    def visit(v, seen):
        for w in edges.get(v, {}):
            if w not in seen:
                seen.add(w)
                visit(w, seen)

    for v in edges:
        visit(v, reach.setdefault(v, set()))
    comps = sorted({tuple(sorted(w for w in reach[v] if v in reach.get(w, ()))) for v in edges if v in reach[v]})
    print(f"\ncycles: {len(comps)}")
    for comp in comps:
        print("  " + " <-> ".join(comp))
        for a in comp:
            for b, refs in sorted(edges.get(a, {}).items()):
                if b in comp:
                    print(f"    {a} -> {b}: {refs[0]}" + (f" (+{len(refs) - 1} more)" if len(refs) > 1 else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", action="store_true", help="also list file-level import cycles")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    mods = {}
    files = [File(args.root, os.path.relpath(os.path.join(d, n), args.root).replace(os.sep, "/"), mods)
             for d, _, names in os.walk(os.path.join(args.root, "src")) for n in sorted(names) if n.endswith(".rs")]
    mods.update((f.mod, f) for f in sorted(files, key=lambda f: f.rel == "src/lib.rs"))
    declared = {f.mod + (m.group(1),) for f in files for m in TEST_MOD.finditer(f.text) if m.group(2) == ";"}
    for f in files:
        f.test_file = f.test_file or any(f.mod[:len(t)] == t for t in declared)
    hits = {}
    for f in files:
        src = f.mod[0] if f.mod and f.rel != "src/main.rs" else None
        for path, _, _, _ in f.refs() if src in LAYERS else ():
            dst, off = path[0]
            if LAYERS.get(dst, -1) > LAYERS[src]:
                shown = "crate::" + "::".join(n for n, _ in path)
                hits[(f.is_test(off), f.rel, f.line(off), shown)] = \
                    f"{f.rel}:{f.line(off)}: {src}({LAYERS[src]}) imports {dst}({LAYERS[dst]}) ({shown})"
    for test in (False, True):
        found = [msg for key, msg in sorted(hits.items()) if key[0] == test]
        print(("\ntest-only:\n" if test and found else "") + "\n".join(found), end="\n" if found else "")
    if args.cycles:
        cycles(files, mods)
    return 1 if any(not test for test, *_ in hits) else 0


if __name__ == "__main__":
    sys.exit(main())
