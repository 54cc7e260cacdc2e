#!/usr/bin/env python3
"""Prints the shell block of a doc that follows the marker `<!-- tested: NAME -->`, so a
test runs the commands a page tells users to run, as written:

    bash -euo pipefail -c "$(scripts/doc-block.py docs/install.md verify)"

Fails when the marker is missing, appears twice, or is not followed by a ```sh block.
"""

import re
import sys

path, name = sys.argv[1], sys.argv[2]
text = open(path).read()
found = re.findall(rf"<!-- tested: {re.escape(name)} -->\n```sh\n(.*?)```", text, re.S)
markers = text.count(f"<!-- tested: {name} -->")
if markers != 1 or len(found) != 1:
    sys.exit(f"{path}: want one '<!-- tested: {name} -->' followed by a ```sh block, found {markers} marker(s), {len(found)} block(s)")
print(found[0], end="")
