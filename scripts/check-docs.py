#!/usr/bin/env python3
"""Checks the Markdown files the repository tracks: every relative link
points at a file that exists, every `#anchor` at a heading of its target
(GitHub's anchor rules), and ARCHITECTURE.md stays a map (at most 400
lines). Exits 1 naming each broken link. Run from anywhere: `make lint`
runs it."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MAP_LINES = 400


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        out = set()
        in_code = False
        for line in open(path, encoding='utf-8'):
            if line.startswith('```'):
                in_code = not in_code
                continue
            m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
            if in_code or not m:
                continue
            a = m.group(2).strip().lower()
            a = re.sub(r'[^\w\- ]', '', a)  # GitHub keeps letters, digits, _, -, spaces
            a = a.replace(' ', '-')
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f'{a}-{n}')
        cache[path] = out
    return cache[path]


def links(text):
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    text = re.sub(r'`[^`\n]*`', '', text)
    for m in re.finditer(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', text):
        yield m.group(1)


def main():
    files = subprocess.run(['git', 'ls-files', '*.md'], cwd=ROOT, capture_output=True, text=True, check=True)
    errors = []
    for rel in files.stdout.split():
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            continue
        for target in links(open(path, encoding='utf-8').read()):
            if re.match(r'^[a-z]+:', target):
                continue  # a URL or mailto:
            file_part, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                errors.append(f'{rel}: link to {target}: no such file')
                continue
            if anchor and dest.endswith('.md') and anchor not in anchors(dest):
                errors.append(f'{rel}: link to {target}: no heading with that anchor in {os.path.relpath(dest, ROOT)}')
    n = sum(1 for _ in open(os.path.join(ROOT, 'ARCHITECTURE.md'), encoding='utf-8'))
    if n > MAX_MAP_LINES:
        errors.append(f'ARCHITECTURE.md: {n} lines; the map stays within {MAX_MAP_LINES} (details go to docs/)')
    for e in errors:
        print(f'check-docs: {e}', file=sys.stderr)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
