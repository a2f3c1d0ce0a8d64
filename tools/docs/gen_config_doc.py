"""Rewrites the options table of docs/configuration.md from config/config.cc
(ConfigTest.EveryOptionIsDocumented checks that they agree).
usage: python3 tools/docs/gen_config_doc.py"""
import os
import re

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
src = open(os.path.join(root, "config/config.cc")).read()
start = src.index("constexpr OptionInfo kOptions[] = {")
block = src[start:src.index("\n};\n", start)]
rows = []
for entry in re.findall(r'\{("VMMSHIM_[A-Z_]+".*?)&Apply', block, re.S):
    literals = re.findall(r'((?:"(?:[^"\\]|\\.)*"\s*)+),?', entry)
    name, kind, default, accepted, meaning = [
        # C string literals, their escapes undone (\" and \\).
        re.sub(r'\\(.)', r'\1', "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', lit)))
        for lit in literals]
    rows.append(f"| `{name}` | {kind} | `{default}` | {accepted} | {meaning} |")
path = os.path.join(root, "docs/configuration.md")
doc = open(path).read()
start = doc.index("| variable |")
end = doc.index("\n\nExample:")
doc = (doc[:start] + "| variable | type | default | accepted | meaning |\n|---|---|---|---|---|\n"
       + "\n".join(rows) + doc[end:])
open(path, "w").write(doc)
print(f"{len(rows)} options written to docs/configuration.md")
