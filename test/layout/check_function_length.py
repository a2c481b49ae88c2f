#!/usr/bin/env python3
"""Apps read like a table of contents: no function in apps/ is longer than
80 lines (from its signature to its closing brace). Lists every longer one
and exits 1 if there is any.

  python3 test/layout/check_function_length.py [SOURCE_DIR] [MAX_LINES]
"""
import re
import sys

from layout_common import report, source_root, sources

SCOPE = re.compile(r"\b(namespace|struct|class|union|enum)\b")
FUNCTION_HEAD = re.compile(r"\)\s*(const|override|noexcept|final|mutable|->\s*[\w:<>,\s*&]+|\s)*$")


def blank_literals(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name line, first line, last line) of every function body at namespace or class scope."""
    code = blank_literals(text)
    stack, head_start, found = [], 0, []  # stack: (kind, start line)
    for i, c in enumerate(code):
        if c in ";":
            head_start = i + 1
        elif c == "{":
            head = code[head_start:i]
            enclosing = stack[-1][0] if stack else "scope"
            if SCOPE.search(head) and "(" not in head:
                kind = "scope"
            elif enclosing == "scope" and FUNCTION_HEAD.search(head.rstrip()) and "=" not in head.split("(")[0]:
                kind = "function"
            else:
                kind = "block"
            first = code.count("\n", 0, head_start + len(head) - len(head.lstrip())) + 1
            stack.append((kind, first, head.strip().split("\n")[0]))
            head_start = i + 1
        elif c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    found.append((name, first, code.count("\n", 0, i) + 1))
            head_start = i + 1
    return found


def main():
    root = source_root()
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    long_ones, count = [], 0
    for rel, path in sources(root, ("apps",), (".h", ".cpp")):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for name, first, last in functions(text):
            count += 1
            if last - first + 1 > limit:
                long_ones.append(f"{rel}:{first}: {last - first + 1} lines: {name}")
    return report(long_ones, count, f"{len(long_ones)} of {count} functions in apps/ longer than {limit} lines")


if __name__ == "__main__":
    sys.exit(main())
