"""Shared by the layout checks: Rust source with comments and literals blanked out."""

import re


def blank(text):
    """The text with comments, string and char literals replaced by spaces (newlines kept),
    so that braces and paths can be counted on what remains."""
    out, i, n = [], 0, len(text)

    def keep_newlines(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_newlines(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_newlines(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + keep_newlines(text[i + 2 : j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + keep_newlines(text[i + 1 : j - 1] if j > i + 1 else ""))
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'").match(text, i)):
            out.append("' '" + " " * (m.end() - i - 3))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)
