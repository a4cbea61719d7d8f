#!/usr/bin/env python3
"""Renders the output of a notebook program (scripts/notebook-program.py) as Markdown: each cell's
HTML tables become Markdown tables, paragraphs become text, SVG charts are counted, not embedded.

    python3 scripts/gpu/render-cells.py PROGRAM_OUTPUT > OUTPUT.md
"""
import html
import re
import sys


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def main() -> int:
    raw = open(sys.argv[1]).read()
    for n, body in re.findall(r"=== cell (\d+)\n(.*?)(?==== cell |\Z)", raw, re.S):
        print(f"### Cell {n}\n")
        for mime, content in re.findall(r"EVCXR_BEGIN_CONTENT (\S+)\n(.*?)\nEVCXR_END_CONTENT", body, re.S):
            if "<svg" in content:
                caption = re.match(r"\s*<p>(.*?)</p>", content, re.S)
                if caption:
                    print(text(caption.group(1)) + "\n")
                print("(SVG chart, %d bytes)\n" % len(content))
                continue
            caption = re.search(r"<caption[^>]*>(.*?)</caption>", content, re.S)
            if caption:
                print(f"**{text(caption.group(1))}**\n")
            rows = re.findall(r"<tr>(.*?)</tr>", content, re.S)
            for i, r in enumerate(rows):
                cells = [text(c).replace("|", "\\|") for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
                print("| " + " | ".join(cells) + " |")
                if i == 0:
                    print("|" + " --- |" * len(cells))
            for p in re.findall(r"<p>(.*?)</p>", content, re.S):
                print("\n" + text(p))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
