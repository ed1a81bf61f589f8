"""Non-test Python of a checkout: lines, modules over 800 lines, public functions over 8 parameters
(positional, keyword-only and positional-only; self/cls not counted).

    python code_size.py CHECKOUT
"""

import ast
import subprocess
import sys

root = sys.argv[1]
listing = subprocess.run(["git", "-C", root, "ls-files", "*.py"], capture_output=True, text=True, check=True)
files = [f for f in listing.stdout.split() if not f.startswith("tests/")]
total = 0
big, wide = [], []
for f in files:
    with open(f"{root}/{f}", encoding="utf-8") as fh:
        src = fh.read()
    lines = len(src.splitlines())
    total += lines
    if lines > 800:
        big.append((f, lines))
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            if len(names) > 8:
                wide.append((f, node.name, len(names)))
print("files", len(files), "lines", total)
print("over 800:", big)
print("over 8 params:", wide)
