#!/usr/bin/env python3
"""Fails (exit 1) when the top-level modules of a crate refer to each other
in a cycle: the rule that no module uses another that uses it back, so
that each can be read, tested and changed from the bottom up.

    python3 scripts/modcycles.py [CRATES_DIR]     (default: crates)
    python3 scripts/modcycles.py --self-test

For each crate under CRATES_DIR, a node is a top-level module (src/NAME.rs,
or a folder src/NAME/); the crate root (lib.rs, main.rs) is not one: its
items are the crate's shared vocabulary. There is an edge A -> B when a
file of A names `crate::B`, in code or in a doc link (`use crate::{B, ..}`
included), outside its `#[cfg(test)]` modules (unit tests may use any
module). The modules inside a folder module (src/F/NAME.rs, src/F/NAME/)
are checked the same way among themselves, F/mod.rs being their root: an
edge A -> B when a file of F/A names `super::B` or `crate::F::B`. Every
cycle is printed with one reference per edge, file:line.
"""
import os
import re
import sys


def strip_test_modules(text):
    """The text without `#[cfg(test)] mod NAME { ... }` blocks (braces
    balanced; braces in strings and comments are rare enough there)."""
    out, at = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < at:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[at:m.start()])
        # Keep the line count, so that line numbers stay right.
        out.append("\n" * text.count("\n", m.start(), i))
        at = i
    out.append(text[at:])
    return "".join(out)


def references(text, prefix=r"crate::"):
    """(module name, line) of every `crate::NAME` and `crate::{NAME, ..}`
    (`prefix` a regular expression for what comes before NAME)."""
    for m in re.finditer(r"(?<![\w:])(?:" + prefix + r")(\{[^}]*\}|\w+)", text):
        line = text.count("\n", 0, m.start()) + 1
        target = m.group(1)
        if target.startswith("{"):
            # Top-level names of a group: `crate::{a::X, b, c::{d, e}}`.
            depth, name = 0, ""
            for ch in target[1:-1] + ",":
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                elif ch == "," and depth == 0:
                    first = name.strip().split("::")[0].strip()
                    if first:
                        yield first, line
                    name = ""
                    continue
                if depth == 0 and ch not in "{}":
                    name += ch
                elif depth > 0:
                    pass
        else:
            yield target, line


def crate_modules(src, roots=("lib.rs", "main.rs")):
    """Module name -> its .rs files."""
    mods = {}
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry in roots:
            continue
        if entry.endswith(".rs"):
            mods.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            for d, _, files in os.walk(path):
                mods.setdefault(entry, []).extend(os.path.join(d, f) for f in sorted(files) if f.endswith(".rs"))
    return mods


def cycles(mods, prefix=lambda f: r"crate::"):
    """The strongly connected components of more than one module, each as
    (sorted names, {(a, b): 'file:line'} for its edges); `prefix(file)`:
    what names a sibling module in that file (a regular expression)."""
    edges, where = {m: set() for m in mods}, {}
    for m, files in mods.items():
        for f in files:
            text = strip_test_modules(open(f, encoding="utf-8", errors="replace").read())
            for target, line in references(text, prefix(f)):
                if target in mods and target != m:
                    edges[m].add(target)
                    where.setdefault((m, target), f"{f}:{line}")
    # Tarjan's algorithm, iteratively.
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for root in sorted(mods):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    members = set(comp)
                    inside = {(a, b): where[(a, b)] for a in comp for b in edges[a] if b in members}
                    comps.append((sorted(comp), inside))
    return comps


def folders(src, path=()):
    """(module path, folder) of every folder module under `src`, nested
    ones included: `(("cmd",), "src/cmd")`."""
    for entry in sorted(os.listdir(src)):
        d = os.path.join(src, entry)
        if os.path.isdir(d) and os.path.isfile(os.path.join(d, "mod.rs")):
            yield path + (entry,), d
            yield from folders(d, path + (entry,))


def sibling(path, d):
    """For the modules inside folder module `path` (at `d`): what names
    one of them from a file under `d` — `crate::F::` anywhere, and
    `super::` from a file directly in `d` (`super::super::` one folder
    down, and so on)."""
    absolute = "crate::" + "".join(p + "::" for p in path)

    def prefix(f):
        depth = os.path.relpath(os.path.dirname(f), d).count(os.sep) + (os.path.dirname(f) != d)
        if os.path.basename(f) == "mod.rs":
            depth -= 1
        return re.escape(absolute) + "|" + re.escape("super::" * (depth + 1))

    return prefix


def check(crates_dir):
    found = 0
    for crate in sorted(os.listdir(crates_dir)):
        src = os.path.join(crates_dir, crate, "src")
        if not os.path.isdir(src):
            continue
        scopes = [(crate, cycles(crate_modules(src)))]
        for path, d in folders(src):
            scopes.append((f"{crate} ({'::'.join(path)})", cycles(crate_modules(d, ("mod.rs",)), sibling(path, d))))
        for scope, comps in scopes:
            for names, inside in comps:
                found += 1
                print(f"{scope}: modules in a cycle: {', '.join(names)}")
                for (a, b), at in sorted(inside.items()):
                    print(f"  {a} -> {b}  ({at})")
    return found


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k", "src")
        os.makedirs(os.path.join(src, "c"))
        files = {
            "lib.rs": "mod a; mod b; mod c; pub use a::X;",
            "a.rs": "use crate::{b::Y, c};\n",
            "b.rs": "//! See [`crate::a`].\n",
            "c/mod.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        }
        for name, text in files.items():
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        comps = cycles(crate_modules(src))
        assert [c[0] for c in comps] == [["a", "b"]], comps
        assert comps[0][1][("b", "a")].endswith("b.rs:1"), comps
        # The test module's use of `a` makes no cycle through c.
        with open(os.path.join(src, "c", "mod.rs"), "a") as f:
            f.write("fn g() { crate::a::h() }\n")
        comps = cycles(crate_modules(src))
        assert [c[0] for c in comps] == [["a", "b", "c"]], comps
        # Inside a folder module: `super::` and `crate::c::` name siblings.
        for name, text in {"c/x.rs": "use super::y;\n", "c/y.rs": "fn f() { crate::c::x::g() }\n", "c/z.rs": "use super::super::a;\n"}.items():
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        inner = cycles(crate_modules(os.path.join(src, "c"), ("mod.rs",)), sibling(("c",), os.path.join(src, "c")))
        assert [c[0] for c in inner] == [["x", "y"]], inner
    print("modcycles: self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    crates_dir = sys.argv[1] if len(sys.argv) > 1 else "crates"
    n = check(crates_dir)
    if n:
        print(f"modcycles: {n} cycle(s) among the modules of a crate (see scripts/modcycles.py)")
        sys.exit(1)
    print("modcycles: no module cycles")
