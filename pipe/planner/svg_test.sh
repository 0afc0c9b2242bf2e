#!/bin/bash
# weft-plan --svg writes well-formed XML (python3's xml.dom.minidom parses it) whose root
# is <svg> and which has the parts a reader looks for, for several plans: a preset, a layer
# file with the greedy strategy and the 1F1B schedule, a deep pipeline with many
# micro-batches, and a model whose title needs escaping.
set -eu
plan="$1"
tmp="${TEST_TMPDIR:-/tmp}"
python=/usr/bin/python3

check() {
  local svg="$1" epochs="$2"
  "$python" - "$svg" "$epochs" <<'PY'
import sys
import xml.dom.minidom

path, epochs = sys.argv[1], int(sys.argv[2])
doc = xml.dom.minidom.parse(path)  # raises on anything that is not well-formed
root = doc.documentElement
assert root.tagName == "svg", root.tagName
assert root.getAttribute("xmlns") == "http://www.w3.org/2000/svg"
texts = ["".join(n.data for n in t.childNodes if n.nodeType == n.TEXT_NODE)
         for t in doc.getElementsByTagName("text")]
for e in range(epochs):
    assert "epoch %d" % e in texts, "no row label for epoch %d" % e
assert any("schedule" in t and "bubble" in t for t in texts), "no schedule timeline"
assert doc.getElementsByTagName("pattern"), "no hatch pattern for frozen units"
rects = doc.getElementsByTagName("rect")
assert len(rects) > 50, len(rects)
for r in rects:
    for a in ("x", "y", "width", "height"):
        v = r.getAttribute(a)
        if v and not v.endswith("%"):
            assert float(v) >= 0 or a in ("x", "y"), (a, v)
print("ok: %s, %d rects, %d texts" % (path, len(rects), len(texts)))
PY
}

"$plan" --model vit-b16 --machines 2 --devices 8 --epochs 10 --svg "$tmp/vit.svg" > /dev/null
check "$tmp/vit.svg" 10

"$plan" --layers pipe/planner/testdata/tiny.csv --devices 4 --epochs 5 --strategy greedy \
  --schedule 1f1b --svg "$tmp/tiny.svg" > /dev/null
check "$tmp/tiny.svg" 5

"$plan" --model gpt2-xl --machines 8 --devices 8 --k0 64 --micro-batches 256 --epochs 3 \
  --svg "$tmp/deep.svg" > /dev/null
check "$tmp/deep.svg" 3

# A title with characters XML must escape.
cp pipe/planner/testdata/tiny.json "$tmp/a&b<c>\"q'.json"
"$plan" --layers "$tmp/a&b<c>\"q'.json" --devices 2 --epochs 2 --svg "$tmp/escaped.svg" > /dev/null
check "$tmp/escaped.svg" 2
echo "PASS"
